//! The Hub's cache, in `huggingface_hub`'s layout, which both read and write:
//!
//! ```text
//! models--{org}--{name}/
//!   blobs/{etag}                      file contents: the sha256 of an LFS file, else its git blob id
//!   refs/{revision}                   the commit a branch or tag pointed to when last fetched
//!   snapshots/{commit}/{path}         a relative symlink to ../../blobs/{etag}
//! ```

use std::path::{Path, PathBuf};

use crate::select::{Wanted, choose};
use crate::{HubError, Result};

/// `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
/// `~/.cache/huggingface/hub` (`huggingface_hub`'s order).
pub fn hub_cache() -> PathBuf {
    env_path("HF_HUB_CACHE").unwrap_or_else(|| hf_home().join("hub"))
}

/// `$HF_HOME`, else `$XDG_CACHE_HOME/huggingface`, else `~/.cache/huggingface`.
pub(crate) fn hf_home() -> PathBuf {
    env_path("HF_HOME").unwrap_or_else(|| {
        let cache = env_path("XDG_CACHE_HOME")
            .or_else(|| env_path("HOME").map(|h| h.join(".cache")))
            .unwrap_or_else(std::env::temp_dir);
        cache.join("huggingface")
    })
}

/// A path from the environment variable `key`, unless it is unset or empty.
fn env_path(key: &str) -> Option<PathBuf> {
    std::env::var_os(key)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

pub(crate) fn repo_dir(cache: &Path, repo: &str) -> PathBuf {
    cache.join(format!("models--{}", repo.replace('/', "--")))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io {
        path: path.to_owned(),
        source,
    }
}

pub(crate) fn is_commit(revision: &str) -> bool {
    revision.len() == 40 && revision.chars().all(|c| c.is_ascii_hexdigit())
}

/// The commit `revision` names in the cache: itself, or what its ref last pointed to.
fn cached_commit(repo_dir: &Path, revision: &str) -> Option<String> {
    if is_commit(revision) {
        return Some(revision.to_owned());
    }
    let text = std::fs::read_to_string(repo_dir.join("refs").join(revision)).ok()?;
    Some(text.trim().to_owned()).filter(|c| is_commit(c))
}

pub(crate) fn snapshot(repo_dir: &Path, commit: &str) -> PathBuf {
    repo_dir.join("snapshots").join(commit)
}

/// The path to serve from the cached snapshot of `revision`, if it holds all of `wanted`:
/// for a safetensors model its config, a tokenizer and every weight file its index lists.
pub(crate) fn find(repo_dir: &Path, revision: &str, wanted: &Wanted) -> Result<Option<PathBuf>> {
    let Some(commit) = cached_commit(repo_dir, revision) else {
        return Ok(None);
    };
    let snap = snapshot(repo_dir, &commit);
    if !snap.is_dir() {
        return Ok(None);
    }
    let files = list(&snap)?;
    let Ok(chosen) = choose(&files, wanted) else {
        return Ok(None);
    };
    if chosen.iter().any(|f| f.ends_with(".gguf")) {
        return Ok(chosen.first().map(|f| snap.join(f)));
    }
    if *wanted == Wanted::Adapter {
        // `choose` found its files in the snapshot.
        return Ok(Some(snap));
    }
    let has = |f: &str| files.iter().any(|x| x == f);
    let tokenizer = has("tokenizer.json") || has("tokenizer.model");
    let complete = has("config.json") && tokenizer && index_complete(&snap, &files);
    Ok((complete && pooling_complete(&snap)).then_some(snap))
}

/// Whether the pooling configuration of each Pooling module sentence-transformers'
/// `modules.json` names is there (true without one): without it an embedding model would
/// be pooled by another rule.
fn pooling_complete(snap: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(snap.join("modules.json")) else {
        return true;
    };
    let Ok(modules) = serde_json::from_str::<serde_json::Value>(&text) else {
        return true;
    };
    let pooling = (modules.as_array().into_iter().flatten())
        .filter(|m| m["type"].as_str().is_some_and(|t| t.ends_with(".Pooling")))
        .filter_map(|m| m["path"].as_str());
    pooling
        .into_iter()
        .all(|p| snap.join(p).join("config.json").is_file())
}

/// Whether every shard `model.safetensors.index.json` names is there (true without one).
fn index_complete(snap: &Path, files: &[String]) -> bool {
    let Ok(text) = std::fs::read_to_string(snap.join("model.safetensors.index.json")) else {
        return true;
    };
    let Ok(index) = serde_json::from_str::<serde_json::Value>(&text) else {
        return false;
    };
    let map = index["weight_map"].as_object();
    map.is_some_and(|m| {
        m.values()
            .filter_map(|v| v.as_str())
            .all(|shard| files.iter().any(|f| f == shard))
    })
}

/// The files under `dir` (a snapshot), as repository paths; links to blobs that are not
/// there are left out.
fn list(dir: &Path) -> Result<Vec<String>> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_owned()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).map_err(io(&d))? {
            let path = entry.map_err(io(&d))?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.is_file()
                && let Ok(rel) = path.strip_prefix(dir)
            {
                out.push(rel.to_string_lossy().replace('\\', "/"));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// Records that `revision` is `commit` (`refs/{revision}`), as `huggingface_hub` does.
pub(crate) fn write_ref(repo_dir: &Path, revision: &str, commit: &str) -> Result<()> {
    if is_commit(revision) {
        return Ok(());
    }
    let path = repo_dir.join("refs").join(revision);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    write_atomic(&path, commit.as_bytes())
}

/// Writes `bytes` beside `path`, then renames it there: a reader sees all or nothing.
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = temp_beside(path);
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io(path))
}

