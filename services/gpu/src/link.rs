//! How one rank's GPU forward meets the other ranks' (what each rank holds: [`ferrite_model::tp`]).
//!
//! A step needs two all-reduces per layer (the attention output and MLP down projections'
//! partial sums) and one all-gather (the LM head's vocabulary parts). Two ways to do them:
//!
//! - **NCCL**, on the runner's stream: nothing leaves the device, and the collectives are
//!   captured into the decode graphs like any kernel. NCCL refuses two ranks of one
//!   communicator on one device.
//! - **Host**: each collective waits for the stream, copies the buffer to the host, meets the
//!   other ranks through the pool's own collective (the TCP hub the plans travel on), and
//!   copies the result back. Slow and eager only (a graph cannot wait on a socket), but it
//!   lets N ranks share one GPU: how a sharded GPU forward is checked on a one-GPU host.
//!
//! Which one a pool uses is decided once, at start-up, from `--collective` and where its ranks
//! run ([`choose`]).

use ferrite_collective::{Collective, CollectiveError};
use ferrite_kernels::cuda::gemm::{Linear, OutType};
use ferrite_kernels::cuda::nccl::{self, UniqueId};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::{DevPtr, Gpu};
use ferrite_model::error::{ModelError, Result};
use ferrite_model::tp::TpRank;

use super::GpuRunner;
use crate::GpuOptions;
use crate::tensor::gpu_error;
use crate::watchdog::Watchdog;

/// `--collective`: how the ranks of a pool exchange activations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum CollectiveKind {
    /// NCCL when every rank has a GPU of its own, host when ranks share one, TCP on the CPU.
    #[default]
    Auto,
    Nccl,
    Host,
    /// The CPU forward's (the only one it has); on a GPU, the same as `Host`.
    Tcp,
}

/// The link a runner's collectives go through.
pub(crate) enum Link {
    /// Through the host and the pool's collective (a pool of one: nothing to do).
    Host,
    /// NCCL, with the watchdog of its steps (which goes first: it holds the communicator).
    Nccl {
        watchdog: Watchdog,
        comm: nccl::Comm,
    },
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Host => f.write_str("host"),
            Self::Nccl { comm, .. } => write!(f, "{comm:?}"),
        }
    }
}

/// The link `kind` asks for, given every rank's device (`devices[r]`: a stable name of rank
/// r's GPU, the same string where two ranks share one). A configuration NCCL would refuse
/// gets its error here, before NCCL is asked.
pub(crate) fn choose(kind: CollectiveKind, devices: &[String]) -> Result<CollectiveKind> {
    let shared = (1..devices.len()).any(|i| devices[..i].contains(&devices[i]));
    match kind {
        CollectiveKind::Nccl if shared => Err(ModelError::BadConfig(format!(
            "--collective nccl: NCCL refuses two ranks of one pool on the same GPU, and these \
             ranks' devices are {devices:?}; give each rank its own GPU (--devices) or use \
             --collective host"
        ))),
        CollectiveKind::Nccl => Ok(CollectiveKind::Nccl),
        CollectiveKind::Auto if !shared && devices.len() > 1 => Ok(CollectiveKind::Nccl),
        _ => Ok(CollectiveKind::Host),
    }
}

/// Opens this rank's link as `opts.collective` asks, given where the pool's ranks run: for
/// NCCL, rank 0 makes the communicator's id and sends it to the others over the pool's
/// collective, and every rank joins within the start-up timeout (the `comm_init` phase).
/// Also returns how many of the pool's ranks share this rank's GPU (1: it has its own).
pub(crate) fn open(
    opts: &GpuOptions,
    gpu: &Gpu,
    comm: &mut dyn Collective,
) -> Result<(Link, usize)> {
    let devices = rank_devices(gpu, comm)?;
    let mine = &devices[comm.rank()];
    let sharing = devices.iter().filter(|d| *d == mine).count();
    if choose(opts.collective, &devices)? != CollectiveKind::Nccl {
        return Ok((Link::Host, sharing));
    }
    let (rank, world) = (comm.rank(), comm.world());
    let span = tracing::info_span!(target: ferrite_model::STARTUP_TARGET, "comm_init",
        backend = "nccl", rank = rank as i64, world = world as i64, nccl = tracing::field::Empty);
    let _e = span.enter();
    let (soname, version) = nccl::version().map_err(gpu_error)?;
    span.record("nccl", format!("{version} ({soname})").as_str());
    let mut id = if rank == 0 {
        nccl::unique_id().map_err(gpu_error)?.0.to_vec()
    } else {
        Vec::new()
    };
    comm.broadcast(&mut id)?;
    let id = UniqueId::from_bytes(&id).map_err(gpu_error)?;
    gpu.context()
        .bind_to_thread()
        .map_err(|e| gpu_error(e.into()))?;
    let (init, call) = (opts.comm_init_timeout, opts.collective_timeout);
    let comm = nccl::Comm::init(&id, rank, world, init, call).map_err(gpu_error)?;
    let watchdog = Watchdog::start(comm.abort_handle(), call);
    Ok((Link::Nccl { watchdog, comm }, sharing))
}

