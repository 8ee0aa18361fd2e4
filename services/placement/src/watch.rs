//! What a watch delivers: a full snapshot, then deltas, and a fresh snapshot
//! whenever continuity was lost.

use std::collections::BTreeMap;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// Events are buffered up to this many; a slow consumer then back-pressures the
/// producer (etcd buffers on its side), and the embedded store resyncs it.
pub(crate) const WATCH_BUFFER: usize = 256;

/// One message of a [`Watch`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// Every key under the watched prefix with its value, at one revision.
    /// Replace your state with it: keys you hold that are not in it are gone.
    Resync(Vec<(String, Vec<u8>)>),
    /// A key was created or changed.
    Put(String, Vec<u8>),
    /// A key was deleted (explicitly or because its lease expired).
    Delete(String),
}

impl WatchEvent {
    /// Applies the event to a mirror of the watched prefix, the way every
    /// consumer should (a `Resync` replaces, deltas patch).
    pub fn apply(self, state: &mut BTreeMap<String, Vec<u8>>) {
        match self {
            Self::Resync(kvs) => *state = kvs.into_iter().collect(),
            Self::Put(k, v) => {
                state.insert(k, v);
            }
            Self::Delete(k) => {
                state.remove(&k);
            }
        }
    }
}

/// A live watch of one prefix (see [`crate::Store::watch_prefix`]).
///
/// Invariant: the first event is a `Resync`; after it, every change under the
/// prefix arrives exactly once and in revision order, until continuity is lost
/// (etcd unreachable, compaction, slow consumer), after which the next event is
/// again a `Resync`. While etcd is unreachable nothing arrives: keep the last state.
///
/// Dropping the `Watch` stops its background task.
#[derive(Debug)]
pub struct Watch {
    rx: mpsc::Receiver<WatchEvent>,
    _task: AbortOnDrop,
}

impl Watch {
    pub(crate) fn new(rx: mpsc::Receiver<WatchEvent>, task: JoinHandle<()>) -> Self {
        Self {
            rx,
            _task: AbortOnDrop(task),
        }
    }

    /// The next event; `None` only when the store behind it is gone (embedded
    /// store dropped). Cancel-safe.
    pub async fn recv(&mut self) -> Option<WatchEvent> {
        self.rx.recv().await
    }
}

/// Aborts a background task when its owner goes away, so handles never leak
/// tasks that keep etcd streams or leases alive.
#[derive(Debug)]
pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
