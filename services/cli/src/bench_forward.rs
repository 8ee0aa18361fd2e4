//! `ferrite bench forward`: forward-pass time of the Transformer LMs of seed 002 (dummy
//! weights of each size), batch 4, per context length and number of warm-up passes, in the
//! seed's Markdown table. Forward only: ferrite serves, it does not train.
//!
//! On the CPU the pass computes the logits at every position, as a training-style forward
//! does. On a GPU (`--device cuda`) it is the engine's prefill step over random weights made
//! on the device: the whole prompt through every layer (eagerly, as prefill runs), with the LM
//! head on each sequence's last position, as serving computes it — the LM head over all
//! positions would add one GEMM of `tokens × d_model × vocab`, a few percent of the pass.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_engine::config::ModelConfig;
use ferrite_engine::gpu::{self, GpuOptions, StepLimits};
use ferrite_engine::model::{self, BatchForward, LoadOptions, LogitsWanted, SeqChunk, presets};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::device::{self, Device, DeviceRequest};
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
    /// cpu, or cuda[:N] (f16, random weights made on the device).
    #[arg(long, default_value = "cpu")]
    device: DeviceRequest,
    #[arg(long)]
    json: bool,
}

/// A model to time: dummy weights in host memory, or a GPU runner over random weights made
/// on the device.
enum Model {
    Cpu(Box<model::LlamaModel>),
    Cuda(Box<gpu::GpuRunner>),
}

const BLOCK: usize = 16;

/// One timed pass over a batch of prompts.
type PassFn<'a> = dyn FnMut(&[&[u32]]) -> Result<()> + 'a;

/// The preset `size` on `device`, with room for `batch` sequences of up to `max_ctx` tokens.
fn load(size: &str, device: &Device, batch: usize, max_ctx: usize) -> Result<(Model, ModelConfig)> {
    match device {
        Device::Cpu => {
            let loaded = model::load_dummy(size, 0, LoadOptions::default())?;
            let c = loaded.model.config().clone();
            Ok((Model::Cpu(Box::new(loaded.model)), c))
        }
        Device::Cuda(d) => {
            let gpu = crate::loading::open_gpu(d.ordinal)?;
            let cfg = presets::preset(size)?.config()?;
            let limits = StepLimits {
                max_tokens: batch * max_ctx,
                max_seqs: batch,
                max_model_len: max_ctx,
                block_size: BLOCK,
            };
            let opts = GpuOptions {
                memory_utilization: 1.0,
                cuda_graphs: false,
                ..GpuOptions::new(Dtype::F16)
            };
            let blocks = batch * max_ctx.div_ceil(BLOCK);
            let runner = gpu::dummy_runner(gpu, &cfg, opts, None, limits, blocks)
                .with_context(|| format!("{size} on {d}"))?;
            Ok((Model::Cuda(Box::new(runner)), cfg))
        }
    }
}

/// One prefill step of `seqs` on the GPU, each sequence in its own KV blocks (returns once the
/// last positions' logits are on the host).
fn gpu_prefill(runner: &mut gpu::GpuRunner, seqs: &[&[u32]], max_ctx: usize) -> Result<()> {
    let per_seq = max_ctx.div_ceil(BLOCK) as u32;
    let tables: Vec<Vec<u32>> = (0..seqs.len() as u32)
        .map(|s| (s * per_seq..(s + 1) * per_seq).collect())
        .collect();
    let chunks: Vec<SeqChunk<'_>> = seqs
        .iter()
        .zip(&tables)
        .map(|(tokens, table)| SeqChunk {
            tokens,
            start_pos: 0,
            block_table: table,
            logits: LogitsWanted::Last,
            prompt: true,
            lora: None,
        })
        .collect();
    runner.forward(&chunks, &mut ferrite_collective::Solo)?;
    Ok(())
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
    let (device, _) = device::select(args.device)?;
    let max_ctx = args.contexts.iter().copied().max().unwrap_or(1);
    let mut rows = Vec::new();
    for size in &args.sizes {
        let (mut model, c) = load(size, &device, args.batch_size, max_ctx)?;
        for &ctx in &args.contexts {
            let mut pass: Box<PassFn<'_>> = match &mut model {
                Model::Cpu(m) => {
                    let mut f = BatchForward::new(m, args.batch_size, ctx)?;
                    Box::new(move |seqs| Ok(f.run(seqs, LogitsWanted::All).map(drop)?))
                }
                Model::Cuda(runner) => Box::new(|seqs| gpu_prefill(runner, seqs, max_ctx)),
            };
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
                    pass(&seqs)?;
                }
                let times: Vec<f64> = (0..args.trials)
                    .map(|_| {
                        let t = Instant::now();
                        pass(&seqs)?;
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
