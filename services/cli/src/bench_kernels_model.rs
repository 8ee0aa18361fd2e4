//! `ferrite bench kernels --mode model`: whole-model latency on cuda:0, the seed 004 rows —
//! decode steps replayed from CUDA graphs at each batch size with `context` tokens already in
//! the KV cache, and prefill of a prompt — per model shape and weight format, on random
//! weights made on the device (so Llama-3-70B needs no host copy).
//!
//! A decode step is what serving runs: the metadata copy, the graph replay and reading the
//! logits back. Latencies are medians over `runs` steps after a warm-up.

use std::time::Instant;

use anyhow::{Context, Result};
use ferrite_engine::gpu::{self, GpuOptions, StepLimits};
use ferrite_engine::model::{LoadQuantize, LogitsWanted, SeqChunk, presets};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::wq::WqFormat;

use crate::bench_kernels_row::{Row, b_dtype_of, backend_of};

const BLOCK: usize = 16;

/// The rows for `models` × `formats` × `stages` (`(stage, batch or prompt tokens, tokens)`),
/// and the device's name.
pub(crate) fn rows(
    models: &[String],
    formats: &[Option<WqFormat>],
    stages: &[(&'static str, usize, usize)],
    runs: usize,
) -> Result<(String, Vec<Row>)> {
    let gpu = crate::loading::open_gpu(0).context("--mode model runs on cuda:0")?;
    let device = gpu.device.name.replace(' ', "-");
    let max_bs = stages
        .iter()
        .filter(|s| s.0 == "decode")
        .map(|s| s.1)
        .max()
        .unwrap_or(1);
    let context = stages.iter().map(|s| s.2).max().unwrap_or(1);
    let limits = StepLimits {
        max_tokens: stages.iter().map(|s| s.1).max().unwrap_or(1).max(max_bs),
        max_seqs: max_bs,
        max_model_len: context + 1,
        block_size: BLOCK,
    };
    let blocks_per_seq = (context + 1).div_ceil(BLOCK);
    let mut rows = Vec::new();
    for name in models {
        let cfg = presets::preset(name)?.config()?;
        let model = presets::preset(name)?.model.to_owned();
        for format in formats {
            let opts = GpuOptions {
                memory_utilization: 1.0,
                cuda_graphs: true,
                ..GpuOptions::new(Dtype::F16)
            };
            let runner = gpu::dummy_runner(
                gpu.clone(),
                &cfg,
                opts,
                format.map(LoadQuantize::Weights),
                limits,
                max_bs * blocks_per_seq,
            );
            let mut runner = match runner {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("skipped {model} {}: {e}", b_dtype_of(format));
                    continue;
                }
            };
            for &(stage, n, tokens) in stages {
                let (bs, prompt) = if stage == "prefill" { (1, n) } else { (n, 1) };
                let ids = vec![1u32; prompt];
                let tables: Vec<Vec<u32>> = (0..bs)
                    .map(|s| {
                        ((s * blocks_per_seq) as u32..((s + 1) * blocks_per_seq) as u32).collect()
                    })
                    .collect();
                let start_pos = if stage == "prefill" { 0 } else { tokens };
                let seqs: Vec<SeqChunk<'_>> = tables
                    .iter()
                    .map(|t| SeqChunk {
                        tokens: &ids,
                        start_pos,
                        block_table: t,
                        logits: LogitsWanted::Last,
                        prompt: stage == "prefill",
                        lora: None,
                    })
                    .collect();
                runner.forward(&seqs, &mut ferrite_collective::Solo)?;
                let mut times: Vec<f64> = (0..runs)
                    .map(|_| {
                        let t = Instant::now();
                        runner
                            .forward(&seqs, &mut ferrite_collective::Solo)
                            .map(|_| t.elapsed().as_secs_f64())
                    })
                    .collect::<Result<_, _>>()?;
                times.sort_by(f64::total_cmp);
                let secs = times[times.len() / 2];
                rows.push(Row {
                    stage,
                    mode: "cgraph",
                    a_dtype: "float16",
                    model: model.clone(),
                    backend: backend_of(format),
                    b_dtype: b_dtype_of(format),
                    bs,
                    tokens,
                    group_size: format.and_then(|f| f.group_size).map_or(-1, |g| g as i64),
                    latency_ms: secs * 1e3,
                    gb_per_s: runner.weight_bytes() as f64 / secs / 1e9,
                });
            }
        }
    }
    Ok((device, rows))
}