/// Every rank's GPU by its UUID (the same string where two ranks share one), exchanged over
/// the pool's collective as 16-bit pieces (exact in f32).
fn rank_devices(gpu: &Gpu, comm: &mut dyn Collective) -> Result<Vec<String>> {
    let uuid = gpu.context().uuid().map_err(|e| gpu_error(e.into()))?;
    let bytes: Vec<u8> = uuid.bytes.iter().map(|&b| b as u8).collect();
    if comm.world() == 1 {
        return Ok(vec![hex(&bytes)]);
    }
    let mine: Vec<f32> = bytes
        .chunks_exact(2)
        .map(|p| u16::from_le_bytes([p[0], p[1]]) as f32)
        .collect();
    let mut all = vec![0f32; mine.len() * comm.world()];
    comm.all_gather(&mine, &mut all)?;
    Ok(all
        .chunks_exact(mine.len())
        .map(|r| {
            let b: Vec<u8> = r.iter().flat_map(|&v| (v as u16).to_le_bytes()).collect();
            hex(&b)
        })
        .collect())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Sums `len` elements of `dtype` at `buf` over the ranks through the host: the partial sums
/// meet in f32 (added in rank order by the pool's collective) and are rounded once.
///
/// # Safety
/// `buf` addresses `len` elements on `gpu`.
#[allow(unsafe_code)]
pub unsafe fn host_all_reduce(
    gpu: &Gpu,
    dtype: Dtype,
    buf: DevPtr,
    len: usize,
    comm: &mut dyn Collective,
) -> Result<()> {
    let mut bits = vec![0u16; len];
    // SAFETY: the caller's contract.
    unsafe { gpu.download_at(buf, &mut bits) }.map_err(gpu_error)?;
    let mut sum: Vec<f32> = bits.iter().map(|&b| dtype.value_of(b)).collect();
    comm.all_reduce_sum(&mut sum)?;
    for (b, v) in bits.iter_mut().zip(&sum) {
        *b = dtype.bits_of(*v);
    }
    // SAFETY: as above.
    unsafe { gpu.upload_at(buf, &bits) }.map_err(gpu_error)
}

impl GpuRunner {
    /// Runs `step` (a forward, to its last wait on the device) under the NCCL watchdog, when
    /// this rank has one: a step it aborted fails as a lost collective of the pool does.
    pub(super) fn watched<T>(&mut self, step: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        self.watch_begin();
        let done = step(self);
        self.watch_end(done)
    }

    /// Queues a step with `launch` under the watchdog, which watches it until
    /// [`Self::watch_end`] says it has completed (or here, at once, if it failed to queue).
    pub(super) fn watched_launch<T>(
        &mut self,
        launch: impl FnOnce(&mut Self) -> Result<T>,
    ) -> Result<T> {
        self.watch_begin();
        match launch(self) {
            Err(e) => self.watch_cancel(Err(e)),
            ok => ok,
        }
    }

    /// The step begun last failed to queue (`done`), or failed as the watchdog says where it
    /// aborted the communicator.
    fn watch_cancel<T>(&self, done: Result<T>) -> Result<T> {
        match &self.link {
            Link::Nccl { watchdog, .. } => {
                watchdog.cancel();
                match watchdog.tripped() {
                    Ok(()) => done,
                    Err(why) => Err(CollectiveError::Device(why).into()),
                }
            }
            Link::Host => done,
        }
    }

    /// A step begins (queued now, waited for later: [`Self::watch_end`]).
    fn watch_begin(&self) {
        if let Link::Nccl { watchdog, .. } = &self.link {
            watchdog.begin();
        }
    }

    /// The oldest step begun by [`Self::watch_begin`] has completed as `done` says, or failed
    /// as the watchdog says where it aborted it.
    pub(super) fn watch_end<T>(&self, done: Result<T>) -> Result<T> {
        match &self.link {
            Link::Nccl { watchdog, .. } => match watchdog.finish() {
                Ok(()) => done,
                Err(why) => Err(CollectiveError::Device(why).into()),
            },
            Link::Host => done,
        }
    }

    /// Sums `len` elements at `buf` (a row-parallel product's partial sums) over the pool.
    ///
    /// # Safety
    /// `buf` addresses `len` elements of the runner's dtype, alive until the step has run.
    #[allow(unsafe_code)]
    pub(super) unsafe fn all_reduce(
        &self,
        g: &Gpu,
        buf: DevPtr,
        len: usize,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe {
            match &self.link {
                Link::Nccl { comm, .. } => {
                    Ok(comm.all_reduce_sum(self.w.dtype, buf, len, g.stream())?)
                }
                Link::Host if self.w.tp.is_solo() => Ok(()),
                Link::Host => host_all_reduce(g, self.w.dtype, buf, len, comm),
            }
        }
    }

    /// The LM head over the `n` rows at `picked`, leaving `n` rows of f32 logits, the whole
    /// vocabulary wide, in `self.logits` (on every rank with NCCL, on rank 0 through the
    /// host): in a pool each rank computes its vocabulary part, and the parts are gathered.
    ///
    /// # Safety
    /// `picked` holds `n ≤ max_seqs` rows of `hidden_size`.
    #[allow(unsafe_code)]
    pub(super) unsafe fn lm_head(
        &self,
        g: &Gpu,
        picked: DevPtr,
        n: usize,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        let (w, c) = (&self.w, &self.w.cfg);
        let vocab = c.vocab_size;
        let (out, out_stride) = match &self.head_part {
            Some(b) => (b.ptr, vocab.div_ceil(w.tp.world)),
            None => (self.logits_ptr, vocab),
        };
        let head = Linear {
            m: n,
            n: w.head_rows,
            k: c.hidden_size,
            x_stride: c.hidden_size,
            out_stride,
        };
        // SAFETY: the caller's contract; `out` holds max_seqs rows of `out_stride`.
        unsafe {
            g.linear(w.dtype, OutType::F32, out, picked, w.lm_head(), head)?;
            if self.head_part.is_some() {
                self.gather_logits(g, out, n, comm)?;
            }
            if let Some(cap) = c.final_logit_softcap {
                g.soft_cap(self.logits_ptr, n * vocab, cap)?;
            }
        }
        Ok(())
    }

    /// Every rank's `n × ⌈vocab / world⌉` logits at `part` placed into `self.logits`.
    ///
    /// # Safety
    /// As [`Self::lm_head`].
    #[allow(unsafe_code)]
    unsafe fn gather_logits(
        &self,
        g: &Gpu,
        part: DevPtr,
        n: usize,
        comm: &mut dyn Collective,
    ) -> Result<()> {
        let (tp, vocab) = (self.w.tp, self.w.cfg.vocab_size);
        let each = vocab.div_ceil(tp.world);
        let f = std::mem::size_of::<f32>();
        // SAFETY: `part` holds n × each f32; `head_gathered` world × max_seqs × each;
        // `logits` max_seqs × vocab.
        unsafe {
            match (&self.link, &self.head_gathered) {
                (Link::Nccl { comm, .. }, Some(all)) => {
                    comm.all_gather_f32(part, all.ptr, n * each, g.stream())?;
                    for rank in 0..tp.world {
                        let cols = TpRank {
                            rank,
                            world: tp.world,
                        }
                        .vocab_part(vocab);
                        let src = all.ptr.offset::<f32>(rank * n * each);
                        let dst = self.logits_ptr.offset::<f32>(cols.start);
                        g.copy_rows(dst, vocab * f, src, each * f, cols.len() * f, n)?;
                    }
                }
                _ => {
                    let mut local = vec![0f32; n * each];
                    g.download_at(part, &mut local)?;
                    if let Some(rows) =
                        ferrite_model::tp::gather_logits(tp, vocab, &local, n, comm)?
                    {
                        g.upload_at(self.logits_ptr, &rows)?;
                    }
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_picks_nccl_only_for_ranks_on_their_own_gpus() {
        let d = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let auto = CollectiveKind::Auto;
        assert_eq!(
            choose(auto, &d(&["a", "b"])).expect("a link"),
            CollectiveKind::Nccl
        );
        assert_eq!(
            choose(auto, &d(&["a", "a", "b"])).expect("a link"),
            CollectiveKind::Host
        );
        // A pool of one needs no collective: NCCL only when asked for (to measure it).
        assert_eq!(
            choose(auto, &d(&["a"])).expect("a link"),
            CollectiveKind::Host
        );
        assert_eq!(
            choose(CollectiveKind::Nccl, &d(&["a"])).expect("a link"),
            CollectiveKind::Nccl
        );
        let e = choose(CollectiveKind::Nccl, &d(&["a", "a"])).expect_err("shared");
        assert!(e.to_string().contains("same GPU"), "{e}");
        assert_eq!(
            choose(CollectiveKind::Tcp, &d(&["a", "b"])).expect("a link"),
            CollectiveKind::Host
        );
    }
}
