//! `ferrite bench kernels`: weight-only quantized linear layers against the f16 baseline, in
//! the columns of seed 004 (`device stage mode model backend a_dtype b_dtype bs tokens
//! group_size latency`).
//!
//! The `layer` mode (the one the CPU runs) times the seven projections of one decoder layer of
//! each model's shape (Q, K, V, O, gate, up, down) on random weights, at each batch size, and
//! adds the GB/s of weights streamed. `--mode model` (the seed's rows) runs whole models on the
//! GPU with decode in CUDA graphs (`bench_kernels_model`).

use std::hint::black_box;
use std::time::Instant;

use anyhow::{Result, bail};
use clap::{Args, ValueEnum};
use ferrite_engine::model::presets;
use ferrite_kernels::cpu::matmul::{MatmulOptions, Weight, WeightView};
use ferrite_kernels::quant::{GgmlActivations, GgmlType};
use ferrite_kernels::wq::{WqFormat, quantize_rtn};
use half::f16;
use serde_json::json;

use crate::bench_kernels_row::{Row, b_dtype_of, backend_of};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Mode {
    /// One decoder layer's projections, per model shape (CPU and GPU).
    Layer,
    /// The whole model on the GPU, decode replayed from CUDA graphs (needs a CUDA device).
    Model,
}

#[derive(Debug, Args)]
pub struct KernelsArgs {
    #[arg(long, value_enum, default_value = "layer")]
    mode: Mode,
    /// Dummy-shape presets (`ferrite model list`).
    #[arg(
        long,
        default_value = "gemma-2-9b,qwen2.5-32b,llama-3-70b",
        value_delimiter = ','
    )]
    models: Vec<String>,
    /// `f16` (the baseline), weight formats (`w8g128`, `w4g128-sym`, ...) and GGUF block
    /// types of 32 (`q8_0`, `q4_0`, `q4_1`, `mxfp4`: random codes, timed with int8
    /// activations, the CPU's default).
    #[arg(
        long,
        default_value = "f16,w8g128,w4g128,w2g128",
        value_delimiter = ','
    )]
    formats: Vec<String>,
    /// Decode batch sizes.
    #[arg(long, default_value = "1,16", value_delimiter = ',')]
    batch_sizes: Vec<usize>,
    /// Prefill tokens (0: no prefill rows; 2048 in the seed, minutes per layer on a small CPU).
    #[arg(long, default_value_t = 0)]
    prefill_tokens: usize,
    /// Context length printed in the decode rows (linear layers do not depend on it).
    #[arg(long, default_value_t = 2048)]
    context: usize,
    /// Timed runs per row (median), after one warm-up.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    #[arg(long)]
    json: bool,
}

/// A weight in one of the compared formats.
enum Stored {
    F16(Vec<u8>),
    Wq(ferrite_kernels::wq::WqMatrix),
    Blocks(GgmlType, Vec<u8>),
}

impl Stored {
    fn new(w: &[f32], n: usize, k: usize, format: Format) -> Result<Self> {
        Ok(match format {
            Format::F16 => Stored::F16(
                w.iter()
                    .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                    .collect(),
            ),
            Format::Wq(fmt) => Stored::Wq(quantize_rtn(w, n, k, fmt)?),
            Format::Blocks(ty) => Stored::Blocks(ty, random_blocks(ty, n * k)),
        })
    }

    fn weight(&self, rows: usize, cols: usize) -> Result<Weight<'_>> {
        Ok(match self {
            Stored::F16(b) => Weight::Ggml(WeightView::new(GgmlType::F16, rows, cols, b)?),
            Stored::Wq(w) => Weight::Wq(w),
            Stored::Blocks(ty, b) => Weight::Ggml(WeightView::new(*ty, rows, cols, b)?),
        })
    }

    fn bytes(&self) -> usize {
        match self {
            Stored::F16(b) | Stored::Blocks(_, b) => b.len(),
            Stored::Wq(w) => w.bytes_len(),
        }
    }
}

/// A compared format: the f16 baseline, a weight-only format, or a GGUF block type.
#[derive(Debug, Clone, Copy)]
enum Format {
    F16,
    Wq(WqFormat),
    Blocks(GgmlType),
}

impl Format {
    fn parse(s: &str) -> Result<Self> {
        let blocks = ["q8_0", "q4_0", "q4_1", "mxfp4"];
        Ok(match s {
            "f16" => Format::F16,
            b if blocks.contains(&b) => Format::Blocks(b.parse()?),
            other => Format::Wq(other.parse()?),
        })
    }

    fn wq(self) -> Option<WqFormat> {
        match self {
            Format::Wq(f) => Some(f),
            _ => None,
        }
    }
}

/// `n` weights of block type `ty` (of 32): random codes under scales of a trained model's size
/// (f16 `d` from 0.002 to 0.0045, MXFP4 exponents 2^-10 to 2^-7), a Q4_1 minimum likewise.
fn random_blocks(ty: GgmlType, n: usize) -> Vec<u8> {
    let codes = random(n / 32 * ty.block_bytes(), 7);
    let mut bytes: Vec<u8> = codes.iter().map(|v| (v.to_bits() >> 7) as u8).collect();
    for (i, b) in bytes.chunks_exact_mut(ty.block_bytes()).enumerate() {
        let d = f16::from_f32(0.002 + (i % 6) as f32 * 0.0005).to_le_bytes();
        match ty {
            GgmlType::MXFP4 => b[0] = 117 + (i % 4) as u8,
            GgmlType::Q4_1 => {
                b[..2].copy_from_slice(&d);
                b[2..4].copy_from_slice(&f16::from_f32(-0.01).to_le_bytes());
            }
            _ => b[..2].copy_from_slice(&d),
        }
    }
    bytes
}

