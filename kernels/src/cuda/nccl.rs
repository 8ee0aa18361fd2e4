//! NCCL, loaded by its real soname, with communicators that never hang.
//!
//! cudarc's NCCL loader asks for `libnccl.so`, `libnccl.so.13`, `.12`, … but never for
//! `libnccl.so.2`, the only name the `libnccl2` package and the NCCL wheels ship, so a host
//! where NCCL is installed correctly looks as if it had none. This module opens NCCL itself
//! (the names of [`super::libs`]) and binds the few entry points a tensor-parallel forward
//! uses; nothing of cudarc's NCCL layer is used.
//!
//! NCCL spins for ever when a peer dies, inside the init and inside a collective. So every
//! communicator here is **non-blocking** (`ncclConfig_t.blocking = 0`): calls return at once,
//! [`Comm::wait`] polls `ncclCommGetAsyncError` up to a deadline, and [`Comm::abort`] (safe to
//! call from another thread: the watchdog's) tears it down without waiting for the peers. A
//! communicator is aborted rather than destroyed when dropped: destroying one waits for the
//! peers, which at shutdown may be gone.

use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::ops::Dtype;
use super::{CudaError, DevPtr};

/// `ncclUniqueId`: what rank 0 makes and every rank passes to the init.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [u8; 128]);

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

impl UniqueId {
    /// The id from its 128 bytes (as carried to the other ranks).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, CudaError> {
        let arr: [u8; 128] = bytes.try_into().map_err(|_| {
            CudaError::Nccl(format!("an NCCL id is 128 bytes, not {}", bytes.len()))
        })?;
        Ok(Self(arr))
    }
}

/// `ncclConfig_t` as NCCL 2.17 defined it; later releases read a config by its `size` and
/// `version`, so this older layout stays valid.
#[repr(C)]
struct Config {
    size: usize,
    magic: u32,
    version: u32,
    blocking: c_int,
    cga_cluster_size: c_int,
    min_ctas: c_int,
    max_ctas: c_int,
    net_name: *const c_char,
    split_share: c_int,
}

const UNDEF_INT: c_int = c_int::MIN;

impl Config {
    /// `NCCL_CONFIG_INITIALIZER` with `blocking = 0`.
    fn non_blocking() -> Self {
        Self {
            size: std::mem::size_of::<Self>(),
            magic: 0xcafe_beef,
            version: 21700,
            blocking: 0,
            cga_cluster_size: UNDEF_INT,
            min_ctas: UNDEF_INT,
            max_ctas: UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: UNDEF_INT,
        }
    }
}

type RawComm = *mut c_void;
/// `ncclResult_t`: 0 success, 7 in progress.
type Res = c_int;
const SUCCESS: Res = 0;
const IN_PROGRESS: Res = 7;
/// `ncclDataType_t` values.
const FLOAT16: c_int = 6;
const FLOAT32: c_int = 7;
const BFLOAT16: c_int = 9;
const SUM: c_int = 0;

/// The entry points used, resolved once.
struct Api {
    soname: &'static str,
    version: c_int,
    get_unique_id: unsafe extern "C" fn(*mut UniqueId) -> Res,
    init_rank_config:
        unsafe extern "C" fn(*mut RawComm, c_int, UniqueId, c_int, *mut Config) -> Res,
    async_error: unsafe extern "C" fn(RawComm, *mut Res) -> Res,
    abort: unsafe extern "C" fn(RawComm) -> Res,
    all_reduce: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        c_int,
        c_int,
        RawComm,
        *mut c_void,
    ) -> Res,
    all_gather:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, RawComm, *mut c_void) -> Res,
    error_string: unsafe extern "C" fn(Res) -> *const c_char,
    /// Kept open for as long as the process runs (the functions above point into it).
    _lib: libloading::Library,
}

/// NCCL's entry points, or why they could not be had (asked once per process).
fn api() -> Result<&'static Api, CudaError> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(load)
        .as_ref()
        .map_err(|e| CudaError::Nccl(e.clone()))
}

