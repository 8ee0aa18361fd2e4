//! How a model's embeddings are pooled, from what its checkpoint says: sentence-transformers'
//! `modules.json` and `1_Pooling/config.json` beside a Hugging Face checkpoint (as
//! Qwen3-Embedding, gte-Qwen2, all-MiniLM and bge ship them), or GGUF's `{arch}.pooling_type`.
//! A decoder pools the last token (the engine's, from [`crate::step`]'s final hidden state),
//! and one that asks for another pooling is refused embeddings, saying so, rather than given
//! another kind; an encoder ([`crate::encoder`]) pools by the mean or the first token too.

use std::path::Path;

use ferrite_formats::gguf::GgufFile;
use serde_json::Value;

/// How a prompt's final hidden states become its embedding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingMode {
    /// The last token's (a decoder's: the only one that saw the whole prompt).
    LastToken,
    /// The mean over the prompt's tokens (sentence-transformers' `mean_tokens`).
    Mean,
    /// The first token's, `[CLS]` or `<s>` (`cls_token`).
    Cls,
}

impl PoolingMode {
    /// sentence-transformers' name of it (`pooling_mode_{name}`), llama.cpp's too.
    fn parse(name: &str) -> Option<Self> {
        match name {
            "lasttoken" | "last" => Some(Self::LastToken),
            "mean_tokens" | "mean" => Some(Self::Mean),
            "cls_token" | "cls" => Some(Self::Cls),
            _ => None,
        }
    }
}

/// How embeddings of a model are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pooling {
    /// L2-normalize (sentence-transformers' `Normalize` module; llama.cpp's default). A model
    /// with no sentence-transformers files is normalized, as vLLM does.
    pub normalize: bool,
    /// Why this model's embeddings are refused (a pooling other than the last token's).
    pub refused: Option<String>,
    /// The pooling its files name (`None` where none: the model's kind says).
    pub mode: Option<PoolingMode>,
}

impl Default for Pooling {
    fn default() -> Self {
        Self {
            normalize: true,
            refused: None,
            mode: None,
        }
    }
}

impl Pooling {
    /// What a GGUF file's metadata says (read at load, from the file already open).
    pub fn of_gguf(gguf: &GgufFile) -> Self {
        let arch = gguf.get_str("general.architecture").unwrap_or_default();
        // llama.cpp's LLAMA_POOLING_TYPE: 0 none, 1 mean, 2 cls, 3 last, 4 rank.
        let mode = match gguf.get_u64(&format!("{arch}.pooling_type")) {
            Some(1) => Some("mean"),
            Some(2) => Some("cls"),
            Some(4) => Some("rank"),
            _ => None,
        };
        Self {
            normalize: true,
            refused: mode.map(refusal),
            mode: None,
        }
    }

    /// What the sentence-transformers files beside a Hugging Face checkpoint in `dir` say;
    /// what cannot be read leaves the defaults.
    pub fn of_dir(dir: &Path) -> Self {
        let read = |name: &str| -> Option<Value> {
            serde_json::from_slice(&std::fs::read(dir.join(name)).ok()?).ok()
        };
        let Some(modules) = read("modules.json") else {
            return Self::default();
        };
        let modules = modules.as_array().cloned().unwrap_or_default();
        let has = |kind: &str| {
            modules
                .iter()
                .any(|m| m["type"].as_str().is_some_and(|t| t.ends_with(kind)))
        };
        let pooling_dir = modules
            .iter()
            .find(|m| m["type"].as_str().is_some_and(|t| t.ends_with(".Pooling")))
            .and_then(|m| m["path"].as_str());
        let config = pooling_dir.and_then(|p| read(&format!("{p}/config.json")));
        // The `pooling_mode_*` set (the name carries the mode); several set are the
        // concatenation of their vectors, which no mode here gives.
        let modes: Vec<String> = (config.as_ref().and_then(Value::as_object).into_iter())
            .flatten()
            .filter(|(k, v)| k.starts_with("pooling_mode_") && v.as_bool() == Some(true))
            .map(|(k, _)| k.trim_start_matches("pooling_mode_").to_owned())
            .collect();
        let mode = match modes.len() {
            0 | 1 => modes.into_iter().next(),
            _ => Some(modes.join(" and ")),
        };
        let known = mode.as_deref().and_then(PoolingMode::parse);
        Self {
            normalize: has(".Normalize"),
            refused: mode.filter(|m| m != "lasttoken").map(|m| refusal(&m)),
            mode: known,
        }
    }

