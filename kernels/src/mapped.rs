//! Read-only memory-mapped files (and, for generated weights, plain memory behind the same
//! interface).

use std::fs::File;
use std::path::Path;

/// A file mapped read-only into memory. Weights are read from the mapping in place.
#[derive(Debug)]
pub struct MappedFile {
    map: Storage,
}

#[derive(Debug)]
enum Storage {
    Mapped(memmap2::Mmap),
    /// Bytes made in memory (`--load-format dummy`), used like a file's.
    Owned(Vec<u8>),
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
        Ok(Self {
            map: Storage::Mapped(map),
        })
    }

    /// Bytes already in memory, served like a mapped file's.
    pub fn from_vec(bytes: Vec<u8>) -> Self {
        Self {
            map: Storage::Owned(bytes),
        }
    }

    /// Brings the whole file into memory now (reading it from disk if it is not in the page
    /// cache) rather than page by page during the first forward passes. Returns the bytes
    /// loaded.
    pub fn load_pages(&self) -> usize {
        // Read-ahead hint first: the kernel can then fetch large extents instead of one fault's
        // worth at a time. Failure only loses the hint.
        if let Storage::Mapped(map) = &self.map {
            let _ = map.advise(memmap2::Advice::WillNeed);
        }
        const PAGE: usize = 4096;
        let bytes = self.bytes();
        // One read per page faults it in; the sum keeps the reads from being optimized away.
        let touched = bytes
            .chunks(1 << 20)
            .map(|chunk| chunk.iter().step_by(PAGE).fold(0u8, |a, &b| a ^ b))
            .fold(0u8, |a, b| a ^ b);
        std::hint::black_box(touched);
        bytes.len()
    }

    /// The whole file's bytes.
    /// Brings bytes `start..end` of the file into memory now (one rank's shard of a tensor).
    /// Returns the bytes loaded.
    pub fn load_range(&self, start: usize, end: usize) -> usize {
        const PAGE: usize = 4096;
        let bytes = &self.bytes()[start.min(end)..end.min(self.bytes().len())];
        let touched = bytes.iter().step_by(PAGE).fold(0u8, |a, &b| a ^ b);
        std::hint::black_box(touched);
        bytes.len()
    }

    /// Lets the kernel drop the whole pages within bytes `start..end` from this process's
    /// memory; they are read from the file again if touched. What a rank does with the
    /// full-width rows it copied its columns out of: it keeps the copy, not the rows.
    pub fn release_range(&self, start: usize, end: usize) {
        const PAGE: usize = 4096;
        let (first, last) = (
            start.div_ceil(PAGE) * PAGE,
            end.min(self.bytes().len()) / PAGE * PAGE,
        );
        if let Storage::Mapped(map) = &self.map
            && last > first
        {
            // SAFETY: the map is read-only and never written, so a dropped page reads back from
            // the file with the same bytes; nothing can observe the difference. Failure only
            // keeps the pages.
            #[allow(unsafe_code)]
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, first, last - first)
            };
        }
    }

    pub fn bytes(&self) -> &[u8] {
        match &self.map {
            Storage::Mapped(m) => m,
            Storage::Owned(v) => v,
        }
    }
}
