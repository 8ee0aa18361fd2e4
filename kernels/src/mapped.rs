//! Read-only memory-mapped files.

use std::fs::File;
use std::path::Path;

/// A file mapped read-only into memory. Weights are read from the mapping in place.
#[derive(Debug)]
pub struct MappedFile {
    map: memmap2::Mmap,
}

impl MappedFile {
    /// Maps `path` read-only.
    pub fn open(path: &Path) -> std::io::Result<Self> {
        let file = File::open(path)?;
        // SAFETY: the mapping is read-only and private to this process. Model files are not
        // expected to change while being served; if another process truncates the file, reads
        // may fault (SIGBUS), the same contract every mmap-based loader (llama.cpp, safetensors)
        // has. No Rust reference outlives `self`.
        #[allow(unsafe_code)]
        let map = unsafe { memmap2::Mmap::map(&file)? };
        Ok(Self { map })
    }

    /// The whole file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.map
    }
}