    /// What an encoder in `dir` pools by: what its files name where they name the mean, the
    /// first or the last token, else the first token (`[CLS]`, as vLLM pools an encoder with
    /// no files); normalized unless they say otherwise.
    pub fn of_encoder_dir(dir: &Path) -> (Self, PoolingMode) {
        let files = Self::of_dir(dir);
        let mode = files.mode.unwrap_or(PoolingMode::Cls);
        let refused = match files.mode {
            Some(_) => None,
            // A mode named and not known (max, weighted mean...) stays refused.
            None => files.refused,
        };
        let pooling = Self {
            refused,
            mode: Some(mode),
            ..files
        };
        (pooling, mode)
    }
}

fn refusal(mode: &str) -> String {
    format!(
        "this model pools its embeddings by `{mode}`, and ferrite pools a decoder's last token \
         only (an encoder's by its mean, first or last token): it does not serve its embeddings"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory holding `files` (under the system's temporary directory).
    fn dir_with(files: &[(&str, &str)]) -> std::path::PathBuf {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("ferrite-pooling-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        for (name, text) in files {
            let p = d.join(name);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
        d
    }

    const MODULES: &str = r#"[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
        {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}]"#;

    /// Qwen3-Embedding's files: last token, normalized; without the files, the defaults; a
    /// mean-pooled model refused; no Normalize module, no normalization.
    #[test]
    fn sentence_transformers_files_say_how() {
        let last = r#"{"word_embedding_dimension": 1024, "pooling_mode_cls_token": false,
            "pooling_mode_mean_tokens": false, "pooling_mode_lasttoken": true}"#;
        let d = dir_with(&[("modules.json", MODULES), ("1_Pooling/config.json", last)]);
        let p = Pooling::of_dir(&d);
        assert_eq!(
            (p.normalize, p.refused, p.mode),
            (true, None, Some(PoolingMode::LastToken))
        );
        assert_eq!(Pooling::of_dir(&dir_with(&[])), Pooling::default());
        let mean = last
            .replace(
                "\"pooling_mode_mean_tokens\": false",
                "\"pooling_mode_mean_tokens\": true",
            )
            .replace(
                "\"pooling_mode_lasttoken\": true",
                "\"pooling_mode_lasttoken\": false",
            );
        let d = dir_with(&[("modules.json", MODULES), ("1_Pooling/config.json", &mean)]);
        let p = Pooling::of_dir(&d);
        assert!(p.refused.is_some_and(|r| r.contains("`mean_tokens`")));
        // An encoder pools by the mean, as asked; by [CLS] where nothing says.
        let (p, mode) = Pooling::of_encoder_dir(&d);
        assert_eq!((p.refused, mode), (None, PoolingMode::Mean));
        assert_eq!(Pooling::of_encoder_dir(&dir_with(&[])).1, PoolingMode::Cls);
        let max = mean.replace("mean_tokens", "max_tokens");
        let d = dir_with(&[("modules.json", MODULES), ("1_Pooling/config.json", &max)]);
        let (p, _) = Pooling::of_encoder_dir(&d);
        assert!(p.refused.is_some_and(|r| r.contains("`max_tokens`")));
        let both = mean.replace(
            "\"pooling_mode_cls_token\": false",
            "\"pooling_mode_cls_token\": true",
        );
        let d = dir_with(&[("modules.json", MODULES), ("1_Pooling/config.json", &both)]);
        let (p, _) = Pooling::of_encoder_dir(&d);
        assert!(
            p.refused
                .is_some_and(|r| r.contains("`cls_token and mean_tokens`"))
        );
        let unnormalized = MODULES.replace("Normalize", "Dense");
        let d = dir_with(&[
            ("modules.json", &unnormalized),
            ("1_Pooling/config.json", last),
        ]);
        assert!(!Pooling::of_dir(&d).normalize);
    }
}
