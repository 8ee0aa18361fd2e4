//! How a model's embeddings are pooled, from what its checkpoint says: sentence-transformers'
//! `modules.json` and `1_Pooling/config.json` beside a Hugging Face checkpoint (as
//! Qwen3-Embedding and gte-Qwen2 ship them), or GGUF's `{arch}.pooling_type`. The engine
//! pools the last token ([`crate::step`]'s final hidden state); a model that asks for mean or
//! CLS pooling is refused embeddings, saying so, rather than given another kind.

use std::path::Path;

use ferrite_formats::gguf::GgufFile;
use serde_json::Value;

/// How embeddings of a model are made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pooling {
    /// L2-normalize (sentence-transformers' `Normalize` module; llama.cpp's default). A model
    /// with no sentence-transformers files is normalized, as vLLM does.
    pub normalize: bool,
    /// Why this model's embeddings are refused (a pooling other than the last token's).
    pub refused: Option<String>,
}

impl Default for Pooling {
    fn default() -> Self {
        Self {
            normalize: true,
            refused: None,
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
        let mode = config.as_ref().and_then(|c| {
            // The one `pooling_mode_*` set (the name carries the mode).
            let modes = c.as_object()?.iter();
            modes
                .filter(|(k, v)| k.starts_with("pooling_mode_") && v.as_bool() == Some(true))
                .map(|(k, _)| k.trim_start_matches("pooling_mode_").to_owned())
                .find(|m| m != "lasttoken")
        });
        Self {
            normalize: has(".Normalize"),
            refused: mode.as_deref().map(refusal),
        }
    }
}

fn refusal(mode: &str) -> String {
    format!(
        "this model pools its embeddings by `{mode}`, and ferrite pools the last token only: \
         it does not serve its embeddings"
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
        assert_eq!(Pooling::of_dir(&d), Pooling::default());
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
        let unnormalized = MODULES.replace("Normalize", "Dense");
        let d = dir_with(&[
            ("modules.json", &unnormalized),
            ("1_Pooling/config.json", last),
        ]);
        assert!(!Pooling::of_dir(&d).normalize);
    }
}
