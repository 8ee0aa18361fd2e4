//! `ferrite doctor`'s GPU all-reduce: NCCL on the local GPU, eager and inside a captured
//! CUDA graph (as the decode graphs hold it), checked bit for bit. One rank (world size 1):
//! NCCL refuses two ranks of a communicator on one device, and a pool over several GPUs
//! needs one process or thread per GPU, which this check does not start yet.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::{self, Gpu, nccl};

/// Elements all-reduced (2 MiB of f16).
const ELEMS: usize = 1 << 20;

/// What the check found: NCCL's version and the two all-reduces' results, or why it failed.
pub fn nccl_all_reduce() -> Result<String> {
    let (soname, version) = nccl::version()?;
    let (gpu, _) = Gpu::open(0, &cuda::default_cache_dir()).context("opening cuda:0")?;
    gpu.context().bind_to_thread()?;
    let wait = Duration::from_secs(20);
    let comm = nccl::Comm::init(&nccl::unique_id()?, 0, 1, wait, wait)?;
    // Values whose f16 bits differ along the buffer: a sum that moved or dropped any shows.
    let host: Vec<u16> = (0..ELEMS)
        .map(|i| Dtype::F16.bits_of((i % 2039) as f32 * 0.125 - 100.0))
        .collect();
    let buf = gpu.upload(&host)?;
    let ptr = gpu.ptr(&buf);
    // SAFETY: `buf` holds ELEMS f16 on this device and outlives the queued work (each check
    // downloads, which waits for the stream).
    #[allow(unsafe_code)]
    unsafe {
        comm.all_reduce_sum(Dtype::F16, ptr, ELEMS, gpu.stream())?;
    }
    if gpu.download(&buf, ELEMS)? != host {
        bail!("NCCL {version}: the eager all-reduce of one rank changed the buffer");
    }
    let s = gpu.stream();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
    // SAFETY: as above; recorded, then replayed below.
    #[allow(unsafe_code)]
    let recorded = unsafe { comm.all_reduce_sum(Dtype::F16, ptr, ELEMS, s) };
    let graph = s.end_capture(CUgraphInstantiate_flags(0))?;
    recorded?;
    let graph = graph.context("the capture recorded nothing")?;
    for _ in 0..3 {
        graph.launch()?;
    }
    if gpu.download(&buf, ELEMS)? != host {
        bail!("NCCL {version}: the all-reduce replayed from a CUDA graph changed the buffer");
    }
    // The graph goes before the communicator it captured.
    drop(graph);
    drop(comm);
    Ok(format!(
        "NCCL {version} ({soname}): 1 rank on {}, eager and in a CUDA graph, bit for bit",
        gpu.device
    ))
}
