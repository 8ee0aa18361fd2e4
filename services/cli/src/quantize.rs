//! `ferrite quantize --method rtn --bits B --group-size G [--sym] IN OUT`.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use ferrite_engine::quantize::quantize_checkpoint;
use ferrite_kernels::wq::{Bits, ScaleType, WqFormat};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Method {
    /// Round to nearest, each group's scale from its own range.
    Rtn,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ScaleDtype {
    F16,
    Bf16,
}

#[derive(Debug, Args)]
pub struct QuantizeArgs {
    #[arg(long, value_enum, default_value = "rtn")]
    method: Method,
    /// Bits per weight: 8, 4 or 2.
    #[arg(long)]
    bits: u32,
    /// Weights per group along the input dimension: 32, 64, 128, or -1 for per-channel.
    #[arg(long, default_value_t = 128, allow_negative_numbers = true)]
    group_size: i64,
    /// Symmetric: no zero points (the zero is fixed at 2^(bits-1)).
    #[arg(long)]
    sym: bool,
    #[arg(long, value_enum, default_value = "f16")]
    scale_dtype: ScaleDtype,
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer files).
    input: PathBuf,
    /// The directory to write (must not exist, or be empty).
    output: PathBuf,
}

pub fn run(args: QuantizeArgs) -> Result<()> {
    let Method::Rtn = args.method;
    let group_size = match args.group_size {
        -1 => None,
        g @ (32 | 64 | 128) => Some(g as usize),
        other => bail!("--group-size {other}: use 32, 64, 128, or -1 for per-channel"),
    };
    let format = WqFormat {
        bits: Bits::from_u32(args.bits)?,
        group_size,
        zero_point: !args.sym,
        scale_type: match args.scale_dtype {
            ScaleDtype::F16 => ScaleType::F16,
            ScaleDtype::Bf16 => ScaleType::Bf16,
        },
    };
    let r = quantize_checkpoint(&args.input, &args.output, format)
        .with_context(|| format!("quantizing {}", args.input.display()))?;
    println!(
        "{}: {} layers quantized to {format} (gptq format), {} tensors copied; {:.1} MB -> {:.1} MB in {:.2} s",
        r.output.display(),
        r.quantized_layers,
        r.copied_tensors,
        r.bytes_in as f64 / 1e6,
        r.bytes_out as f64 / 1e6,
        r.seconds
    );
    Ok(())
}
