//! `ferrite quantize`: a Hugging Face safetensors checkpoint to a GPTQ-format one, by
//! round-to-nearest, that ferrite (and other GPTQ loaders, for the formats they support) load.
//!
//! The decoder layers' projections (`model.layers.N.…_proj.weight`) are quantized; the
//! embeddings, the LM head, norms and biases are copied as they are, as GPTQ tools do.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrite_kernels::quant::GgmlType;
use ferrite_kernels::wq::{ScaleType, WqFormat};
use safetensors::Dtype;
use safetensors::tensor::TensorView;

use crate::error::{EngineError, Result};
use crate::weights::gptq::{GptqConfig, GptqTensors};
use crate::weights::safetensors::open_dir;

/// Files copied unchanged next to the quantized weights, when present.
const COPIED_FILES: &[&str] = &[
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
];

/// What [`quantize_checkpoint`] did.
#[derive(Debug, Clone)]
pub struct QuantizeReport {
    pub quantized_layers: usize,
    pub copied_tensors: usize,
    pub bytes_in: usize,
    pub bytes_out: u64,
    pub seconds: f64,
    pub output: PathBuf,
}

/// Whether a tensor is one of the projections GPTQ quantizes.
fn is_projection(name: &str, shape: &[usize]) -> bool {
    name.starts_with("model.layers.") && name.ends_with("_proj.weight") && shape.len() == 2
}

/// Quantizes the checkpoint in directory `input` to `format`, writing `output` (created; it
/// must not exist or be empty).
pub fn quantize_checkpoint(
    input: &Path,
    output: &Path,
    format: WqFormat,
) -> Result<QuantizeReport> {
    let start = Instant::now();
    let io = |path: &Path| {
        let path = path.to_owned();
        move |source| EngineError::Io { path, source }
    };
    if !input.is_dir() {
        return Err(EngineError::BadConfig(format!(
            "{} is not a Hugging Face model directory (config.json + *.safetensors); to run a \
             GGUF model quantized, load it with --quantize rtn-{format}",
            input.display()
        )));
    }
    let cfg_path = input.join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&cfg_path).map_err(io(&cfg_path))?)
            .map_err(|e| EngineError::BadConfig(format!("config.json: {e}")))?;
    if cfg.get("quantization_config").is_some() {
        return Err(EngineError::BadConfig(format!(
            "{} is already quantized (config.json has a quantization_config)",
            input.display()
        )));
    }
    let tensors = open_dir(input)?;
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

    // Quantize every projection (each in parallel inside), keeping the other tensors' bytes.
    let mut names: Vec<&str> = tensors.names().collect();
    names.sort_unstable();
    let mut packed: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = Vec::new();
    let mut borrowed: Vec<(String, Dtype, Vec<usize>, &[u8])> = Vec::new();
    let mut quantized_layers = 0;
    for name in names {
        let entry = tensors.entry(name).ok_or_else(|| {
            EngineError::UnsupportedTensorType(format!(
                "integer tensor `{name}` in an unquantized checkpoint"
            ))
        })?;
        if is_projection(name, &entry.shape) {
            let wq = tensors.matrix(name)?.rtn_codes(name, format)?;
            let g = GptqTensors::from_wq(&wq).map_err(|e| match e {
                EngineError::BadTensor { reason, .. } => EngineError::BadTensor {
                    name: name.to_owned(),
                    reason,
                },
                other => other,
            })?;
            let stem = name.trim_end_matches(".weight");
            let words = |v: &[i32]| v.iter().flat_map(|w| w.to_le_bytes()).collect::<Vec<u8>>();
            let p = 32 / format.bits.get() as usize;
            let scale_dtype = match g.scale_type {
                ScaleType::F16 => Dtype::F16,
                ScaleType::Bf16 => Dtype::BF16,
            };
            packed.push((
                format!("{stem}.qweight"),
                Dtype::I32,
                vec![g.cols / p, g.rows],
                words(&g.qweight),
            ));
            packed.push((
                format!("{stem}.qzeros"),
                Dtype::I32,
                vec![g.groups, g.rows / p],
                words(&g.qzeros),
            ));
            packed.push((
                format!("{stem}.scales"),
                scale_dtype,
                vec![g.groups, g.rows],
                g.scales.iter().flat_map(|s| s.to_le_bytes()).collect(),
            ));
            packed.push((
                format!("{stem}.g_idx"),
                Dtype::I32,
                vec![g.cols],
                words(&g.g_idx),
            ));
            quantized_layers += 1;
        } else {
            let dtype = match entry.ty {
                GgmlType::F32 => Dtype::F32,
                GgmlType::F16 => Dtype::F16,
                _ => Dtype::BF16,
            };
            let bytes = tensors.bytes(name).unwrap_or_default();
            borrowed.push((name.to_owned(), dtype, entry.shape.clone(), bytes));
        }
    }
    if quantized_layers == 0 {
        return Err(EngineError::BadConfig(format!(
            "{} has no model.layers.N.*_proj.weight tensors to quantize",
            input.display()
        )));
    }

    std::fs::create_dir_all(output).map_err(io(output))?;
    let copied_tensors = borrowed.len();
    let views = packed
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), *d, s, b.as_slice()))
        .chain(borrowed.iter().map(|(n, d, s, b)| (n.as_str(), *d, s, *b)))
        .map(|(n, d, s, b)| {
            TensorView::new(d, s.clone(), b)
                .map(|v| (n.to_owned(), v))
                .map_err(|e| EngineError::BadTensor {
                    name: n.to_owned(),
                    reason: e.to_string(),
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let metadata = HashMap::from([
        ("format".to_owned(), "pt".to_owned()),
        ("quantizer".to_owned(), format!("ferrite rtn-{format}")),
    ]);
    let weights = output.join("model.safetensors");
    safetensors::tensor::serialize_to_file(views, Some(metadata), &weights).map_err(|e| {
        EngineError::Io {
            path: weights.clone(),
            source: std::io::Error::other(e.to_string()),
        }
    })?;

    cfg["quantization_config"] = GptqConfig::for_format(format).to_json();
    let out_cfg = output.join("config.json");
    let text = serde_json::to_string_pretty(&cfg)
        .map_err(|e| EngineError::BadConfig(format!("config.json: {e}")))?;
    std::fs::write(&out_cfg, text).map_err(io(&out_cfg))?;
    for f in COPIED_FILES {
        let from = input.join(f);
        if from.exists() {
            std::fs::copy(&from, output.join(f)).map_err(io(&from))?;
        }
    }
    Ok(QuantizeReport {
        quantized_layers,
        copied_tensors,
        bytes_in: tensors.total_bytes(),
        bytes_out: std::fs::metadata(&weights).map_err(io(&weights))?.len(),
        seconds: start.elapsed().as_secs_f64(),
        output: output.to_owned(),
    })
}
