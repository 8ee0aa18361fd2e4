//! Passive health of a pool, as this gateway's calls to it went: a pool whose calls fail before
//! their first token several times in a row (it answers UNAVAILABLE, its connection dies, it
//! sends no first token in time) is set aside for a while, doubling while it keeps failing, so
//! new requests stop paying for a stalled or broken pool before placement drops it. A pool set
//! aside is still used when no other pool of the model is left; a call that gets its first
//! token clears the record.
//!
//! A full queue (RESOURCE_EXHAUSTED) is not a failure here: the pool is busy, not broken.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Failures in a row after which a pool is set aside.
pub const FAILURES_TO_EJECT: u32 = 2;
/// How long the first setting-aside lasts; each further failure doubles it, up to the last.
const EJECT_FIRST: Duration = Duration::from_secs(1);
const EJECT_LAST: Duration = Duration::from_secs(30);

#[derive(Debug, Default)]
struct State {
    failures_in_a_row: u32,
    ejected_until: Option<Instant>,
}

/// One pool's record. Shared by every clone of the pool's entry.
#[derive(Debug, Default)]
pub struct PoolHealth {
    // A std mutex: held for a comparison or two, never across an await.
    state: Mutex<State>,
}

impl PoolHealth {
    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the pool is set aside at `now`.
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.lock().ejected_until.is_some_and(|t| now < t)
    }

    /// A call got its first token: the pool is well.
    pub fn succeeded(&self) {
        *self.lock() = State::default();
    }

    /// A call failed before its first token at `now`. Returns whether this failure set the
    /// pool aside (or further aside).
    pub fn failed(&self, now: Instant) -> bool {
        let mut st = self.lock();
        st.failures_in_a_row = st.failures_in_a_row.saturating_add(1);
        let over = st.failures_in_a_row.checked_sub(FAILURES_TO_EJECT);
        let Some(extra) = over else {
            return false;
        };
        let backoff = EJECT_FIRST
            .saturating_mul(1u32 << extra.min(16))
            .min(EJECT_LAST);
        st.ejected_until = Some(now + backoff);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failures_in_a_row_set_a_pool_aside_for_longer_each_time_and_a_token_clears_it() {
        let h = PoolHealth::default();
        let t0 = Instant::now();
        assert!(!h.failed(t0), "one failure is not a pattern");
        assert!(!h.is_ejected(t0));
        assert!(h.failed(t0));
        assert!(h.is_ejected(t0 + Duration::from_millis(999)));
        assert!(!h.is_ejected(t0 + EJECT_FIRST));
        assert!(h.failed(t0));
        assert!(h.is_ejected(t0 + Duration::from_millis(1999)), "doubled");
        for _ in 0..40 {
            h.failed(t0);
        }
        assert!(h.is_ejected(t0 + EJECT_LAST - Duration::from_millis(1)));
        assert!(!h.is_ejected(t0 + EJECT_LAST), "capped");
        h.succeeded();
        assert!(!h.is_ejected(t0));
        assert!(!h.failed(t0), "the count starts again");
    }
}
