//! A model's recommended sampling: what its authors ship it with, for the requests that leave
//! a parameter unset (`--generation-config auto`, the default of `serve` and `worker`).
//!
//! Where it comes from, first found first:
//! - `generation_config.json` beside a Hugging Face checkpoint: `temperature`, `top_p`,
//!   `top_k`, `min_p`, `repetition_penalty` (as vLLM's `--generation-config auto` reads it;
//!   `do_sample` is not read, as vLLM does not);
//! - a GGUF file's `general.sampling.temp`, `.top_p`, `.top_k`, `.min_p`, `.penalty_repeat`
//!   (the keys llama.cpp reads);
//! - the registry's entry for a known model ([`crate::registry::KnownModel::sampling`]), from
//!   its model card.
//!
//! A file that names none of them says nothing, and the next source is asked. A value out of
//! the API's range is left out (with a warning), so a bad recommendation never refuses the
//! requests that rely on it.

use std::path::Path;

use ferrite_proto::v1::SamplingDefaults;

use crate::error::Result;
use crate::registry::Recommended;
use crate::registry::{self, KnownModel};
use crate::weights::gguf::GgufFile;

/// The recommendation for the model `name` (as given: a path or a known name), loaded from
/// `path` (the file or directory it resolved to). `None`: no source says anything.
pub fn sampling_defaults(name: &str, path: &Path) -> Result<Option<SamplingDefaults>> {
    if path.is_dir() {
        let file = path.join("generation_config.json");
        if let Some(r) = from_generation_config(&file)? {
            return Ok(Some(r.to_proto("generation_config.json")));
        }
    } else if path.extension().is_some_and(|e| e == "gguf") {
        let r = from_gguf(&GgufFile::open(path)?);
        if !r.is_empty() {
            return Ok(Some(r.to_proto("gguf general.sampling")));
        }
    }
    Ok(known_model(name, path).map(|m| m.sampling.to_proto(&format!("registry: {}", m.card))))
}

/// The known model `name` names, or whose cached file `path` is.
fn known_model(name: &str, path: &Path) -> Option<&'static KnownModel> {
    registry::known(name)
        .or_else(|| {
            registry::KNOWN_MODELS
                .iter()
                .find(|m| path.file_name().is_some_and(|f| f == m.file_name))
        })
        .filter(|m| !m.sampling.is_empty())
}

/// What `generation_config.json` recommends (`None`: no such file, or it names nothing).
pub fn from_generation_config(file: &Path) -> Result<Option<Recommended>> {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(crate::EngineError::Io {
                path: file.to_owned(),
                source,
            });
        }
    };
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| crate::EngineError::BadConfig(format!("{}: {e}", file.display())))?;
    let float = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_f64)
            .map(|x| x as f32)
    };
    let r = Recommended {
        temperature: float("temperature"),
        top_p: float("top_p"),
        top_k: v
            .get("top_k")
            .and_then(serde_json::Value::as_u64)
            .and_then(|k| u32::try_from(k).ok()),
        min_p: float("min_p"),
        repetition_penalty: float("repetition_penalty"),
    };
    Ok((!r.is_empty()).then_some(r))
}

/// What a GGUF file's `general.sampling.*` keys recommend.
pub fn from_gguf(f: &GgufFile) -> Recommended {
    let float = |k: &str| {
        f.get_f64(&format!("general.sampling.{k}"))
            .map(|x| x as f32)
    };
    Recommended {
        temperature: float("temp"),
        top_p: float("top_p"),
        top_k: f
            .get_u64("general.sampling.top_k")
            .and_then(|k| u32::try_from(k).ok()),
        min_p: float("min_p"),
        repetition_penalty: float("penalty_repeat"),
    }
}

#[cfg(test)]
#[path = "recommended_tests.rs"]
mod tests;
