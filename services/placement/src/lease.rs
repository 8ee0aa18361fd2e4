//! Leases, as both placement backends grant them: ids, and TTLs in whole seconds.

use std::time::Duration;

/// An etcd lease id (the embedded store hands out ids the same way).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LeaseId(pub i64);

impl std::fmt::Display for LeaseId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:#x}", self.0)
    }
}

/// Lease TTLs are whole seconds in etcd; both backends round up (minimum 1 s)
/// so the same TTL behaves the same on both.
pub(crate) fn ttl_secs(ttl: Duration) -> i64 {
    let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
    i64::try_from(secs.max(1)).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_rounds_up_to_whole_seconds() {
        assert_eq!(ttl_secs(Duration::ZERO), 1);
        assert_eq!(ttl_secs(Duration::from_millis(1500)), 2);
        assert_eq!(ttl_secs(Duration::from_secs(3)), 3);
    }
}