fn load() -> Result<Api, String> {
    let names = super::libs::NCCL;
    // SAFETY: opening NCCL runs only its initializers.
    let (soname, lib) = names
        .iter()
        .find_map(|n| {
            unsafe { libloading::Library::new(*n) }
                .ok()
                .map(|l| (*n, l))
        })
        .ok_or_else(|| {
            format!(
                "NCCL is not installed: none of {} loads (install the libnccl2 package or the \
                 nvidia-nccl-cu13 wheel and put its lib directory on LD_LIBRARY_PATH, or run \
                 the ranks with --collective host)",
                names.join(", ")
            )
        })?;
    let sym = |name: &str| format!("{soname} has no {name}: NCCL 2.17 or newer is needed");
    // SAFETY: each symbol is looked up with the C signature of its declaration in nccl.h
    // (NCCL ≥ 2.17); the library outlives the pointers (both are kept in `Api`).
    unsafe {
        macro_rules! get {
            ($name:literal) => {
                *lib.get(concat!($name, "\0").as_bytes())
                    .map_err(|_| sym($name))?
            };
        }
        let get_version: unsafe extern "C" fn(*mut c_int) -> Res = get!("ncclGetVersion");
        let mut version = 0;
        get_version(&mut version);
        Ok(Api {
            soname,
            version,
            get_unique_id: get!("ncclGetUniqueId"),
            init_rank_config: get!("ncclCommInitRankConfig"),
            async_error: get!("ncclCommGetAsyncError"),
            abort: get!("ncclCommAbort"),
            all_reduce: get!("ncclAllReduce"),
            all_gather: get!("ncclAllGather"),
            error_string: get!("ncclGetErrorString"),
            _lib: lib,
        })
    }
}

/// Which NCCL loaded and its version (`major.minor.patch`), or why none did.
pub fn version() -> Result<(&'static str, String), CudaError> {
    let a = api()?;
    let v = a.version;
    Ok((
        a.soname,
        format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100),
    ))
}

/// A fresh id for a communicator (rank 0 makes it; the others receive it).
pub fn unique_id() -> Result<UniqueId, CudaError> {
    let a = api()?;
    let mut id = UniqueId([0; 128]);
    // SAFETY: `id` is an `ncclUniqueId` NCCL fills.
    check(a, unsafe { (a.get_unique_id)(&mut id) }, "ncclGetUniqueId")?;
    Ok(id)
}

fn check(a: &Api, r: Res, call: &str) -> Result<(), CudaError> {
    if r == SUCCESS || r == IN_PROGRESS {
        return Ok(());
    }
    // SAFETY: NCCL returns a static string for every result code.
    let why = unsafe { CStr::from_ptr((a.error_string)(r)) };
    Err(CudaError::Nccl(format!(
        "{call}: {}",
        why.to_string_lossy()
    )))
}

/// One rank's non-blocking communicator.
pub struct Comm {
    api: &'static Api,
    raw: RawComm,
    rank: usize,
    world: usize,
    /// How long a call may stay in progress (the pool's collective timeout).
    timeout: Duration,
    /// Whether it was aborted; held while NCCL is asked about it or aborts it, so the
    /// watchdog's thread never asks after the communicator is gone.
    aborted: Arc<Mutex<bool>>,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; `Comm` is
// owned by one runner, and the only call made from elsewhere (abort, by `AbortHandle`) is the
// one NCCL documents as safe to make concurrently.
#[allow(unsafe_code)]
unsafe impl Send for Comm {}

impl std::fmt::Debug for Comm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "nccl::Comm(rank {} of {})", self.rank, self.world)
    }
}

