//! One file's bytes into the cache's `blobs/`, surviving a broken connection, as
//! `huggingface_hub` downloads them: the bytes so far stay in `blobs/{etag}.incomplete` (its
//! name for them), a transfer that breaks is asked again from where it stopped (`Range:
//! bytes=N-`, up to [`ATTEMPTS`] times, waiting longer each time), and a later run resumes
//! what an earlier one left. An exclusive lock at `.locks/{repo folder}/{etag}.lock` beside the
//! repositories (`huggingface_hub`'s lock too) keeps two processes from writing one blob.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use sha2::{Digest, Sha256};

use crate::cache::{blob, temp_beside};
use crate::{HubError, RepoRef, Result};

/// A response whose body is the file's bytes (or part of them).
pub(crate) type Response = ureq::http::Response<ureq::Body>;

/// Where the bytes come from (the Hub's HTTP client).
pub(crate) trait Source {
    /// `url`'s bytes from `from` on (a `Range` request past 0).
    fn get_from(&self, url: &str, from: u64) -> Result<Response>;
    /// Fails on any status but success, saying what it means for `r`.
    fn check(&self, r: &RepoRef, url: &str, resp: &mut Response) -> Result<()>;
}

/// Requests for one file's bytes before giving up (the bytes so far are kept).
const ATTEMPTS: u32 = 5;
/// The wait before the second request; it doubles for each one after.
const FIRST_WAIT: Duration = Duration::from_millis(500);

/// A file to bring into `blobs/`.
pub(crate) struct Blob<'a> {
    pub url: &'a str,
    /// Its path in the repository (for messages).
    pub file: &'a str,
    pub size: Option<u64>,
    /// Its name in `blobs/`, where the Hub gives one: its bytes so far then survive the
    /// process.
    pub etag: Option<&'a str>,
}

/// The lock on one blob of `repo_dir`, held while it is written; released when dropped.
pub(crate) struct BlobLock {
    _held: Option<File>,
}

impl BlobLock {
    /// Waits for the lock on `etag` (another process may be writing it; `None`: none to take).
    pub(crate) fn take(repo_dir: &Path, etag: Option<&str>) -> Result<Self> {
        let Some(etag) = etag else {
            return Ok(Self { _held: None });
        };
        let folder = repo_dir.file_name().unwrap_or_default();
        let dir = repo_dir.with_file_name(".locks").join(folder);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let path = dir.join(format!("{etag}.lock"));
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(&path))?;
        file.lock().map_err(io(&path))?;
        Ok(Self { _held: Some(file) })
    }
}

/// Where `b`'s bytes so far are kept: `blobs/{etag}.incomplete`, or a file of this process's
/// own where the Hub gives no etag.
pub(crate) fn partial(repo_dir: &Path, b: &Blob) -> PathBuf {
    match b.etag {
        Some(etag) => {
            let mut p = blob(repo_dir, etag).into_os_string();
            p.push(".incomplete");
            PathBuf::from(p)
        }
        None => temp_beside(&repo_dir.join("blobs").join(b.file.replace('/', "_"))),
    }
}

