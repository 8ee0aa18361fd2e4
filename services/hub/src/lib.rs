//! Models named by their Hugging Face Hub repository (`--model Qwen/Qwen2.5-0.5B-Instruct`),
//! as vLLM, SGLang and TGI take them.
//!
//! A reference is `org/name`, optionally `@revision` (a branch, tag or commit; default `main`)
//! and `:file` (a GGUF repository's quantization, `:Q4_K_M`, or a file name ending in `.gguf`).
//! Files live in the Hub's own cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//! `~/.cache/huggingface/hub`) in its layout (`models--org--name/{blobs,refs,snapshots}`), so a
//! model downloaded by `huggingface_hub` (`hf download`) is found there and served without the
//! network, and what ferrite downloads `transformers` finds too. A snapshot that holds the
//! model is used as it is; otherwise the repository's files are listed and the ones ferrite
//! reads are downloaded: the safetensors weights with their config, tokenizer and template
//! files, or the one GGUF file asked for. `HF_ENDPOINT`, `HF_TOKEN` (or the token file that
//! `hf auth login` writes) and `HF_HUB_OFFLINE` mean what they mean to `huggingface_hub`. A
//! transfer that breaks is asked again from where it stopped, and the bytes so far stay in the
//! cache for a later run to resume (`transfer.rs`, as `huggingface_hub` resumes them).

mod cache;
mod remote;
mod select;
mod transfer;

use std::path::PathBuf;

pub use cache::{CachedRepo, cached_repos, hub_cache};
pub use select::Wanted;

/// A model on the Hub, as `--model` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoRef {
    /// `org/name`.
    pub repo: String,
    /// A branch, tag or commit.
    pub revision: String,
    /// A GGUF quantization (`Q4_K_M`) or file name, for repositories of GGUF files.
    pub file: Option<String>,
    /// A LoRA adapter's repository (PEFT's files), not a model's: [`Self::adapter`].
    pub adapter: bool,
}

/// What went wrong finding or fetching a model on the Hub.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    #[error("{repo} (revision {revision}) is not on {endpoint}")]
    NotFound {
        repo: String,
        revision: String,
        endpoint: String,
    },
    #[error(
        "{endpoint} refused {repo} (HTTP {status}): the Hub answers so for a repository that \
         is not there, and for a gated or private one without a token that may read it (check \
         the name; for a gated model accept its terms on the Hub, then set HF_TOKEN or run \
         `hf auth login`)"
    )]
    Unauthorized {
        repo: String,
        endpoint: String,
        status: u16,
    },
    #[error("{repo} is not in the Hub cache {cache} and HF_HUB_OFFLINE forbids downloading it")]
    Offline { repo: String, cache: PathBuf },
    #[error("{0}")]
    Choice(String),
    #[error("{url}: {message}")]
    Http { url: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{file} of {repo} arrived corrupt: its sha256 is {got}, the Hub says {expected}")]
    Corrupt {
        repo: String,
        file: String,
        expected: String,
        got: String,
    },
}

pub type Result<T> = std::result::Result<T, HubError>;

impl RepoRef {
    /// `org/name[@revision][:file]`, with an optional `hf.co/` or `huggingface.co/` in front
    /// (as Ollama writes them); `None` for anything else (a path, a bare name).
    pub fn parse(s: &str) -> Option<Self> {
        let s = ["hf.co/", "huggingface.co/", "https://huggingface.co/"]
            .iter()
            .find_map(|p| s.strip_prefix(p))
            .unwrap_or(s);
        let (rest, file) = match s.rsplit_once(':') {
            Some((rest, file)) if !file.is_empty() && !file.contains('/') => {
                (rest, Some(file.to_owned()))
            }
            Some(_) => return None,
            None => (s, None),
        };
        let (repo, revision) = match rest.split_once('@') {
            Some((repo, rev)) if valid_revision(rev) => (repo, rev),
            Some(_) => return None,
            None => (rest, "main"),
        };
        let (org, name) = repo.split_once('/')?;
        (valid_part(org) && valid_part(name)).then(|| Self {
            repo: repo.to_owned(),
            revision: revision.to_owned(),
            file,
            adapter: false,
        })
    }