impl Comm {
    /// Joins the communicator `id` as `rank` of `world` on the calling thread's current
    /// device (bind the context first). Fails, and aborts what was begun, when the other
    /// ranks have not all joined within `deadline`; later calls may stay in progress for
    /// `timeout` at most.
    pub fn init(
        id: &UniqueId,
        rank: usize,
        world: usize,
        deadline: Duration,
        timeout: Duration,
    ) -> Result<Self, CudaError> {
        let a = api()?;
        let mut raw: RawComm = std::ptr::null_mut();
        let mut config = Config::non_blocking();
        // SAFETY: `raw` and `config` outlive the call; with `blocking = 0` NCCL returns at
        // once and completes the init in the background.
        let r = unsafe {
            (a.init_rank_config)(&mut raw, world as c_int, *id, rank as c_int, &mut config)
        };
        check(a, r, "ncclCommInitRankConfig")?;
        let comm = Self {
            api: a,
            raw,
            rank,
            world,
            timeout,
            aborted: Arc::default(),
        };
        comm.wait_or(deadline, || {
            format!(
                "rank {rank} of {world}: the NCCL communicator did not form within \
                 {deadline:?} (a rank never joined)"
            )
        })?;
        Ok(comm)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn world(&self) -> usize {
        self.world
    }

    /// The communicator's state: `Ok(true)` when idle, `Ok(false)` while an operation is
    /// still being enqueued, `Err` once it failed (a peer gone, a network error).
    pub fn poll(&self) -> Result<bool, CudaError> {
        self.abort_handle().state()
    }

    /// Waits until the last call has been taken in (a non-blocking call may return before),
    /// or fails after `deadline`.
    pub fn wait(&self, deadline: Duration) -> Result<(), CudaError> {
        self.wait_or(deadline, || {
            format!(
                "rank {} of {}: an NCCL call did not complete within {deadline:?}",
                self.rank, self.world
            )
        })
    }

    /// [`Self::wait`], failing with `late()` (after aborting) past `deadline`.
    fn wait_or(&self, deadline: Duration, late: impl FnOnce() -> String) -> Result<(), CudaError> {
        let start = Instant::now();
        while !self.poll()? {
            if start.elapsed() > deadline {
                self.abort();
                return Err(CudaError::Nccl(late()));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        Ok(())
    }

    /// A handle that aborts this communicator from another thread (the watchdog's).
    pub fn abort_handle(&self) -> AbortHandle {
        AbortHandle {
            api: self.api,
            raw: self.raw as usize,
            aborted: self.aborted.clone(),
        }
    }

    fn abort(&self) {
        self.abort_handle().abort();
    }

    /// Queues the in-place sum of `count` elements of `dtype` at `buf` over every rank on
    /// `stream` (captured into a graph when the stream is capturing).
    ///
    /// # Safety
    /// `buf` addresses `count` elements on this communicator's device, alive until the
    /// queued work has run; every rank makes the same call in the same order.
    #[allow(unsafe_code)]
    pub unsafe fn all_reduce_sum(
        &self,
        dtype: Dtype,
        buf: DevPtr,
        count: usize,
        stream: &cudarc::driver::CudaStream,
    ) -> Result<(), CudaError> {
        let ty = match dtype {
            Dtype::F16 => FLOAT16,
            Dtype::Bf16 => BFLOAT16,
        };
        let p = buf.0 as *mut c_void;
        let s = stream.cu_stream() as *mut c_void;
        // SAFETY: the caller's contract; in place (send = receive) is allowed by NCCL.
        let r = unsafe { (self.api.all_reduce)(p, p, count, ty, SUM, self.raw, s) };
        self.taken(r, "ncclAllReduce")
    }

    /// A call's result: an error, or (still in progress, as a non-blocking call may be)
    /// waited for until NCCL has taken it in, as it must be before the next call.
    fn taken(&self, r: Res, call: &str) -> Result<(), CudaError> {
        check(self.api, r, call)?;
        if r == IN_PROGRESS {
            self.wait(self.timeout)?;
        }
        Ok(())
    }

    /// Queues the gather of every rank's `count` f32 at `send` into `recv` (`world × count`,
    /// rank order) on `stream`.
    ///
    /// # Safety
    /// As [`Self::all_reduce_sum`], with `recv` of `world × count` f32.
    #[allow(unsafe_code)]
    pub unsafe fn all_gather_f32(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        stream: &cudarc::driver::CudaStream,
    ) -> Result<(), CudaError> {
        let s = stream.cu_stream() as *mut c_void;
        // SAFETY: the caller's contract.
        let r = unsafe {
            (self.api.all_gather)(
                send.0 as *const c_void,
                recv.0 as *mut c_void,
                count,
                FLOAT32,
                self.raw,
                s,
            )
        };
        self.taken(r, "ncclAllGather")
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        self.abort();
    }
}

/// Asks after and aborts a communicator from any thread (the watchdog's).
#[derive(Clone)]
pub struct AbortHandle {
    api: &'static Api,
    raw: usize,
    aborted: Arc<Mutex<bool>>,
}

impl std::fmt::Debug for AbortHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("nccl::AbortHandle")
    }
}

impl AbortHandle {
    /// `Ok(true)` when idle, `Ok(false)` while a call is still being taken in, `Err` once
    /// the communicator failed or was aborted.
    pub fn state(&self) -> Result<bool, CudaError> {
        let aborted = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        if *aborted {
            return Err(CudaError::Nccl("the communicator was aborted".into()));
        }
        let mut state: Res = SUCCESS;
        // SAFETY: not aborted (checked under the lock abort takes), so the communicator is
        // live; `state` outlives the call.
        let r = unsafe { (self.api.async_error)(self.raw as RawComm, &mut state) };
        check(self.api, r, "ncclCommGetAsyncError")?;
        check(self.api, state, "NCCL")?;
        Ok(state == SUCCESS)
    }