/// Brings `b` into `part` (resuming what it holds), asking again from where a broken transfer
/// stopped; gives the whole file's size and sha256 (hex).
pub(crate) fn fetch(
    hub: &impl Source,
    r: &RepoRef,
    b: &Blob,
    part: &Path,
) -> Result<(u64, String)> {
    let mut done = Done::resume(part)?;
    let started = Instant::now();
    let mut wait = FIRST_WAIT;
    let mut attempt = 1;
    loop {
        let broke = match hub.get_from(b.url, done.size) {
            Ok(resp) => match done.append(hub, r, b, resp, started)? {
                None => return Ok(done.finish()),
                Some(why) => why,
            },
            Err(e) => e.to_string(),
        };
        let of = b
            .size
            .map_or_else(String::new, |s| format!(" of {:.1}", mb(s)));
        if attempt == ATTEMPTS {
            // Without an etag the next run could not find them: the caller removes them.
            let kept = match b.etag {
                Some(_) => format!(", kept in {} for the next run to resume", part.display()),
                None => String::new(),
            };
            return Err(HubError::Http {
                url: b.url.to_owned(),
                message: format!(
                    "{broke}; gave up after {ATTEMPTS} attempts with {:.1}{of} MB{kept}",
                    mb(done.size)
                ),
            });
        }
        eprintln!(
            "ferrite: {}: the transfer broke at {:.1}{of} MB ({broke}); asking for the rest \
             in {:.1} s (attempt {} of {ATTEMPTS})",
            b.file,
            mb(done.size),
            wait.as_secs_f64(),
            attempt + 1
        );
        std::thread::sleep(wait);
        wait *= 2;
        attempt += 1;
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> HubError + '_ {
    move |source| HubError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The bytes of a file so far: in `file`, hashed as they came.
struct Done {
    file: File,
    path: PathBuf,
    size: u64,
    hash: Sha256,
}

impl Done {
    /// Opens `path` for appending, hashing what an earlier run left in it.
    fn resume(path: &Path) -> Result<Self> {
        let mut file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .append(true)
            .open(path)
            .map_err(io(path))?;
        let mut hash = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        let mut size = 0u64;
        loop {
            let n = file.read(&mut buf).map_err(io(path))?;
            if n == 0 {
                break;
            }
            hash.update(&buf[..n]);
            size += n as u64;
        }
        if size > 0 {
            eprintln!(
                "ferrite: {}: resuming after {:.1} MB",
                path.display(),
                mb(size)
            );
        }
        Ok(Self {
            file,
            path: path.to_owned(),
            size,
            hash,
        })
    }

    /// Starts again from nothing (the server sent the whole file).
    fn restart(&mut self) -> Result<()> {
        self.file.set_len(0).map_err(io(&self.path))?;
        self.size = 0;
        self.hash = Sha256::new();
        Ok(())
    }

    /// Appends the body of `resp`; `None` once the file is whole, else why the transfer broke.
    /// A refusal by the server (401, 404...) is an error, not a break.
    fn append(
        &mut self,
        hub: &impl Source,
        r: &RepoRef,
        b: &Blob,
        mut resp: Response,
        started: Instant,
    ) -> Result<Option<String>> {
        match resp.status().as_u16() {
            206 => {}
            // Everything is here already (an earlier run stopped just before the rename).
            416 if b.size == Some(self.size) => return Ok(None),
            // The whole file: the server ignored the range, or none was asked for.
            200 | 416 => self.restart()?,
            _ => hub.check(r, b.url, &mut resp)?,
        }
        if resp.status().as_u16() == 416 {
            return Ok(Some("the server refused the range".into()));
        }
        let mut progress = Progress {
            file: b.file,
            total: b.size,
            started,
            last: Instant::now(),
        };
        let mut body = resp.body_mut().as_reader();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = match body.read(&mut buf) {
                Ok(n) => n,
                Err(e) => return Ok(Some(e.to_string())),
            };
            if n == 0 {
                break;
            }
            self.hash.update(&buf[..n]);
            self.file.write_all(&buf[..n]).map_err(io(&self.path))?;
            self.size += n as u64;
            progress.update(self.size);
        }
        self.file.sync_all().map_err(io(&self.path))?;
        Ok(match b.size {
            Some(s) if s != self.size => {
                Some(format!("the body ended at {} of {s} bytes", self.size))
            }
            _ => None,
        })
    }

    fn finish(self) -> (u64, String) {
        let hex = self
            .hash
            .finalize()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        (self.size, hex)
    }
}

/// A line on stderr every [`PROGRESS_EVERY`] while a file downloads: a model's shard takes
/// minutes, and a start-up that prints nothing for that long looks hung.
struct Progress<'a> {
    file: &'a str,
    total: Option<u64>,
    started: Instant,
    last: Instant,
}

const PROGRESS_EVERY: Duration = Duration::from_secs(10);

impl Progress<'_> {
    fn update(&mut self, done: u64) {
        if self.last.elapsed() < PROGRESS_EVERY {
            return;
        }
        self.last = Instant::now();
        let rate = mb(done) / self.started.elapsed().as_secs_f64().max(1e-3);
        let of = self
            .total
            .map_or_else(String::new, |t| format!(" of {:.0}", mb(t)));
        eprintln!(
            "ferrite: {} {:.0}{of} MB ({rate:.1} MB/s)",
            self.file,
            mb(done)
        );
    }
}
