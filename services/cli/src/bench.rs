//! `ferrite bench …`: measurements printed as tables in the seed files' grid format.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ferrite_engine::sampler::SamplingParams;
use serde_json::json;

use crate::loading::ModelArgs;
use crate::table::{Table, mean_std};

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Prefill and decode throughput of the engine at several batch sizes.
    Decode(DecodeArgs),
    /// What the gateway adds: a synthetic worker called directly vs through the gateway.
    Gateway(crate::bench_gateway::GatewayBenchArgs),
    /// Start-up phase times of fresh `ferrite serve` processes, from their exported spans.
    Startup(crate::bench_startup::StartupBenchArgs),
    /// Embeddings throughput of the engine at several batch sizes (an encoder's, or a
    /// decoder's last-token pooling).
    Embed(crate::bench_embed::EmbedArgs),
    /// Perplexity on a text with the original weights and with each --quantize format.
    Perplexity(crate::bench_perplexity::PerplexityArgs),
    /// Quantized linear layers vs f16 per model shape, in the columns of seed 004.
    Kernels(crate::bench_kernels::KernelsArgs),
    /// Forward-pass time of the seed 002 model sizes (dummy weights), batch 4.
    Forward(crate::bench_forward::ForwardArgs),
    /// Latency of a batch submitted together, in the configurations and layout of seed 003.
    Latency(crate::bench_latency::LatencyArgs),
    /// A `ferrite serve` under concurrent streams with cancellations, deadlines and bad
    /// requests: outcomes by class, RSS, file descriptors and KV blocks left in use.
    Soak(crate::bench_soak::SoakArgs),
    /// All-reduce time and bandwidth per message size across --tp rank processes, in
    /// nccl-tests' columns.
    Collective(crate::bench_collective::CollectiveArgs),
    /// Prefix caching and KV-aware routing: shared long prefixes through gateways to pools,
    /// hit rate, TTFT and throughput with --routing p2c, --routing kv and caching off.
    Prefix(crate::bench_prefix::PrefixBenchArgs),
    /// What constrained decoding costs: tok/s of concurrent streams under a JSON schema
    /// against unconstrained, mask time per token, schema compile times.
    Structured(crate::bench_structured::StructuredArgs),
    /// What speculative decoding by n-gram lookup gives: tok/s with each number of draft
    /// tokens on prompts whose answers copy their context and on open ones, drafts accepted.
    Speculative(crate::bench_speculative::SpeculativeArgs),
    /// The fault run: etcd, a gateway and pools under load, then etcd loss, gateway loss, a
    /// drain, a stopped worker, a NaN model, an engine panic, a KV burst, mass disconnects and
    /// a rank lost from a tensor-parallel pool; per fault: outcomes, recovery, what is left.
    Chaos(crate::chaos::ChaosArgs),
    /// One rank of `bench collective` (it starts them; by hand for ranks on other hosts).
    #[command(hide = true)]
    CollectiveRank(crate::bench_collective::RankArgs),
}

#[derive(Debug, Args)]
pub struct DecodeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated batch sizes.
    #[arg(long, default_value = "1,8", value_delimiter = ',')]
    batch_sizes: Vec<usize>,
    #[arg(long, default_value_t = 128)]
    prompt_tokens: usize,
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Measured runs per batch size (after one warm-up run).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Ranks of a tensor-parallel pool: this process is rank 0 and starts ranks 1..N as
    /// processes of their own (the cores shared among them), as `serve --tp N` does.
    #[arg(long, default_value_t = 1)]
    tp: u32,
    /// Every request's frequency penalty (greedy draws all the same: what a step costs when
    /// its draws count the tokens so far).
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Every request asks for the logprobs of its tokens and of this many most likely ones.
    #[arg(long)]
    logprobs: Option<usize>,
    /// Every request scores its prompt too (each token's logprob and this many most likely
    /// tokens, as `echo` with `logprobs` asks): the prefill column then counts scored tokens.
    #[arg(long)]
    prompt_logprobs: Option<usize>,
    /// The requests run with these LoRA adapters of --lora-modules, in turn (`base`: none),
    /// so a batch mixes them: `--lora a,b,base`. Unset: the base model.
    #[arg(long, value_delimiter = ',')]
    lora: Vec<String>,
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: BenchCommand) -> Result<()> {
    match cmd {
        BenchCommand::Decode(args) => decode(args),
        BenchCommand::Gateway(args) => crate::bench_gateway::run(args),
        BenchCommand::Startup(args) => crate::bench_startup::run(args),
        BenchCommand::Embed(args) => crate::bench_embed::run(args),
        BenchCommand::Perplexity(args) => crate::bench_perplexity::run(args),
        BenchCommand::Kernels(args) => crate::bench_kernels::run(args),
        BenchCommand::Forward(args) => crate::bench_forward::run(args),
        BenchCommand::Latency(args) => crate::bench_latency::run(args),
        BenchCommand::Soak(args) => crate::bench_soak::run(args),
        BenchCommand::Collective(args) => crate::bench_collective::run(args),
        BenchCommand::Prefix(args) => crate::bench_prefix::run(args),
        BenchCommand::Chaos(args) => crate::chaos::run(args),
        BenchCommand::Structured(args) => crate::bench_structured::run(args),
        BenchCommand::Speculative(args) => crate::bench_speculative::run(args),
        BenchCommand::CollectiveRank(args) => crate::bench_collective::rank(args),
    }
}

