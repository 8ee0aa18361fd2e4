//! `ferrite bench embed`: the engine's embeddings throughput (an encoder's, or a decoder's
//! last-token pooling) at several batch sizes: `--batch-sizes` texts of `--tokens` tokens
//! each, submitted together, until every embedding is back. What `/v1/embeddings` adds on
//! top (tokenizing, routing) is the gateway bench's to measure.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use ferrite_engine::engine::EmbedParams;
use ferrite_engine::sampler::SamplingParams;
use serde_json::json;

use crate::loading::ModelArgs;
use crate::table::Table;

#[derive(Debug, Args)]
pub struct EmbedArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Comma-separated batch sizes: texts submitted together.
    #[arg(long, default_value = "1,8,32", value_delimiter = ',')]
    batch_sizes: Vec<usize>,
    /// Tokens of each text, its special tokens included.
    #[arg(long, default_value_t = 128)]
    tokens: usize,
    /// Timed runs per batch size (after one untimed); the median is shown.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    #[arg(long)]
    json: bool,
}

/// Text `i` of a batch: `tokens` ids spread over the vocabulary (the same for any run, and
/// for `tests/fixtures/models/bench_encoder.py`'s peer measurement).
pub fn text_ids(i: usize, tokens: usize, vocab: usize) -> Vec<u32> {
    (0..tokens)
        .map(|j| ((7919 * (i * tokens + j + 1)) % vocab) as u32)
        .collect()
}

pub fn run(args: EmbedArgs) -> Result<()> {
    if args.batch_sizes.is_empty() || args.runs == 0 || args.tokens == 0 {
        bail!("--batch-sizes, --runs and --tokens must not be empty or 0");
    }
    let (mut engine, _) = crate::loading::engine(&args.model)?;
    let vocab = engine.config().vocab_size;
    let mut table = Table::new(&[
        "model",
        "tokens/text",
        "batch",
        "ms/batch",
        "texts/s",
        "tokens/s",
    ]);
    let mut rows = Vec::new();
    let params = SamplingParams::embed(EmbedParams {
        normalize: true,
        dimensions: None,
        classify: false,
    });
    let mut next_id = 0u64;
    for &batch in &args.batch_sizes {
        let mut seconds = Vec::with_capacity(args.runs);
        for run in 0..=args.runs {
            let requests = (0..batch)
                .map(|i| {
                    next_id += 1;
                    (next_id, text_ids(i, args.tokens, vocab), params.clone())
                })
                .collect();
            let start = Instant::now();
            let out = engine.run_to_completion(requests, |_| true)?;
            if out.len() != batch {
                bail!("{} of {batch} embeddings came back", out.len());
            }
            if run > 0 {
                seconds.push(start.elapsed().as_secs_f64());
            }
        }
        seconds.sort_by(f64::total_cmp);
        let median = seconds[seconds.len() / 2];
        let texts = batch as f64 / median;
        table.row(vec![
            args.model.model.clone(),
            args.tokens.to_string(),
            batch.to_string(),
            format!("{:.1}", median * 1e3),
            format!("{texts:.1}"),
            format!("{:.0}", texts * args.tokens as f64),
        ]);
        rows.push(
            json!({"model": args.model.model, "tokens": args.tokens, "batch": batch,
            "runs": args.runs, "median_seconds": median, "texts_per_s": texts}),
        );
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print!("{}", table.render());
    }
    Ok(())
}
