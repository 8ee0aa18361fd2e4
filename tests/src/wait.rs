//! Waiting for a condition with a deadline, instead of sleeping a fixed time.

use std::future::Future;
use std::time::{Duration, Instant};

use anyhow::{Result, bail};

/// How often a condition is re-checked.
pub const POLL: Duration = Duration::from_millis(50);

/// Re-evaluates `check` every [`POLL`] until it returns `Ok`, and returns that value with the
/// time it took. `Err(state)` means "not yet" and says why; after `timeout` the error names
/// `what` and the last such state.
pub async fn until<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<(T, Duration)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let started = Instant::now();
    loop {
        let state = match check().await {
            Ok(v) => return Ok((v, started.elapsed())),
            Err(state) => state,
        };
        if started.elapsed() >= timeout {
            bail!("timed out after {timeout:?} waiting for {what}; last state: {state}");
        }
        tokio::time::sleep(POLL).await;
    }
}