pub fn run(args: KernelsArgs) -> Result<()> {
    if args.runs == 0 {
        bail!("--runs must be at least 1");
    }
    let formats: Vec<Format> = (args.formats.iter())
        .map(|f| Format::parse(f))
        .collect::<Result<_>>()?;
    let mut stages: Vec<(&'static str, usize, usize)> = args
        .batch_sizes
        .iter()
        .map(|&bs| ("decode", bs, args.context))
        .collect();
    if args.prefill_tokens > 0 {
        stages.push(("prefill", args.prefill_tokens, args.prefill_tokens));
    }
    if args.mode == Mode::Model {
        let formats = (formats.iter())
            .map(|f| match f {
                Format::Blocks(ty) => bail!("--mode model runs weight formats, not {ty} blocks"),
                f => Ok(f.wq()),
            })
            .collect::<Result<Vec<_>>>()?;
        let (device, rows) =
            crate::bench_kernels_model::rows(&args.models, &formats, &stages, args.runs)?;
        return print(&device, &rows, args.json);
    }
    let mut rows = Vec::new();
    for name in &args.models {
        let preset = presets::preset(name)?;
        let c = preset.config()?;
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let shapes = [
            (c.q_dim(), h),
            (c.kv_dim(), h),
            (c.kv_dim(), h),
            (h, c.q_dim()),
            (f, h),
            (f, h),
            (h, f),
        ];
        // (seconds, bytes) per (format, stage), summed over the layer's projections.
        let mut totals = vec![vec![(0f64, 0usize); stages.len()]; formats.len()];
        for (si, &(n, k)) in shapes.iter().enumerate() {
            let w = random(n * k, si as u64 + 1);
            for (fi, &format) in formats.iter().enumerate() {
                let stored = Stored::new(&w, n, k, format)?;
                let weight = stored.weight(n, k)?;
                for (ti, &(_, m, _)) in stages.iter().enumerate() {
                    let secs = median_seconds(&weight, m, k, n, args.runs);
                    totals[fi][ti].0 += secs;
                    totals[fi][ti].1 += stored.bytes();
                }
            }
        }
        for (fi, format) in formats.iter().enumerate() {
            let (wq, blocks) = match format {
                Format::Blocks(ty) => (None, Some(*ty)),
                f => (f.wq(), None),
            };
            for (ti, &(stage, bs, tokens)) in stages.iter().enumerate() {
                let (secs, bytes) = totals[fi][ti];
                rows.push(Row {
                    stage,
                    mode: "layer",
                    a_dtype: if blocks.is_some() { "int8" } else { "float32" },
                    model: preset.model.to_owned(),
                    backend: if blocks.is_some() {
                        "ferrite"
                    } else {
                        backend_of(&wq)
                    },
                    b_dtype: blocks.map_or_else(|| b_dtype_of(&wq), |t| t.name().to_lowercase()),
                    bs: if stage == "prefill" { 1 } else { bs },
                    tokens,
                    group_size: match blocks {
                        Some(_) => 32,
                        None => wq.and_then(|f| f.group_size).map_or(-1, |g| g as i64),
                    },
                    latency_ms: secs * 1e3,
                    gb_per_s: bytes as f64 / secs / 1e9,
                });
            }
        }
    }
    print(&cpu_name(), &rows, args.json)
}

/// The rows in the seed's columns (plus GB/s), or as JSON.
fn print(device: &str, rows: &[Row], json: bool) -> Result<()> {
    if json {
        let out: Vec<_> = rows
            .iter()
            .map(|r| {
                json!({"device": device, "stage": r.stage, "mode": r.mode, "model": r.model,
                    "backend": r.backend, "a_dtype": r.a_dtype, "b_dtype": r.b_dtype, "bs": r.bs,
                    "tokens": r.tokens, "group_size": r.group_size, "latency": r.latency_ms,
                    "gb_per_s": r.gb_per_s})
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    let header = [
        "device",
        "stage",
        "mode",
        "model",
        "backend",
        "a_dtype",
        "b_dtype",
        "bs",
        "tokens",
        "group_size",
        "latency",
        "gb_per_s",
    ];
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            vec![
                device.to_owned(),
                r.stage.into(),
                r.mode.into(),
                r.model.clone(),
                r.backend.into(),
                r.a_dtype.into(),
                r.b_dtype.clone(),
                r.bs.to_string(),
                r.tokens.to_string(),
                r.group_size.to_string(),
                format!("{:.6}", r.latency_ms),
                format!("{:.2}", r.gb_per_s),
            ]
        })
        .collect();
    print!("{}", crate::table::aligned(&header, &cells));
    Ok(())
}

/// Median wall seconds of a product with `m` activation rows, after one warm-up call: int8
/// activations for GGUF blocks (the CPU's default), f32 for the other formats.
fn median_seconds(w: &Weight<'_>, m: usize, k: usize, n: usize, runs: usize) -> f64 {
    let x = random(m * k, 99);
    let mut out = vec![0f32; m * n];
    let opts = MatmulOptions {
        ggml_activations: GgmlActivations::Int8,
        ..MatmulOptions::default()
    };
    opts.one(&x, m, *w, &mut out);
    let mut times: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            opts.one(black_box(&x), m, *w, &mut out);
            black_box(&mut out);
            t.elapsed().as_secs_f64()
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Uniform values in ±0.035 (an N(0, 0.02)-like spread), deterministic in `seed`.
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * 0.035
        })
        .collect()
}

/// The CPU's model name with spaces as dashes (the seed's device column has no spaces).
fn cpu_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|n| n.split_whitespace().collect::<Vec<_>>().join("-"))
        })
        .unwrap_or_else(|| "cpu".into())
}