    /// [`Self::parse`] for a LoRA adapter's repository: PEFT's `adapter_config.json` and
    /// `adapter_model.safetensors`, or (`:file`) one GGUF adapter file.
    pub fn adapter(s: &str) -> Option<Self> {
        Self::parse(s).map(|r| Self { adapter: true, ..r })
    }

    /// What to fetch of the repository.
    pub fn wanted(&self) -> Wanted {
        match (&self.file, self.adapter) {
            (None, false) => Wanted::Model,
            (None, true) => Wanted::Adapter,
            (Some(f), _) => Wanted::Gguf(f.clone()),
        }
    }
}

/// A Hub name part: letters, digits, `-`, `_`, `.`, not starting with `.` or `-`, no `..`.
fn valid_part(s: &str) -> bool {
    (1..=96).contains(&s.len())
        && !s.starts_with(['.', '-'])
        && !s.contains("..")
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

fn valid_revision(s: &str) -> bool {
    (1..=256).contains(&s.len())
        && !s.contains("..")
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./".contains(c))
}

/// Whether `HF_HUB_OFFLINE` is set to a true value.
fn offline() -> bool {
    std::env::var("HF_HUB_OFFLINE")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "1" | "true" | "yes" | "on"))
}

/// The local path of `r`: the snapshot directory of a safetensors model, or the GGUF file
/// asked for. From the cache where it holds the model; else downloaded into it (unless
/// offline), `on_download` told first with the number of files and bytes to fetch.
pub fn resolve(r: &RepoRef, on_download: impl FnOnce(&str)) -> Result<PathBuf> {
    let cache = hub_cache();
    let repo_dir = cache::repo_dir(&cache, &r.repo);
    if let Some(path) = cache::find(&repo_dir, &r.revision, &r.wanted())? {
        return Ok(path);
    }
    if offline() {
        return Err(HubError::Offline {
            repo: r.repo.clone(),
            cache,
        });
    }
    remote::Hub::from_env().fetch(r, &repo_dir, on_download)
}

/// Downloads `r` into the cache again (the files its snapshot lacks), even where a snapshot
/// holds the model: the revision is looked up anew.
pub fn pull(r: &RepoRef, on_download: impl FnOnce(&str)) -> Result<PathBuf> {
    let repo_dir = cache::repo_dir(&hub_cache(), &r.repo);
    remote::Hub::from_env().fetch(r, &repo_dir, on_download)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_parse_and_paths_do_not() {
        let r = RepoRef::parse("Qwen/Qwen2.5-0.5B-Instruct").expect("a repo");
        assert_eq!(
            (r.repo.as_str(), r.revision.as_str(), r.file),
            ("Qwen/Qwen2.5-0.5B-Instruct", "main", None)
        );
        let r = RepoRef::parse("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M").expect("gguf");
        assert_eq!(r.repo, "bartowski/Llama-3.2-1B-Instruct-GGUF");
        assert_eq!(r.wanted(), Wanted::Gguf("Q4_K_M".into()));
        let r = RepoRef::parse("org/m@v1.0:model-q8_0.gguf").expect("revision and file");
        assert_eq!(
            (r.revision.as_str(), r.file.as_deref()),
            ("v1.0", Some("model-q8_0.gguf"))
        );
        for not_a_repo in [
            "smollm2-135m",
            "/abs/path/model",
            "./models/x",
            "../x/y",
            "a/b/c",
            "org/",
            "/name",
            "org/na me",
            "org/..",
            "org/name@",
            "org/name:",
            "C:/models/x",
        ] {
            assert_eq!(RepoRef::parse(not_a_repo), None, "{not_a_repo}");
        }
    }
}
