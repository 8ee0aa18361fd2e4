//! `ferrite bench speculative`: what speculative decoding by n-gram lookup gives. Chat
//! prompts whose answers copy their context (`copy`: repeat, rename, fix typos, reformat)
//! and prompts whose answers do not (`open`), greedy, run on the engine in this process with
//! each number of draft tokens: output tokens per second (over the requests' whole time,
//! prefill included), the speed-up over decoding one
//! token at a time, the share of drafts accepted, and how many outputs are the same as
//! without drafts (they should all be).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_engine::engine::{Engine, Speculation};
use ferrite_engine::sampler::SamplingParams;
use ferrite_text::ChatMessage;
use serde::Deserialize;
use serde_json::json;

use crate::loading::ModelArgs;
use crate::table::{Table, mean_std};

#[derive(Debug, Args)]
pub struct SpeculativeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Chat prompts: a JSON list of `{"kind", "prompt"}`; each kind is a row group.
    #[arg(long, default_value = "tests/fixtures/speculative/prompts.json")]
    prompts: PathBuf,
    /// Draft tokens per step to compare (0: no speculation, the baseline).
    #[arg(long, default_value = "0,2,4,8", value_delimiter = ',')]
    draft_tokens: Vec<usize>,
    /// Requests at once: the prompts of a kind run in batches of this many.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    batch_sizes: Vec<usize>,
    /// New tokens per request at most (greedy, stopping at the end of the answer).
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Measured runs of each row, after one warm-up run.
    #[arg(long, default_value_t = 2)]
    runs: usize,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Deserialize)]
struct Prompt {
    kind: String,
    prompt: String,
}

/// One row's figures: the runs' output tokens per second, a run's drafts and the accepted
/// ones, and every request's tokens (the same in every run: greedy).
struct Row {
    tok_s: Vec<f64>,
    tokens: usize,
    drafts: u64,
    accepted: u64,
    outputs: Vec<Vec<u32>>,
}

pub fn run(args: SpeculativeArgs) -> Result<()> {
    if args.runs == 0 || args.draft_tokens.is_empty() || args.batch_sizes.contains(&0) {
        bail!("--runs ≥ 1, some --draft-tokens and --batch-sizes ≥ 1 are needed");
    }
    let text = std::fs::read_to_string(&args.prompts)
        .with_context(|| format!("reading {}", args.prompts.display()))?;
    let prompts: Vec<Prompt> = serde_json::from_str(&text)
        .with_context(|| format!("{}: a list of {{kind, prompt}}", args.prompts.display()))?;
    let (mut engine, tokenizer) = crate::loading::engine(&args.model)?;
    let template = tokenizer
        .chat_template()
        .context("this model has no chat template")?;
    let mut kinds: BTreeMap<&str, Vec<Vec<u32>>> = BTreeMap::new();
    for p in &prompts {
        let rendered = template.render(&[ChatMessage::new("user", &p.prompt)], true)?;
        let ids = tokenizer.encode(&rendered, false)?;
        kinds.entry(&p.kind).or_default().push(ids);
    }
    let mut table = Table::new(&[
        "model",
        "kind",
        "prompts",
        "batch",
        "draft tokens",
        "output tokens",
        "tok/s",
        "speed-up",
        "accepted",
        "same output",
    ]);
    let mut rows_json = Vec::new();
    for (kind, ids) in &kinds {
        for &batch in &args.batch_sizes {
            let mut base: Option<(f64, Vec<Vec<u32>>)> = None;
            for &k in &args.draft_tokens {
                let spec = (k > 0).then_some(Speculation {
                    tokens: k,
                    lookup_max: args.model.prompt_lookup_max,
                    lookup_min: args.model.prompt_lookup_min,
                });
                if let Some(s) = spec {
                    s.check().map_err(anyhow::Error::msg)?;
                }
                if !engine.set_speculation(spec) && spec.is_some() {
                    bail!("no speculative decoding under async scheduling: --async-scheduling off");
                }
                let row = measure(&mut engine, ids, batch, args.max_tokens, args.runs)?;
                let (mean, sd) = mean_std(row.tok_s.iter().copied());
                let (base_tok_s, base_out) =
                    base.get_or_insert_with(|| (mean, row.outputs.clone()));
                let same = (row.outputs.iter().zip(base_out.iter()))
                    .filter(|(a, b)| a == b)
                    .count();
                let accepted = row.accepted as f64 / row.drafts.max(1) as f64;
                table.row(vec![
                    args.model.model.clone(),
                    (*kind).to_owned(),
                    ids.len().to_string(),
                    batch.to_string(),
                    k.to_string(),
                    row.tokens.to_string(),
                    format!("{mean:.1} ± {sd:.1}"),
                    format!("{:.2}×", mean / *base_tok_s),
                    match k {
                        0 => "-".to_owned(),
                        _ => format!("{:.0}% of {}", accepted * 100.0, row.drafts),
                    },
                    format!("{same}/{}", ids.len()),
                ]);
                rows_json.push(json!({
                    "model": args.model.model, "kind": kind, "prompts": ids.len(),
                    "batch": batch, "draft_tokens": k, "output_tokens": row.tokens,
                    "tok_s": {"mean": mean, "std": sd}, "speedup": mean / *base_tok_s,
                    "drafts": row.drafts, "accepted": row.accepted, "same_output": same,
                }));
            }
        }
    }
    engine.set_speculation(None);
    match args.json {
        true => println!("{}", serde_json::Value::Array(rows_json)),
        false => print!("{}", table.render()),
    }
    Ok(())
}

/// Runs `prompts` greedily in batches of `batch`, once to warm up and `runs` times measured.
fn measure(
    engine: &mut Engine,
    prompts: &[Vec<u32>],
    batch: usize,
    max_tokens: usize,
    runs: usize,
) -> Result<Row> {
    let params = SamplingParams::greedy(max_tokens);
    let mut row = Row {
        tok_s: Vec::new(),
        tokens: 0,
        drafts: 0,
        accepted: 0,
        outputs: Vec::new(),
    };
    for run in 0..=runs {
        let before = engine.stats();
        let started = Instant::now();
        let mut outputs = Vec::new();
        for group in prompts.chunks(batch) {
            let requests = (group.iter().enumerate())
                .map(|(i, p)| (i as u64 + 1, p.clone(), params.clone()))
                .collect();
            let mut done = engine.run_to_completion(requests, |_| true)?;
            outputs.extend(
                (1..=group.len() as u64)
                    .map(|i| done.remove(&i).map_or_else(Vec::new, |g| g.token_ids())),
            );
        }
        let took = started.elapsed().as_secs_f64();
        let after = engine.stats();
        if run == 0 {
            continue;
        }
        row.tokens = outputs.iter().map(Vec::len).sum();
        row.tok_s.push(row.tokens as f64 / took);
        // Greedy: every run makes the same drafts.
        row.drafts = after.spec_draft_tokens - before.spec_draft_tokens;
        row.accepted = after.spec_accepted_tokens - before.spec_accepted_tokens;
        row.outputs = outputs;
    }
    Ok(row)
}
