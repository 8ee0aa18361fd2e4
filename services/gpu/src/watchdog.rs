//! The watchdog of a rank's NCCL steps. NCCL spins for ever when a peer dies: the step's
//! kernels wait on the peer, and the host waits on the step. A thread beside the runner
//! watches each step that runs NCCL collectives: when the communicator reports an error, or
//! the step has not completed within the collective timeout, it aborts the communicator, which
//! ends the spinning kernels, and the step fails with why ([`Watchdog::finish`]). Under async
//! scheduling two steps may be in flight: the older one is the one timed.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How often the thread looks.
const TICK: Duration = Duration::from_millis(10);

#[derive(Default)]
struct State {
    /// When each step in flight began, oldest first.
    since: Mutex<VecDeque<Instant>>,
    /// Why the communicator was aborted, once it was.
    tripped: Mutex<Option<String>>,
    stop: AtomicBool,
}

/// What the watchdog needs of a communicator: its asynchronous error, and an abort.
pub(crate) trait Watched: Send + 'static {
    fn error(&self) -> Option<String>;
    fn abort(&self);
}

impl Watched for ferrite_kernels::cuda::nccl::AbortHandle {
    fn error(&self) -> Option<String> {
        ferrite_kernels::cuda::nccl::AbortHandle::error(self)
    }
    fn abort(&self) {
        ferrite_kernels::cuda::nccl::AbortHandle::abort(self)
    }
}

pub(crate) struct Watchdog {
    state: Arc<State>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Starts watching `comm`'s steps: each may take `timeout` at most.
    pub(crate) fn start(comm: impl Watched, timeout: Duration) -> Self {
        let state = Arc::new(State::default());
        let watched = state.clone();
        let thread = std::thread::Builder::new()
            .name("nccl-watchdog".into())
            .spawn(move || watch(&watched, &comm, timeout))
            .ok();
        Self { state, thread }
    }

    /// A step begins.
    pub(crate) fn begin(&self) {
        if let Ok(mut s) = self.state.since.lock() {
            s.push_back(Instant::now());
        }
    }

    /// The step begun last was never queued (its launch failed).
    pub(crate) fn cancel(&self) {
        if let Ok(mut s) = self.state.since.lock() {
            s.pop_back();
        }
    }

    /// The oldest step in flight has completed (or failed): `Err` with why when the watchdog
    /// aborted it.
    pub(crate) fn finish(&self) -> Result<(), String> {
        if let Ok(mut s) = self.state.since.lock() {
            s.pop_front();
        }
        self.tripped()
    }

    /// Why the watchdog aborted the communicator, if it did.
    pub(crate) fn tripped(&self) -> Result<(), String> {
        match self.state.tripped.lock() {
            Ok(t) => t.clone().map_or(Ok(()), Err),
            Err(_) => Err("the NCCL watchdog failed".into()),
        }
    }
}

fn watch(state: &State, comm: &dyn Watched, timeout: Duration) {
    while !state.stop.load(Ordering::Acquire) {
        std::thread::sleep(TICK);
        let stalled = match state.since.lock() {
            Ok(s) => s.front().is_some_and(|t| t.elapsed() > timeout),
            Err(_) => true,
        };
        let why = match comm.error() {
            Some(e) => format!("NCCL reported an error ({e})"),
            None if stalled => format!(
                "a step's NCCL collectives made no progress within {timeout:?} (a rank is gone \
                 or stalled)"
            ),
            None => continue,
        };
        comm.abort();
        if let Ok(mut t) = state.tripped.lock() {
            *t = Some(format!("{why}; the communicator was aborted"));
        }
        return;
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.state.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A communicator whose peer never answers: no error of its own, aborted once.
    #[derive(Clone, Default)]
    struct Silent(Arc<AtomicBool>);

    impl Watched for Silent {
        fn error(&self) -> Option<String> {
            None
        }
        fn abort(&self) {
            assert!(!self.0.swap(true, Ordering::AcqRel), "aborted twice");
        }
    }

    #[test]
    fn a_step_past_the_timeout_is_aborted_within_it() {
        let comm = Silent::default();
        let dog = Watchdog::start(comm.clone(), Duration::from_millis(300));
        // A step that completes in time is not touched.
        dog.begin();
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(dog.finish(), Ok(()));
        // Idle time between steps does not count.
        std::thread::sleep(Duration::from_millis(400));
        assert!(!comm.0.load(Ordering::Acquire));
        let start = Instant::now();
        dog.begin();
        while !comm.0.load(Ordering::Acquire) {
            assert!(start.elapsed() < Duration::from_secs(2), "never aborted");
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(300),
            "aborted early: {took:?}"
        );
        let e = dog.finish().expect_err("the step was aborted");
        assert!(e.contains("no progress within 300ms"), "{e}");
    }

    /// Under async scheduling a step is launched before the one before it is waited for: the
    /// older step stays timed from its own start, not from the newer one's.
    #[test]
    fn with_two_steps_in_flight_the_older_one_is_timed() {
        let comm = Silent::default();
        let dog = Watchdog::start(comm.clone(), Duration::from_secs(1));
        let start = Instant::now();
        dog.begin();
        std::thread::sleep(Duration::from_millis(600));
        dog.begin();
        while !comm.0.load(Ordering::Acquire) {
            assert!(start.elapsed() < Duration::from_secs(3), "never aborted");
            std::thread::sleep(Duration::from_millis(5));
        }
        let took = start.elapsed();
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_millis(1500),
            "aborted {took:?} after the older step began (timeout 1 s, the newer began at 0.6 s)"
        );
        assert!(dog.finish().is_err() && dog.finish().is_err());
    }

    struct Failing(Arc<AtomicBool>);

    impl Watched for Failing {
        fn error(&self) -> Option<String> {
            Some("remote process exited".into())
        }
        fn abort(&self) {
            self.0.store(true, Ordering::Release);
        }
    }

    #[test]
    fn an_error_nccl_reports_aborts_at_once() {
        let aborted = Arc::new(AtomicBool::new(false));
        let dog = Watchdog::start(Failing(aborted.clone()), Duration::from_secs(60));
        std::thread::sleep(Duration::from_millis(100));
        assert!(aborted.load(Ordering::Acquire));
        let e = dog.finish().expect_err("tripped");
        assert!(e.contains("remote process exited"), "{e}");
    }
}
