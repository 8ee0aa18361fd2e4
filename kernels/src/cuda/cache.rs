//! CUBIN on disk, keyed by (source hash, GPU arch, NVRTC version).
//!
//! Compiling a module takes NVRTC 35–350 ms on the GPU host; a start-up that finds every module
//! cached loads them in microseconds. The key hashes everything that changes the binary — the
//! module's source, every header, the arch, NVRTC's version and the options — so a stale entry
//! is never used, and old entries are simply never read again.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use sha2::{Digest, Sha256};

use super::CudaError;
use super::nvrtc::{self, COMPILE_OPTIONS};
use super::sources::{HEADERS, KernelSource};

/// Where CUBINs are kept: `$FERRITE_KERNEL_CACHE`, else `$XDG_CACHE_HOME/ferrite/kernels`, else
/// `~/.cache/ferrite/kernels`, else the temp dir.
pub fn default_cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("FERRITE_KERNEL_CACHE") {
        return dir.into();
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("ferrite").join("kernels")
}

/// How one module was obtained.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleBuild {
    pub module: &'static str,
    /// Read from the cache (else compiled and stored).
    pub hit: bool,
    pub cubin_bytes: usize,
    pub seconds: f64,
}

/// A directory of CUBINs for one arch and NVRTC version.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: PathBuf,
    arch: String,
    nvrtc_version: (i32, i32),
}

impl KernelCache {
    /// A cache in `dir` for `arch` (e.g. `sm_90`). Fails when NVRTC cannot be loaded.
    pub fn new(dir: impl Into<PathBuf>, arch: &str) -> Result<Self, CudaError> {
        Ok(Self {
            dir: dir.into(),
            arch: arch.to_owned(),
            nvrtc_version: nvrtc::nvrtc_version()?,
        })
    }

    pub fn arch(&self) -> &str {
        &self.arch
    }

    pub fn nvrtc_version(&self) -> (i32, i32) {
        self.nvrtc_version
    }

    /// The file `module`'s CUBIN is kept in.
    pub fn path_of(&self, module: &KernelSource) -> PathBuf {
        let mut h = Sha256::new();
        for part in [module.name, module.source, &self.arch] {
            h.update((part.len() as u64).to_le_bytes());
            h.update(part.as_bytes());
        }
        for (name, text) in HEADERS {
            h.update(name.as_bytes());
            h.update(text.as_bytes());
        }
        let (major, minor) = self.nvrtc_version;
        h.update(format!("nvrtc {major}.{minor} {COMPILE_OPTIONS:?}").as_bytes());
        let digest = h.finalize();
        let hex: String = digest[..8].iter().map(|b| format!("{b:02x}")).collect();
        self.dir
            .join(format!("{}-{}-{hex}.cubin", module.name, self.arch))
    }

    /// `module`'s CUBIN: from the cache, else compiled and stored. A cache that cannot be
    /// written only costs the next start a compile; it is not an error.
    pub fn cubin(&self, module: &KernelSource) -> Result<(Vec<u8>, ModuleBuild), CudaError> {
        let start = Instant::now();
        let path = self.path_of(module);
        let (cubin, hit) = match std::fs::read(&path) {
            Ok(bytes) if bytes.starts_with(b"\x7fELF") => (bytes, true),
            _ => {
                let cubin = nvrtc::compile_cubin(module.name, module.source, HEADERS, &self.arch)?;
                if let Err(e) = store(&path, &cubin) {
                    tracing::warn!(path = %path.display(), error = %e, "kernel cache not written");
                }
                (cubin, false)
            }
        };
        let build = ModuleBuild {
            module: module.name,
            hit,
            cubin_bytes: cubin.len(),
            seconds: start.elapsed().as_secs_f64(),
        };
        Ok((cubin, build))
    }
}

/// Writes `bytes` to `path` through a temporary file and a rename, so a concurrent reader (two
/// ranks starting at once) never sees half a CUBIN. The temporary file is this writer's alone
/// (process id and a per-process sequence number): with the process id only, two threads of one
/// process storing one module wrote into the same file, and one could rename the other's half
/// written bytes into place, or find its file already renamed away.
fn store(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    static WRITES: AtomicU64 = AtomicU64::new(0);
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.{}.tmp",
        path.file_name()
            .map_or_else(Default::default, |n| n.to_string_lossy()),
        std::process::id(),
        WRITES.fetch_add(1, Ordering::Relaxed)
    ));
    let written = std::fs::write(&tmp, bytes).and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        // Best effort: a stray temporary file is only litter, never read as a CUBIN.
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two threads compiling one module store its CUBIN at once (`build_modules` runs modules
    /// on the rayon pool, and two `Gpu::open`s may race): every store succeeds, and a reader
    /// meanwhile sees either no file or one writer's whole bytes, never a mix or a prefix.
    #[test]
    fn concurrent_stores_of_one_file_never_show_a_partial_cubin() {
        let dir = std::env::temp_dir().join(format!("ferrite-cache-race-{}", std::process::id()));
        let path = dir.join("module-sm_90-0123456789abcdef.cubin");
        const LEN: usize = 1 << 20;
        let done = std::sync::atomic::AtomicBool::new(false);
        std::thread::scope(|s| {
            let writers: Vec<_> = (1..=4u8)
                .map(|id| {
                    let path = &path;
                    s.spawn(move || {
                        let bytes = vec![id; LEN];
                        (0..25).try_for_each(|_| store(path, &bytes))
                    })
                })
                .collect();
            let reader = s.spawn(|| {
                while !done.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(b) = std::fs::read(&path) {
                        assert_eq!(b.len(), LEN, "a partial CUBIN was readable");
                        assert!(b.iter().all(|&x| x == b[0]), "two writers' bytes mixed");
                    }
                }
            });
            for w in writers {
                w.join().expect("writer").expect("store");
            }
            done.store(true, std::sync::atomic::Ordering::Relaxed);
            reader.join().expect("reader");
        });
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .expect("cache dir")
            .map(|e| e.expect("entry").file_name())
            .collect();
        std::fs::remove_dir_all(&dir).expect("clean up");
        assert_eq!(leftovers.len(), 1, "temporary files left: {leftovers:?}");
    }
}
