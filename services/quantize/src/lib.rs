//! ferrite's offline tools: `ferrite quantize`, and the perplexity that measures what it cost.
//! The CLI and its benches run them; no serving process does.
//!
//! `ferrite quantize`: a model (a Hugging Face directory, or a GGUF file dequantized) to a
//! quantized Hugging Face directory that ferrite and other tools read ([`OutputFormat`]):
//! weight-only schemes in the GPTQ format (the default), AWQ's GEMM format or compressed-tensors'
//! `pack-quantized`; W8A8 in compressed-tensors' `int-quantized` format, FP8 in its
//! `float-quantized` one.
//!
//! The decoder layers' projections are quantized ([`crate::calib`] does the work, layer by
//! layer); the embeddings and the LM head stay as stored, as GPTQ tools leave them. Norms and
//! biases are written as f32 (SmoothQuant and AWQ fold scales into them).
//!
//! # Layout
//!
//! - this file: the job, the layouts written ([`OutputFormat`]) and the driver
//!   ([`quantize_model`]);
//! - [`calib`]: calibrated quantization (GPTQ, AWQ, SmoothQuant, RTN), one decoder layer at a
//!   time;
//! - [`gptq`]: the GPTQ algorithm itself, for the weight-only formats and W8A8's int8 (what
//!   `calib` runs on each projection);
//! - `write`, `layout`: the quantized model as a Hugging Face directory, each projection in its
//!   format's tensors;
//! - [`eval`]: perplexity on a text (the quality check for quantized weights).
//!
//! It may use the engine (loading a model, and the model's layer-by-layer face:
//! `ferrite_engine::model::llama`), the formats crate (the layouts it writes), the kernels (the
//! quantized matrices, RTN and the grid rules), the text crate (the tokenizer) and the
//! collective crate (a solo rank). Nothing of ferrite but the CLI uses it: the engine must not.

pub mod calib;
pub mod eval;
pub mod gptq;
mod layout;
mod write;

use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrite_kernels::fp8::Fp8Scales;
use ferrite_kernels::wq::{Bits, WqFormat};
use ferrite_text::Tokenizer;

use ferrite_engine::config::{ModelConfig, RopeStyle};
use ferrite_engine::model::{self, LoadOptions, WeightFormat};
use ferrite_engine::{EngineError, Result};
use ferrite_formats::awq::AwqConfig;
use ferrite_formats::compressed::{CompressedConfig, CompressedScheme, Fp8Act};
use ferrite_formats::gptq::GptqConfig;

use crate::calib::{CalibOptions, LayerReport, Method, Scheme};

/// What [`quantize_model`] did.
#[derive(Debug, Clone)]
pub struct QuantizeReport {
    /// Linear layers (projections) quantized.
    pub quantized_layers: usize,
    /// Tensors written in float (embeddings, norms, biases, LM head).
    pub copied_tensors: usize,
    pub bytes_in: usize,
    pub bytes_out: u64,
    pub calibration_tokens: usize,
    pub seconds: f64,
    pub output: PathBuf,
}

/// One `ferrite quantize` run.
#[derive(Debug, Clone)]
pub struct QuantizeJob {
    pub input: PathBuf,
    pub output: PathBuf,
    pub opts: CalibOptions,
    /// The calibration text; its first half is used (see [`calib::split_tokens`]).
    pub calib: CalibText,
    /// At most this many calibration tokens.
    pub calib_tokens: usize,
    /// The layout written; `None` is the scheme's usual one ([`OutputFormat::default_for`]).
    pub format: Option<OutputFormat>,
}

/// The checkpoint layouts `ferrite quantize` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputFormat {
    /// GPTQ (`quant_method: gptq`, v1 zero points): weight-only schemes.
    Gptq,
    /// AWQ's GEMM layout (`quant_method: awq`): 4-bit weight-only schemes in groups.
    Awq,
    /// compressed-tensors: `pack-quantized` weight-only, `int-quantized` W8A8,
    /// `float-quantized` FP8.
    CompressedTensors,
}

/// The `--format` names: `gptq`, `awq`, `compressed-tensors`.
impl std::fmt::Display for OutputFormat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Gptq => "gptq",
            Self::Awq => "awq",
            Self::CompressedTensors => "compressed-tensors",
        })
    }
}

impl OutputFormat {
    /// GPTQ for the weight-only schemes, compressed-tensors for W8A8 and FP8.
    pub fn default_for(scheme: Scheme) -> Self {
        match scheme {
            // GPTQ's 3-bit layout (codes straddling words in groups of 32) is not written.
            Scheme::WeightOnly(f) if f.bits == Bits::B3 => Self::CompressedTensors,
            Scheme::WeightOnly(_) | Scheme::F32 => Self::Gptq,
            Scheme::W8A8 | Scheme::Fp8(_) => Self::CompressedTensors,
        }
    }

