//! The Hub's HTTP API: a revision's commit and files (`/api/models/{repo}/revision/{rev}`,
//! with their blob ids and LFS hashes), and each file's bytes (`/{repo}/resolve/{commit}/
//! {path}`, which redirects LFS files to a CDN; the token is not sent past the Hub's host).

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use ureq::config::RedirectAuthHeaders;

use crate::cache::{self, blob, link, snapshot, write_ref};
use crate::select::{Wanted, choose};
use crate::transfer::{self, Response, Source};
use crate::{HubError, RepoRef, Result};

/// Files downloaded at once.
const PARALLEL: usize = 4;

/// A file of a revision, as the API lists it.
#[derive(Debug, Clone)]
struct Sibling {
    path: String,
    size: Option<u64>,
    /// Its name in `blobs/`: the LFS sha256, else the git blob id.
    etag: Option<String>,
    /// The sha256 the Hub holds for an LFS file, checked on arrival.
    sha256: Option<String>,
}

pub(crate) struct Hub {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
}

impl Hub {
    /// `HF_ENDPOINT` (default `https://huggingface.co`) and the token of `HF_TOKEN`, else of
    /// the file `HF_TOKEN_PATH` names, else of `$HF_HOME/token`.
    pub(crate) fn from_env() -> Self {
        let endpoint = std::env::var("HF_ENDPOINT")
            .ok()
            .filter(|e| !e.is_empty())
            .unwrap_or_else(|| "https://huggingface.co".into());
        let token = std::env::var("HF_TOKEN")
            .ok()
            .or_else(|| {
                let path = std::env::var_os("HF_TOKEN_PATH")
                    .map(PathBuf::from)
                    .unwrap_or_else(|| cache::hf_home().join("token"));
                std::fs::read_to_string(path).ok()
            })
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty());
        let config = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .redirect_auth_headers(RedirectAuthHeaders::SameHost)
            .timeout_connect(Some(Duration::from_secs(30)))
            // A stalled transfer fails rather than hanging the start-up forever; a slow one
            // does not (a shard of several GB takes minutes), so the bound is on each read.
            .timeout_per_read(Some(Duration::from_secs(60)))
            .user_agent(concat!("ferrite/", env!("CARGO_PKG_VERSION")))
            .build();
        Self {
            agent: ureq::Agent::new_with_config(config),
            endpoint: endpoint.trim_end_matches('/').to_owned(),
            token,
        }
    }

    fn get(&self, url: &str) -> Result<ureq::http::Response<ureq::Body>> {
        self.get_from(url, 0)
    }

    /// The commit `r.revision` is now, and its files.
    fn revision(&self, r: &RepoRef) -> Result<(String, Vec<Sibling>)> {
        let url = format!(
            "{}/api/models/{}/revision/{}?blobs=true",
            self.endpoint,
            r.repo,
            r.revision.replace('/', "%2F")
        );
        let mut resp = self.get(&url)?;
        self.check(r, &url, &mut resp)?;
        let bad = |m: String| HubError::Http {
            url: url.clone(),
            message: m,
        };
        let text = resp
            .body_mut()
            .with_config()
            .limit(64 << 20)
            .read_to_string()
            .map_err(|e| bad(e.to_string()))?;
        let info: Value = serde_json::from_str(&text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let commit = info["sha"]
            .as_str()
            .filter(|c| cache::is_commit(c))
            .ok_or_else(|| bad("no commit (`sha`) in the answer".into()))?;
        let siblings = info["siblings"]
            .as_array()
            .ok_or_else(|| bad("no file list (`siblings`) in the answer".into()))?;
        let files = siblings.iter().filter_map(sibling).collect();
        Ok((commit.to_owned(), files))
    }

    /// Downloads the files of `r` that its snapshot lacks; gives the path to serve.
    pub(crate) fn fetch(
        &self,
        r: &RepoRef,
        repo_dir: &Path,
        on_download: impl FnOnce(&str),
    ) -> Result<PathBuf> {
        let (commit, siblings) = self.revision(r)?;
        let paths: Vec<String> = siblings.iter().map(|s| s.path.clone()).collect();
        let chosen = choose(&paths, &r.wanted())
            .map_err(|m| HubError::Choice(format!("{} (revision {}): {m}", r.repo, r.revision)))?;
        let snap = snapshot(repo_dir, &commit);
        let missing: Vec<&Sibling> = siblings
            .iter()
            .filter(|s| chosen.contains(&s.path) && !snap.join(&s.path).is_file())
            .collect();
        let bytes: u64 = missing.iter().filter_map(|s| s.size).sum();
        if !missing.is_empty() {
            on_download(&format!(
                "{} file(s), {:.1} MB, of {} at commit {} into {}",
                missing.len(),
                bytes as f64 / 1e6,
                r.repo,
                &commit[..12],
                repo_dir.display()
            ));
        }
        self.download_all(r, repo_dir, &commit, &missing)?;
        write_ref(repo_dir, &r.revision, &commit)?;
        Ok(match r.wanted() {
            Wanted::Model | Wanted::Adapter if !chosen.iter().any(|f| f.ends_with(".gguf")) => snap,
            _ => chosen.first().map_or(snap.clone(), |f| snap.join(f)),
        })
    }

    /// `files`, [`PARALLEL`] at a time (a model's shards come faster from the CDN side by
    /// side); the first failure stops the others from starting new files.
    fn download_all(
        &self,
        r: &RepoRef,
        repo_dir: &Path,
        commit: &str,
        files: &[&Sibling],
    ) -> Result<()> {
        let next = AtomicUsize::new(0);
        let failed: Mutex<Option<HubError>> = Mutex::new(None);
        let failed_yet = || failed.lock().map_or(true, |f| f.is_some());
        std::thread::scope(|scope| {
            for _ in 0..PARALLEL.min(files.len()) {
                scope.spawn(|| {
                    while !failed_yet() {
                        let Some(s) = files.get(next.fetch_add(1, Ordering::Relaxed)) else {
                            return;
                        };
                        if let Err(e) = self.download(r, repo_dir, commit, s) {
                            if let Ok(mut f) = failed.lock() {
                                f.get_or_insert(e);
                            }
                            return;
                        }
                    }
                });
            }
        });
        match failed.into_inner() {
            Ok(Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// One file into `blobs/` ([`transfer`]: resumed where a transfer broke), checked against
    /// the Hub's sha256 where it has one, then linked into the snapshot.
    fn download(&self, r: &RepoRef, repo_dir: &Path, commit: &str, s: &Sibling) -> Result<()> {
        let url = format!("{}/{}/resolve/{commit}/{}", self.endpoint, r.repo, s.path);
        let blobs = repo_dir.join("blobs");
        std::fs::create_dir_all(&blobs).map_err(|source| HubError::Io {
            path: blobs.clone(),
            source,
        })?;
        let want = transfer::Blob {
            url: &url,
            file: &s.path,
            size: s.size,
            etag: s.etag.as_deref(),
        };
        let _lock = transfer::BlobLock::take(repo_dir, want.etag)?;
        if let Some(etag) = want.etag.filter(|e| blob(repo_dir, e).is_file()) {
            // Another process brought it while this one waited for the lock.
            return link(repo_dir, commit, &s.path, etag);
        }
        let part = transfer::partial(repo_dir, &want);
        let started = Instant::now();
        let fetched = transfer::fetch(self, r, &want, &part);
        if fetched.is_err() && want.etag.is_none() {
            // A file of this process's own, which no later run would resume.
            let _ = std::fs::remove_file(&part);
        }
        let (size, sha) = fetched?;
        if let Some(expected) = s.sha256.as_ref().filter(|e| **e != sha) {
            let _ = std::fs::remove_file(&part);
            return Err(HubError::Corrupt {
                repo: r.repo.clone(),
                file: s.path.clone(),
                expected: expected.clone(),
                got: sha,
            });
        }
        let etag = s.etag.clone().unwrap_or(sha);
        let dest = blob(repo_dir, &etag);
        std::fs::rename(&part, &dest).map_err(|source| HubError::Io {
            path: dest.clone(),
            source,
        })?;
        link(repo_dir, commit, &s.path, &etag)?;
        let secs = started.elapsed().as_secs_f64().max(1e-3);
        eprintln!(
            "ferrite: {} {:.1} MB in {secs:.1} s ({:.1} MB/s)",
            s.path,
            size as f64 / 1e6,
            size as f64 / 1e6 / secs
        );
        Ok(())
    }
}

/// The Hub's HTTP client as the source of files' bytes.
impl Source for Hub {
    fn get_from(&self, url: &str, from: u64) -> Result<Response> {
        let mut req = self.agent.get(url);
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        if from > 0 {
            req = req.header("range", format!("bytes={from}-"));
        }
        req.call().map_err(|e| HubError::Http {
            url: url.to_owned(),
            message: e.to_string(),
        })
    }

    fn check(&self, r: &RepoRef, url: &str, resp: &mut Response) -> Result<()> {
        let status = resp.status().as_u16();
        match status {
            200..=299 => Ok(()),
            401 | 403 => Err(HubError::Unauthorized {
                repo: r.repo.clone(),
                endpoint: self.endpoint.clone(),
                status,
            }),
            404 => Err(HubError::NotFound {
                repo: r.repo.clone(),
                revision: r.revision.clone(),
                endpoint: self.endpoint.clone(),
            }),
            _ => {
                let body = resp.body_mut().with_config().limit(4096).read_to_string();
                Err(HubError::Http {
                    url: url.to_owned(),
                    message: format!("HTTP {status}: {}", body.unwrap_or_default().trim()),
                })
            }
        }
    }
}

/// A file of the API's `siblings` list.
fn sibling(v: &Value) -> Option<Sibling> {
    let path = v["rfilename"].as_str()?.to_owned();
    // Paths come from the server: none may climb out of the snapshot.
    if path.starts_with('/') || path.split('/').any(|p| p == ".." || p.is_empty()) {
        return None;
    }
    let sha256 = v["lfs"]["sha256"].as_str().map(str::to_owned);
    let hex = |e: &String| e.chars().all(|c| c.is_ascii_hexdigit());
    Some(Sibling {
        size: v["lfs"]["size"].as_u64().or(v["size"].as_u64()),
        etag: sha256
            .clone()
            .or(v["blobId"].as_str().map(str::to_owned))
            .filter(hex),
        sha256: sha256.filter(hex),
        path,
    })
}
