//! Faults injected on purpose, to check how a pool fails: the fault tests and `ferrite bench
//! chaos` set `FERRITE_FAILPOINTS` on a worker they start. Read once, at the first check; with
//! the variable unset every check is one atomic load.
//!
//! `FERRITE_FAILPOINTS=engine.step.panic=N`: the engine panics at the process's Nth step
//! (from 1; a worker's warm-up takes the first two), as a bug under the forward would.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

/// The environment variable that arms failpoints.
pub const ENV: &str = "FERRITE_FAILPOINTS";

/// The step at which `engine.step.panic` fires, if armed.
fn panic_at_step() -> Option<u64> {
    static AT: OnceLock<Option<u64>> = OnceLock::new();
    *AT.get_or_init(|| parse(&std::env::var(ENV).ok()?))
}

/// The step number of `engine.step.panic=N` in a failpoint list (`name=value`, comma-separated).
fn parse(spec: &str) -> Option<u64> {
    spec.split(',')
        .filter_map(|item| item.trim().split_once('='))
        .find(|(name, _)| name.trim() == "engine.step.panic")
        .and_then(|(_, n)| n.trim().parse().ok())
}

/// Called at the top of every engine step: panics there when `engine.step.panic` says so.
pub fn engine_step() {
    static STEPS: AtomicU64 = AtomicU64::new(0);
    if let Some(at) = panic_at_step() {
        let step = STEPS.fetch_add(1, Ordering::Relaxed) + 1;
        assert!(step != at, "failpoint engine.step.panic={at} ({ENV})");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failpoint_list_names_the_step() {
        assert_eq!(parse("engine.step.panic=3"), Some(3));
        assert_eq!(parse("other=1, engine.step.panic = 12"), Some(12));
        assert_eq!(parse("engine.step.panic=x"), None);
        assert_eq!(parse(""), None);
    }
}
