//! `ferrite bench forward`: forward-pass time of the Transformer LMs of seed 002 (dummy
//! weights of each size), batch 4, per context length and number of warm-up passes, in the
//! seed's Markdown table. Forward only (logits at every position, as a training-style forward
//! computes them): ferrite serves, it does not train.

use std::time::Instant;

use anyhow::{Result, bail};
use clap::Args;
use ferrite_engine::eval::BatchForward;
use ferrite_engine::model::{self, LoadOptions, LogitsWanted};
use serde_json::json;

#[derive(Debug, Args)]
pub struct ForwardArgs {
    /// Presets (`ferrite model list`); the seed's are small, medium, large, xl, 2.7b.
    #[arg(
        long,
        default_value = "small,medium,large,xl,2.7b",
        value_delimiter = ','
    )]
    sizes: Vec<String>,
    #[arg(long, default_value = "128,256", value_delimiter = ',')]
    contexts: Vec<usize>,
    #[arg(long, default_value_t = 4)]
    batch_size: usize,
    /// Untimed passes before the timed ones, one table row each.
    #[arg(long, default_value = "0,1,5", value_delimiter = ',')]
    warmups: Vec<usize>,
    #[arg(long, default_value_t = 10)]
    trials: usize,
    #[arg(long)]
    json: bool,
}

pub fn run(args: ForwardArgs) -> Result<()> {
    if args.trials == 0 || args.batch_size == 0 {
        bail!("--trials and --batch-size must be at least 1");
    }
    let header = [
        "model_size",
        "d_model",
        "context_length",
        "num_layers",
        "num_heads",
        "batch_size",
        "num_warmups",
        "num_trials",
        "forward_only",
        "mean_time_ms",
        "std_time_ms",
    ];
    let mut rows = Vec::new();
    for size in &args.sizes {
        let loaded = model::load_dummy(size, 0, LoadOptions::default())?;
        let c = loaded.model.config().clone();
        for &ctx in &args.contexts {
            let mut runner = BatchForward::new(&loaded.model, args.batch_size, ctx)?;
            let prompts: Vec<Vec<u32>> = (0..args.batch_size)
                .map(|b| {
                    (0..ctx)
                        .map(|t| ((b * 7919 + t * 104_729) % c.vocab_size) as u32)
                        .collect()
                })
                .collect();
            let seqs: Vec<&[u32]> = prompts.iter().map(Vec::as_slice).collect();
            for &warmups in &args.warmups {
                for _ in 0..warmups {
                    runner.run(&seqs, LogitsWanted::All)?;
                }
                let times: Vec<f64> = (0..args.trials)
                    .map(|_| {
                        let t = Instant::now();
                        runner.run(&seqs, LogitsWanted::All)?;
                        Ok(t.elapsed().as_secs_f64() * 1e3)
                    })
                    .collect::<Result<_>>()?;
                let mean = times.iter().sum::<f64>() / times.len() as f64;
                // Sample standard deviation, as pandas/numpy's ddof=1 in the seed.
                let var = times.iter().map(|t| (t - mean).powi(2)).sum::<f64>()
                    / (times.len().max(2) - 1) as f64;
                rows.push(json!({
                    "model_size": size, "d_model": c.hidden_size, "context_length": ctx,
                    "num_layers": c.num_layers, "num_heads": c.num_heads,
                    "batch_size": args.batch_size, "num_warmups": warmups,
                    "num_trials": args.trials, "forward_only": true,
                    "mean_time_ms": mean, "std_time_ms": var.sqrt(),
                }));
            }
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&rows)?);
        return Ok(());
    }
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            header
                .iter()
                .map(|h| match &r[*h] {
                    serde_json::Value::String(s) => s.clone(),
                    serde_json::Value::Bool(b) => if *b { "True" } else { "False" }.to_owned(),
                    v if v.is_f64() => format!("{:.2}", v.as_f64().unwrap_or(f64::NAN)),
                    v => v.to_string(),
                })
                .collect()
        })
        .collect();
    print!("{}", crate::table::markdown(&header, &cells));
    Ok(())
}
