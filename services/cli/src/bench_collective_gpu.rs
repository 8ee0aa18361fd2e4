//! `bench collective --backend host|nccl`: the GPU pools' all-reduce of 16-bit activations,
//! per message size. Each rank process opens a GPU (rank r on `cuda:(r mod GPUs)`, so ranks
//! share GPUs where there are fewer than ranks) and all-reduces a device buffer of f16:
//!
//! - `host`: device → host → the pool's TCP hub → device, as ranks sharing a GPU do
//!   (`--collective host`);
//! - `nccl`: NCCL on the device's stream (one GPU per rank; world size 1 on a one-GPU host).
//!
//! Values are small integers, so every sum is exact in f16 whatever order a backend adds in:
//! the first result of each size is checked bit for bit.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferrite_collective::Collective;
use ferrite_engine::gpu::host_all_reduce;
use ferrite_kernels::cuda::nccl::{self, UniqueId};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::{self, Gpu};

/// Rank `rank`'s element `i`: an integer in -32..32, different on every rank.
fn value(rank: usize, i: usize) -> f32 {
    ((rank * 7919 + i) % 64) as f32 - 32.0
}

/// One row per size: (bytes, seconds per all-reduce), after checking the first result.
pub fn rows(
    backend: &str,
    comm: &mut dyn Collective,
    sizes: &[usize],
    iters: usize,
    timeout: Duration,
) -> Result<Vec<(usize, f64)>> {
    let gpus = ferrite_kernels::device::cuda_devices().map_err(anyhow::Error::msg)?;
    if gpus.is_empty() {
        bail!("--backend {backend} needs a GPU, and this host has none");
    }
    let ordinal = comm.rank() % gpus.len();
    let (gpu, _) = Gpu::open(ordinal, &cuda::default_cache_dir()).context("opening the GPU")?;
    gpu.context().bind_to_thread()?;
    let nccl = match backend {
        "nccl" => Some(nccl_comm(comm, gpus.len(), timeout)?),
        _ => None,
    };
    let mut rows = Vec::new();
    for &bytes in sizes {
        let n = bytes / 2;
        let mine: Vec<u16> = (0..n)
            .map(|i| Dtype::F16.bits_of(value(comm.rank(), i)))
            .collect();
        let buf = gpu.upload(&mine)?;
        let ptr = gpu.ptr(&buf);
        // SAFETY: `buf` holds n f16 on this GPU and outlives every queued all-reduce (the
        // download and the synchronize below wait for them).
        #[allow(unsafe_code)]
        let reduce = |comm: &mut dyn Collective| -> Result<()> {
            unsafe {
                match &nccl {
                    Some(c) => c.all_reduce_sum(Dtype::F16, ptr, n, gpu.stream())?,
                    None => host_all_reduce(&gpu, Dtype::F16, ptr, n, comm)?,
                }
            }
            Ok(())
        };
        reduce(comm)?;
        check(&gpu, &buf, comm.rank(), comm.world(), n)?;
        reduce(comm)?;
        gpu.synchronize()?;
        comm.barrier()?;
        let started = Instant::now();
        for _ in 0..iters {
            reduce(comm)?;
        }
        gpu.synchronize()?;
        rows.push((bytes, started.elapsed().as_secs_f64() / iters.max(1) as f64));
    }
    Ok(rows)
}

/// The first all-reduce's result against the exact sum.
fn check(
    gpu: &Gpu,
    buf: &cudarc::driver::CudaSlice<u16>,
    rank: usize,
    world: usize,
    n: usize,
) -> Result<()> {
    let got = gpu.download(buf, n)?;
    let wrong = (0..n).find(|&i| {
        let sum: f32 = (0..world).map(|r| value(r, i)).sum();
        got[i] != Dtype::F16.bits_of(sum)
    });
    if let Some(i) = wrong {
        bail!("rank {rank}: the all-reduce of {n} f16 gave a wrong sum at element {i}");
    }
    Ok(())
}

/// This rank's NCCL communicator: rank 0's id sent over the bench's TCP pool.
fn nccl_comm(comm: &mut dyn Collective, gpus: usize, timeout: Duration) -> Result<nccl::Comm> {
    if comm.world() > gpus {
        bail!(
            "--backend nccl: {} ranks on {gpus} GPU(s), and NCCL refuses two ranks of one \
             communicator on the same GPU; use --backend host, or --tp {gpus} or fewer",
            comm.world()
        );
    }
    let mut id = match comm.rank() {
        0 => nccl::unique_id()?.0.to_vec(),
        _ => Vec::new(),
    };
    comm.broadcast(&mut id)?;
    let id = UniqueId::from_bytes(&id)?;
    Ok(nccl::Comm::init(
        &id,
        comm.rank(),
        comm.world(),
        timeout,
        timeout,
    )?)
}
