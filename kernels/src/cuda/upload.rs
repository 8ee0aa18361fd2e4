//! Host-to-device copies of a model's weights through pinned staging buffers, several at once.
//!
//! A copy from pageable memory (`cuMemcpyHtoD` on a `Vec`) goes through the driver's own
//! bounce buffer and does not overlap with anything: about 8 GB/s on the H100 host, and the
//! host-side work of producing the bytes (fusing q/k/v, converting BF16 to F16, repacking GGUF
//! blocks) waits for it. Here each of [`lanes`] threads owns a stream and two page-locked
//! buffers: it fills one (running the job's `fill`) while the DMA engine drains the other, so
//! reading the checkpoint, converting and copying all proceed at once, and the copies run at
//! the link's speed.
//!
//! The staging buffers are write-combined (`CU_MEMHOSTALLOC_WRITECOMBINED`): fast for the CPU
//! to write in order and for the device to read, very slow for the CPU to read. A `fill`
//! therefore only writes its output slice, front to back.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::{CudaContext, CudaEvent, result, sys};

use super::CudaError;
use super::gpu::{DevPtr, Gpu};

/// Bytes per staging buffer: large enough that a copy's fixed cost (a few µs) is noise, small
/// enough that a layer's matrices split into many pieces for the lanes to share.
pub const STAGING_BYTES: usize = 8 << 20;

/// Writes bytes `[offset, offset + out.len())` of a region into `out` (front to back, without
/// reading it).
pub type Fill<'a> = Box<dyn Fn(usize, &mut [u8]) + Send + Sync + 'a>;

/// One device region to fill, and how to produce its bytes.
pub struct UploadJob<'a> {
    /// The region's first byte; the buffer must stay allocated until the upload returns.
    pub dst: DevPtr,
    pub bytes: usize,
    /// Pieces start and end at multiples of this (a row's bytes: a `fill` then converts whole
    /// rows). At most [`STAGING_BYTES`].
    pub unit: usize,
    pub fill: Fill<'a>,
}

impl std::fmt::Debug for UploadJob<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadJob")
            .field("dst", &self.dst)
            .field("bytes", &self.bytes)
            .field("unit", &self.unit)
            .finish_non_exhaustive()
    }
}

/// What an upload did.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct UploadStats {
    pub bytes: usize,
    pub pieces: usize,
    pub lanes: usize,
    pub seconds: f64,
}

/// Threads (each with its own stream and two staging buffers) an upload uses: one per core, up
/// to 16. On the H100 host, page cache → pinned → GPU measured 6.6, 20 and 36 GB/s with 1, 4
/// and 16 threads (GPU.md): the copy out of the page cache, not the link, is what limits it.
pub fn lanes() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().clamp(2, 16))
}

/// A job's piece: `(job, byte offset, bytes)`.
pub type Piece = (usize, usize, usize);

/// The jobs (given by `(bytes, unit)`) cut into pieces of at most `staging` bytes, each
/// starting and ending on a multiple of its job's unit, in job order.
///
/// A unit of 0 counts as 1; a unit larger than `staging` is an error (its rows could not be
/// staged whole).
pub fn pieces(jobs: &[(usize, usize)], staging: usize) -> Result<Vec<Piece>, CudaError> {
    let mut out = Vec::new();
    for (j, &(bytes, unit)) in jobs.iter().enumerate() {
        let unit = unit.max(1);
        if unit > staging {
            return Err(CudaError::Driver(format!(
                "upload job {j}: rows of {unit} bytes do not fit a {staging}-byte staging buffer"
            )));
        }
        let step = staging / unit * unit;
        let mut at = 0;
        while at < bytes {
            let n = step.min(bytes - at);
            out.push((j, at, n));
            at += n;
        }
    }
    Ok(out)
}

/// A page-locked host buffer and the event of the last copy out of it.
struct Staging {
    ptr: *mut u8,
    len: usize,
    copied: CudaEvent,
}

// SAFETY: the buffer is owned by one lane thread at a time; the pointer is only dereferenced
// there.
unsafe impl Send for Staging {}