    /// The communicator's error, if it has one (a peer gone, a network error).
    pub fn error(&self) -> Option<String> {
        self.state().err().map(|e| e.to_string())
    }

    /// Aborts the communicator (the first call only): its pending operations end with an
    /// error instead of spinning on a peer that is gone.
    pub fn abort(&self) {
        let mut aborted = self.aborted.lock().unwrap_or_else(|p| p.into_inner());
        if !*aborted {
            *aborted = true;
            // SAFETY: the communicator is live until this first abort, which NCCL allows
            // while another thread is inside a call on it.
            unsafe { (self.api.abort)(self.raw as RawComm) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The config NCCL reads by size and version: the 2.17 layout, 48 bytes on 64-bit hosts.
    #[test]
    fn the_config_has_nccl_2_17s_layout() {
        let c = Config::non_blocking();
        assert_eq!(c.size, 48);
        assert_eq!((c.magic, c.version, c.blocking), (0xcafe_beef, 21700, 0));
        assert_eq!(std::mem::size_of::<UniqueId>(), 128);
    }

    /// Where NCCL is absent (this development machine, CI) every entry point says so,
    /// naming the sonames tried, instead of panicking as cudarc's loader does.
    #[test]
    fn a_missing_nccl_is_a_clear_error() {
        if std::env::var_os("FERRITE_REQUIRE_CUDA").is_some() {
            return;
        }
        let Err(e) = version() else {
            return; // NCCL is installed here: nothing to check.
        };
        let msg = e.to_string();
        assert!(msg.contains("libnccl.so.2"), "{msg}");
        assert!(msg.contains("--collective host"), "{msg}");
        let e = unique_id().expect_err("no NCCL");
        assert!(e.to_string().contains("NCCL is not installed"), "{e}");
        let s = Duration::from_secs(1);
        let e = Comm::init(&UniqueId([0; 128]), 0, 1, s, s).expect_err("none");
        assert!(e.to_string().contains("NCCL is not installed"), "{e}");
        assert!(UniqueId::from_bytes(&[0; 12]).is_err());
    }
}