struct RunFigures {
    prefill_tok_s: f64,
    decode_tok_s: f64,
}

fn decode(args: DecodeArgs) -> Result<()> {
    if args.runs == 0 || args.new_tokens < 2 || args.prompt_tokens == 0 {
        bail!("--runs ≥ 1, --new-tokens ≥ 2 and --prompt-tokens ≥ 1 are needed");
    }
    let params = SamplingParams {
        ignore_eos: true,
        frequency_penalty: args.frequency_penalty,
        logprobs: args.logprobs,
        prompt_logprobs: args.prompt_logprobs,
        ..SamplingParams::greedy(args.new_tokens)
    };
    params.validate()?;
    let (mut engine, _ranks, _) = crate::serve_ranks::pool_engine(&args.model, args.tp)?;
    let lora = (args.lora.iter())
        .map(|n| (n != "base").then(|| engine.lora_number(n)).transpose())
        .collect::<Result<Vec<Option<u32>>, _>>()
        .context("--lora")?;
    let lora_column = if args.lora.is_empty() {
        "base".to_owned()
    } else {
        args.lora.join(",")
    };
    let vocab = engine.config().vocab_size as u64;
    let threads = rayon::current_num_threads();
    let mut table = Table::new(&[
        "model",
        "tp",
        "lora",
        "threads",
        "batch",
        "prompt",
        "new",
        "runs",
        "prefill tok/s",
        "decode tok/s (all seqs)",
        "decode tok/s per seq",
    ]);
    let mut rows_json = Vec::new();
    let mut next_id = 0u64;
    for &batch in &args.batch_sizes {
        let mut figures = Vec::new();
        for run in 0..=args.runs {
            // Distinct pseudo-random prompts: the work per token does not depend on the ids.
            let requests: Vec<_> = (0..batch)
                .map(|_| {
                    next_id += 1;
                    let prompt = (0..args.prompt_tokens as u64)
                        .map(|i| ((next_id * 7919 + i * 104_729) % vocab) as u32)
                        .collect();
                    let lora = lora
                        .get(next_id as usize % lora.len().max(1))
                        .copied()
                        .flatten();
                    (
                        next_id,
                        prompt,
                        SamplingParams {
                            lora,
                            ..params.clone()
                        },
                    )
                })
                .collect();
            let start = Instant::now();
            let mut prefill_done = None;
            let mut first_tokens = std::collections::HashSet::new();
            engine.run_to_completion(requests, |ev| {
                first_tokens.insert(ev.id);
                if first_tokens.len() == batch && prefill_done.is_none() {
                    prefill_done = Some(start.elapsed());
                }
                true
            })?;
            let total = start.elapsed().as_secs_f64();
            let prefill = prefill_done.map_or(total, |d| d.as_secs_f64());
            if run > 0 {
                figures.push(RunFigures {
                    prefill_tok_s: (batch * args.prompt_tokens) as f64 / prefill,
                    decode_tok_s: (batch * (args.new_tokens - 1)) as f64 / (total - prefill),
                });
            }
        }
        let (pf, pf_sd) = mean_std(figures.iter().map(|f| f.prefill_tok_s));
        let (dc, dc_sd) = mean_std(figures.iter().map(|f| f.decode_tok_s));
        table.row(vec![
            args.model.model.clone(),
            args.tp.to_string(),
            lora_column.clone(),
            threads.to_string(),
            batch.to_string(),
            args.prompt_tokens.to_string(),
            args.new_tokens.to_string(),
            args.runs.to_string(),
            format!("{pf:.1} ± {pf_sd:.1}"),
            format!("{dc:.1} ± {dc_sd:.1}"),
            format!("{:.1}", dc / batch as f64),
        ]);
        rows_json.push(json!({
            "model": args.model.model, "tp": args.tp, "lora": lora_column, "threads": threads,
            "batch": batch,
            "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "runs": args.runs,
            "prefill_tok_s": { "mean": pf, "std": pf_sd },
            "decode_tok_s": { "mean": dc, "std": dc_sd },
        }));
    }
    if args.json {
        println!("{}", serde_json::Value::Array(rows_json));
    } else {
        print!("{}", table.render());
    }
    Ok(())
}