    /// The `quantization_config` of `scheme` in this layout (null for f32), or why the layout
    /// cannot hold it.
    pub fn quantization_config(self, scheme: Scheme) -> Result<serde_json::Value> {
        let bad = |m: String| Err(EngineError::InvalidRequest(m));
        let compressed = |scheme| CompressedConfig { scheme }.to_json();
        match (scheme, self) {
            (Scheme::F32, _) => Ok(serde_json::Value::Null),
            (Scheme::WeightOnly(f), Self::Gptq) if f.bits == Bits::B3 => bad(
                "3-bit weights are written in compressed-tensors' layout (--format \
                 compressed-tensors), not GPTQ's"
                    .into(),
            ),
            (Scheme::WeightOnly(f), Self::Gptq) => Ok(GptqConfig::for_format(f).to_json()),
            (Scheme::WeightOnly(f), Self::CompressedTensors) => {
                Ok(CompressedConfig::packed(f).to_json())
            }
            (Scheme::WeightOnly(f), Self::Awq) => {
                if f.bits.get() != 4 || f.group_size.is_none() {
                    return bad(format!(
                        "the AWQ format holds 4-bit weights in groups (w4a16 with a group \
                         size), not {f}"
                    ));
                }
                Ok(AwqConfig {
                    group_size: f.group_size,
                }
                .to_json())
            }
            (Scheme::W8A8, Self::CompressedTensors) => Ok(compressed(CompressedScheme::W8A8Int8)),
            (Scheme::Fp8(weights), Self::CompressedTensors) => {
                Ok(compressed(CompressedScheme::Fp8 {
                    weights,
                    act: Fp8Act::dynamic(weights),
                }))
            }
            (s, f) => bad(format!(
                "{s} is written in the compressed-tensors format, not {f} (--format \
                 compressed-tensors)"
            )),
        }
    }
}

/// Where calibration tokens come from.
#[derive(Debug, Clone)]
pub enum CalibText {
    /// A text file, tokenized by the model's tokenizer (the first half is used).
    File(PathBuf),
    /// Token ids, used as they are (models without a tokenizer; tests).
    Tokens(Vec<u32>),
}

/// The default calibration text: one every Debian machine has.
pub const DEFAULT_CALIB_FILE: &str = "/usr/share/common-licenses/GPL-3";

/// Quantizes the checkpoint in directory `input` to `format` by round-to-nearest, writing
/// `output` (created; it must not exist or be empty).
pub fn quantize_checkpoint(
    input: &Path,
    output: &Path,
    format: WqFormat,
) -> Result<QuantizeReport> {
    if !input.is_dir() {
        return Err(EngineError::BadConfig(format!(
            "{} is not a Hugging Face model directory (config.json + *.safetensors); to run a \
             GGUF model quantized, load it with --quantize rtn-{format}",
            input.display()
        )));
    }
    let job = QuantizeJob {
        input: input.to_owned(),
        output: output.to_owned(),
        opts: CalibOptions::new(Method::Rtn, Scheme::WeightOnly(format)),
        calib: CalibText::File(PathBuf::from(DEFAULT_CALIB_FILE)),
        calib_tokens: 0,
        format: None,
    };
    quantize_model(&job, &mut |_| {})
}