/// A file name beside `path` no other process or thread writes to.
pub(crate) fn temp_beside(path: &Path) -> PathBuf {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let name = path
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    path.with_file_name(format!(".{name}.{}.{n}.incomplete", std::process::id()))
}

pub(crate) fn blob(repo_dir: &Path, etag: &str) -> PathBuf {
    repo_dir.join("blobs").join(etag)
}

/// Links `snapshots/{commit}/{file}` to `blobs/{etag}` with a relative path, as
/// `huggingface_hub` does (so the cache can move).
#[cfg(unix)]
pub(crate) fn link(repo_dir: &Path, commit: &str, file: &str, etag: &str) -> Result<()> {
    let path = snapshot(repo_dir, commit).join(file);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let depth = file.matches('/').count() + 2;
    let target = PathBuf::from("../".repeat(depth)).join("blobs").join(etag);
    let tmp = temp_beside(&path);
    std::os::unix::fs::symlink(&target, &tmp).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))
}

/// Where symlinks are not to be had, the snapshot holds a copy (as `huggingface_hub` falls
/// back to).
#[cfg(not(unix))]
pub(crate) fn link(repo_dir: &Path, commit: &str, file: &str, etag: &str) -> Result<()> {
    let path = snapshot(repo_dir, commit).join(file);
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let from = blob(repo_dir, etag);
    std::fs::copy(&from, &path).map(|_| ()).map_err(io(&path))
}

/// A model repository in the cache, as `ferrite model list` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedRepo {
    /// `org/name`.
    pub repo: String,
    /// Each ref with the commit it names (`main` → `0123abcd…`).
    pub refs: Vec<(String, String)>,
    /// The snapshots' files' paths, across its commits.
    pub files: Vec<String>,
    /// Bytes of its blobs.
    pub bytes: u64,
}

/// The model repositories in the Hub cache `cache`, by name.
pub fn cached_repos(cache: &Path) -> Vec<CachedRepo> {
    let Ok(dirs) = std::fs::read_dir(cache) else {
        return Vec::new();
    };
    let mut out: Vec<CachedRepo> = dirs
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let (org, model) = name.strip_prefix("models--")?.split_once("--")?;
            Some(describe(&e.path(), format!("{org}/{model}")))
        })
        .collect();
    out.sort_by(|a, b| a.repo.cmp(&b.repo));
    out
}

fn describe(dir: &Path, repo: String) -> CachedRepo {
    let files_in = |d: &Path| -> Vec<PathBuf> {
        std::fs::read_dir(d)
            .map(|r| r.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default()
    };
    let refs = files_in(&dir.join("refs"))
        .into_iter()
        .filter_map(|p| {
            let name = p.file_name()?.to_string_lossy().into_owned();
            Some((name, std::fs::read_to_string(&p).ok()?.trim().to_owned()))
        })
        .collect();
    let mut files: Vec<String> = files_in(&dir.join("snapshots"))
        .iter()
        .flat_map(|snap| list(snap).unwrap_or_default())
        .collect();
    files.sort();
    files.dedup();
    let bytes = files_in(&dir.join("blobs"))
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    CachedRepo {
        repo,
        refs,
        files,
        bytes,
    }
}