impl Staging {
    fn new(ctx: &Arc<CudaContext>, len: usize) -> Result<Self, CudaError> {
        let copied = ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC))?;
        ctx.bind_to_thread()?;
        // SAFETY: a plain host allocation; freed in `drop`.
        let ptr = unsafe { result::malloc_host(len, sys::CU_MEMHOSTALLOC_WRITECOMBINED) }?;
        Ok(Self {
            ptr: ptr.cast(),
            len,
            copied,
        })
    }

    /// The buffer, once its previous copy has been read out by the device.
    fn wait_free(&mut self) -> Result<&mut [u8], CudaError> {
        self.copied.synchronize()?;
        // SAFETY: `len` bytes were allocated at `ptr`, and no copy reads them any more.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        // A copy may still read the buffer: let it finish first. Errors here have nowhere to
        // go (the upload has already failed or synchronized).
        let _ = self.copied.synchronize();
        // SAFETY: `ptr` came from `malloc_host` and is freed once.
        let _ = unsafe { result::free_host(self.ptr.cast()) };
    }
}

impl Gpu {
    /// Fills every job's device region: [`lanes`] threads take the pieces in order, each
    /// waiting for its staging buffer's previous copy, filling it and queueing the copy on its
    /// own stream. Returns when every copy has landed.
    ///
    /// # Safety
    /// Each job's `dst` must address `bytes` bytes of device memory of this GPU, allocated
    /// and alive until this returns, and no two jobs may overlap.
    pub unsafe fn upload_jobs(&self, jobs: &[UploadJob<'_>]) -> Result<UploadStats, CudaError> {
        let start = Instant::now();
        let plan = pieces(
            &jobs.iter().map(|j| (j.bytes, j.unit)).collect::<Vec<_>>(),
            STAGING_BYTES,
        )?;
        let bytes = jobs.iter().map(|j| j.bytes).sum();
        // The destinations were allocated (and zeroed) on the main stream; the lanes' copies
        // must not race with those memsets.
        self.synchronize()?;
        let lanes = lanes().min(plan.len()).max(1);
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let first_error = Mutex::new(None);
        let ctx = self.context();
        std::thread::scope(|s| {
            for _ in 0..lanes {
                s.spawn(|| {
                    let run = || -> Result<(), CudaError> {
                        ctx.bind_to_thread()?;
                        let stream = ctx.new_stream()?;
                        let mut staging = [
                            Staging::new(ctx, STAGING_BYTES)?,
                            Staging::new(ctx, STAGING_BYTES)?,
                        ];
                        let mut turn = 0;
                        while !failed.load(Ordering::Relaxed) {
                            let Some(&(j, offset, n)) =
                                plan.get(next.fetch_add(1, Ordering::Relaxed))
                            else {
                                break;
                            };
                            let buf = &mut staging[turn];
                            turn ^= 1;
                            let host = &mut buf.wait_free()?[..n];
                            (jobs[j].fill)(offset, host);
                            // SAFETY: the destination is inside job j's region (the caller's
                            // contract); `host` stays allocated and unwritten until `copied`
                            // has passed this copy.
                            unsafe {
                                result::memcpy_htod_async(
                                    jobs[j].dst.0 + offset as u64,
                                    host,
                                    stream.cu_stream(),
                                )
                            }?;
                            buf.copied.record(&stream)?;
                        }
                        stream.synchronize()?;
                        Ok(())
                    };
                    if let Err(e) = run() {
                        failed.store(true, Ordering::Relaxed);
                        if let Ok(mut slot) = first_error.lock() {
                            slot.get_or_insert(e);
                        }
                    }
                });
            }
        });
        if let Some(e) = first_error.into_inner().ok().flatten() {
            return Err(e);
        }
        Ok(UploadStats {
            bytes,
            pieces: plan.len(),
            lanes,
            seconds: start.elapsed().as_secs_f64(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_each_job_in_whole_units() {
        let jobs = [(100, 10), (7, 0), (0, 4), (64, 16)];
        let p = pieces(&jobs, 32).expect("pieces");
        assert_eq!(
            p,
            vec![
                (0, 0, 30),
                (0, 30, 30),
                (0, 60, 30),
                (0, 90, 10),
                (1, 0, 7),
                (3, 0, 32),
                (3, 32, 32),
            ]
        );
        for (j, &(bytes, unit)) in jobs.iter().enumerate() {
            let mine: Vec<_> = p.iter().filter(|x| x.0 == j).collect();
            let mut at = 0;
            for &&(_, offset, n) in &mine {
                assert_eq!(offset, at, "job {j}: pieces in order, no gap");
                assert!(n <= 32 && offset % unit.max(1) == 0);
                at += n;
            }
            assert_eq!(at, bytes, "job {j} covered");
        }
        let e = pieces(&[(64, 40)], 32).expect_err("a row larger than the staging buffer");
        assert!(e.to_string().contains("40 bytes"), "{e}");
    }
}