/// Runs `job`; `progress` hears of each layer as it is done.
pub fn quantize_model(
    job: &QuantizeJob,
    progress: &mut dyn FnMut(&LayerReport),
) -> Result<QuantizeReport> {
    let start = Instant::now();
    let format = job
        .format
        .unwrap_or_else(|| OutputFormat::default_for(job.opts.scheme));
    let mut quantization = format.quantization_config(job.opts.scheme)?;
    calib::check_options(&job.opts)?;
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| EngineError::Io { path, source }
    };
    let hf_config = if job.input.is_dir() {
        let p = job.input.join("config.json");
        let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&p).map_err(io(&p))?)
            .map_err(|e| EngineError::BadConfig(format!("config.json: {e}")))?;
        if cfg.get("quantization_config").is_some() {
            return Err(EngineError::BadConfig(format!(
                "{} is already quantized (config.json has a quantization_config)",
                job.input.display()
            )));
        }
        Some(cfg)
    } else {
        None
    };
    let output = &job.output;
    if output.exists()
        && std::fs::read_dir(output)
            .map_err(io(output))?
            .next()
            .is_some()
    {
        return Err(EngineError::BadConfig(format!(
            "{} exists and is not empty; refusing to overwrite it",
            output.display()
        )));
    }
    // Pages are read as each layer is quantized, not all up front.
    let loaded = model::load_with(
        &job.input,
        LoadOptions {
            lazy_pages: true,
            ..LoadOptions::default()
        },
    )?;
    check_fp8_blocks(job.opts.scheme, loaded.model.config())?;
    write::check_writable(loaded.model.config(), hf_config.as_ref())?;
    let tokens = calibration_tokens(job, loaded.tokenizer.as_ref())?;
    let layers = calib::quantize_layers(&loaded.model, &tokens, &job.opts, progress)?;
    let src = write::Source {
        model: &loaded.model,
        tokenizer: loaded.tokenizer.as_ref(),
        hf: match (loaded.format, hf_config) {
            (WeightFormat::Safetensors, Some(cfg)) => Some((job.input.as_path(), cfg)),
            _ => None,
        },
    };
    let quantizer = format!("ferrite {}-{}", job.opts.method_name(), job.opts.scheme);
    if loaded.model.config().moe.is_some()
        && let Some(ignore) = quantization
            .get_mut("ignore")
            .and_then(|v| v.as_array_mut())
    {
        // The routers (and Qwen2-MoE's shared expert gate) stay in float, as llm-compressor's
        // recipes for these models leave them.
        for router in [
            "mlp.gate",
            "block_sparse_moe.gate",
            "mlp.shared_expert_gate",
        ] {
            ignore.push(format!("re:.*{}$", router.replace('.', "\\.")).into());
        }
    }
    let written = write::write_dir(&src, &layers, format, quantization, &quantizer, output)?;
    let used = tokens.len() / job.opts.ctx.max(1) * job.opts.ctx;
    Ok(QuantizeReport {
        quantized_layers: layers.iter().map(|l| l.projections().len()).sum(),
        copied_tensors: written.float_tensors,
        bytes_in: loaded.checkpoint_bytes,
        bytes_out: written.bytes_out,
        calibration_tokens: used,
        seconds: start.elapsed().as_secs_f64(),
        output: output.to_owned(),
    })
}

/// Refuses FP8 blocks the model's projections do not hold whole (ferrite runs partial
/// blocks, but vLLM and transformers quantize the activations in whole groups: the checkpoint
/// would load nowhere else), and, for GGUF's Q/K rows, which go back to Hugging Face order
/// within each head when written, blocks that split a head. Checked before any work.
fn check_fp8_blocks(scheme: Scheme, c: &ModelConfig) -> Result<()> {
    let Scheme::Fp8(Fp8Scales::Block { rows: br, cols: bc }) = scheme else {
        return Ok(());
    };
    let refuse = |m: String| Err(EngineError::InvalidRequest(m));
    let (h, q, kv, ffn) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
    let shapes = [
        ("q", q, h),
        ("k and v", kv, h),
        ("o", h, q),
        ("gate and up", ffn, h),
        ("down", h, ffn),
    ];
    if let Some((name, rows, cols)) = shapes
        .into_iter()
        .find(|&(_, r, k)| !(r.is_multiple_of(br) && k.is_multiple_of(bc)))
    {
        return refuse(format!(
            "FP8 blocks: the {name} projections' {rows}x{cols} weights are not whole {br}x{bc} \
             blocks; pick a block side that divides both (--group-size)"
        ));
    }
    if c.rope_style == RopeStyle::Interleaved && !br.is_multiple_of(c.head_dim) {
        return refuse(format!(
            "FP8 blocks of {br} rows split the GGUF model's heads of {} rows, whose Q and K rows \
             are written back in Hugging Face order within each head: use a block side that is \
             a multiple of {} (--group-size)",
            c.head_dim, c.head_dim
        ));
    }
    Ok(())
}

/// The calibration tokens `job` asks for (none for round to nearest): its tokens, or its text
/// file's calibration half tokenized by `tok`.
fn calibration_tokens(job: &QuantizeJob, tok: Option<&Tokenizer>) -> Result<Vec<u32>> {
    match (&job.calib, job.opts.method) {
        (_, Method::Rtn) => Ok(Vec::new()),
        (CalibText::Tokens(t), _) => Ok(t[..t.len().min(job.calib_tokens)].to_vec()),
        (CalibText::File(p), _) => {
            let tok = tok.ok_or_else(|| {
                EngineError::BadConfig(
                    "calibration needs the model's tokenizer; it has none".into(),
                )
            })?;
            let text = std::fs::read_to_string(p).map_err(|source| EngineError::Io {
                path: p.clone(),
                source,
            })?;
            let mut all: Vec<u32> = tok.bos_id().into_iter().collect();
            all.extend(
                tok.encode(&text, false).map_err(|e| {
                    EngineError::BadConfig(format!("tokenizing {}: {e}", p.display()))
                })?,
            );
            let (calib, _held_out) = calib::split_tokens(&all);
            Ok(calib[..calib.len().min(job.calib_tokens)].to_vec())
        }
    }
}
