//! The in-process store for `ferrite serve` (one machine, no etcd) and tests.
//!
//! It mirrors etcd's semantics that placement relies on: leases with a TTL whose
//! expiry deletes their keys (and notifies watchers with `Delete`s), and
//! watches that start with a snapshot and then deliver every change in order.
//!
//! Invariants:
//! - one `std::sync::Mutex` guards the map and the leases; it is never held
//!   across an `.await` (every critical section is a few map operations);
//! - every change is broadcast while that mutex is held, so a watcher that takes
//!   its snapshot and subscribes under the same lock sees each later change
//!   exactly once, in order;
//! - a key attached to a lease appears in that lease's key set and nowhere else.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::{broadcast, mpsc};
use tokio::time::Instant;

use crate::lease::ttl_secs;
use crate::watch::WATCH_BUFFER;
use crate::{KeySchema, LeaseId, PlacementError, Watch, WatchEvent};

/// How many changes a watcher may fall behind before it is resynced.
const CHANGE_BUFFER: usize = 1024;

/// See the module doc. Clones share the same data.
#[derive(Clone, Debug)]
pub struct EmbeddedStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    schema: KeySchema,
    state: Mutex<State>,
    changes: broadcast::Sender<Change>,
}

#[derive(Debug, Default)]
struct State {
    kvs: BTreeMap<String, Entry>,
    leases: HashMap<i64, Lease>,
    next_lease: i64,
}

#[derive(Debug)]
struct Entry {
    value: Vec<u8>,
    lease: Option<i64>,
}

#[derive(Debug)]
struct Lease {
    ttl: Duration,
    deadline: Instant,
    keys: BTreeSet<String>,
}

#[derive(Clone, Debug)]
enum Change {
    Put(String, Vec<u8>),
    Delete(String),
}

impl EmbeddedStore {
    pub(crate) fn new(schema: KeySchema) -> Self {
        let (changes, _) = broadcast::channel(CHANGE_BUFFER);
        Self {
            inner: Arc::new(Inner {
                schema,
                state: Mutex::new(State::default()),
                changes,
            }),
        }
    }

    pub(crate) fn schema(&self) -> &KeySchema {
        &self.inner.schema
    }

    pub(crate) fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<(), PlacementError> {
        let mut st = self.inner.lock();
        if let Some(LeaseId(id)) = lease {
            let Some(l) = st.leases.get_mut(&id) else {
                return Err(PlacementError::LeaseNotFound(id));
            };
            l.keys.insert(key.to_owned());
        }
        let entry = Entry {
            value: value.clone(),
            lease: lease.map(|l| l.0),
        };
        if let Some(old) = st.kvs.insert(key.to_owned(), entry)
            && let Some(old_id) = old.lease
            && old.lease != lease.map(|l| l.0)
            && let Some(l) = st.leases.get_mut(&old_id)
        {
            l.keys.remove(key);
        }
        self.inner.emit(Change::Put(key.to_owned(), value));
        Ok(())
    }

    pub(crate) fn delete(&self, key: &str) {
        let mut st = self.inner.lock();
        self.inner.delete_locked(&mut st, key);
    }

    pub(crate) fn get_prefix(&self, prefix: &str) -> Vec<(String, Vec<u8>)> {
        snapshot(&self.inner.lock(), prefix)
    }

    pub(crate) fn grant_lease(&self, ttl: Duration) -> LeaseId {
        let ttl = Duration::from_secs(ttl_secs(ttl).unsigned_abs());
        let deadline = Instant::now() + ttl;
        let id = {
            let mut st = self.inner.lock();
            st.next_lease += 1;
            let id = st.next_lease;
            let keys = BTreeSet::new();
            st.leases.insert(
                id,
                Lease {
                    ttl,
                    deadline,
                    keys,
                },
            );
            id
        };
        tokio::spawn(expire_when_due(Arc::downgrade(&self.inner), id, deadline));
        LeaseId(id)
    }

    pub(crate) fn revoke_lease(&self, LeaseId(id): LeaseId) {
        let mut st = self.inner.lock();
        self.inner.remove_lease(&mut st, id);
    }

    pub(crate) fn keep_alive_once(&self, LeaseId(id): LeaseId) -> bool {
        let mut st = self.inner.lock();
        match st.leases.get_mut(&id) {
            Some(l) => {
                l.deadline = Instant::now() + l.ttl;
                true
            }
            None => false,
        }
    }

    pub(crate) fn watch_prefix(&self, prefix: &str) -> Watch {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let (kvs, changes) = self.inner.snapshot_and_subscribe(prefix);
        // The channel is new and empty, so this cannot fail: the snapshot is in
        // place before any change can be forwarded.
        let _ = tx.try_send(WatchEvent::Resync(kvs));
        let inner = Arc::downgrade(&self.inner);
        let task = tokio::spawn(forward(inner, prefix.to_owned(), changes, tx));
        Watch::new(rx, task)
    }
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves the maps consistent (each
        // critical section is a few infallible map operations), so keep going.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Called with the state lock held (see the module invariants).
    fn emit(&self, change: Change) {
        // Err only means nobody is watching.
        let _ = self.changes.send(change);
    }

    fn delete_locked(&self, st: &mut State, key: &str) {
        if let Some(old) = st.kvs.remove(key) {
            if let Some(id) = old.lease
                && let Some(l) = st.leases.get_mut(&id)
            {
                l.keys.remove(key);
            }
            self.emit(Change::Delete(key.to_owned()));
        }
    }

    fn remove_lease(&self, st: &mut State, id: i64) {
        if let Some(lease) = st.leases.remove(&id) {
            for key in lease.keys {
                if st.kvs.remove(&key).is_some() {
                    self.emit(Change::Delete(key));
                }
            }
        }
    }

    fn snapshot_and_subscribe(
        &self,
        prefix: &str,
    ) -> (Vec<(String, Vec<u8>)>, broadcast::Receiver<Change>) {
        let st = self.lock();
        (snapshot(&st, prefix), self.changes.subscribe())
    }
}

fn snapshot(st: &State, prefix: &str) -> Vec<(String, Vec<u8>)> {
    st.kvs
        .range(prefix.to_owned()..)
        .take_while(|(k, _)| k.starts_with(prefix))
        .map(|(k, e)| (k.clone(), e.value.clone()))
        .collect()
}

/// Sleeps until the lease's deadline, re-checking after each keep-alive moved
/// it; deletes the lease's keys once it is really due. Holds only a `Weak` so a
/// dropped store does not live on through its lease timers.
async fn expire_when_due(inner: Weak<Inner>, id: i64, mut deadline: Instant) {
    loop {
        tokio::time::sleep_until(deadline).await;
        let Some(inner) = inner.upgrade() else { return };
        let mut st = inner.lock();
        match st.leases.get(&id) {
            None => return,
            Some(l) if l.deadline > Instant::now() => deadline = l.deadline,
            Some(_) => {
                inner.remove_lease(&mut st, id);
                return;
            }
        }
    }
}

/// Feeds one watcher: filters the store-wide change stream by prefix. If the
/// watcher fell so far behind that changes were dropped, it gets a fresh
/// snapshot (`Resync`) instead, exactly as an etcd watch does after a loss.
async fn forward(
    inner: Weak<Inner>,
    prefix: String,
    mut changes: broadcast::Receiver<Change>,
    tx: mpsc::Sender<WatchEvent>,
) {
    loop {
        let change = tokio::select! {
            _ = tx.closed() => return,
            change = changes.recv() => change,
        };
        let event = match change {
            Ok(Change::Put(k, v)) if k.starts_with(&prefix) => WatchEvent::Put(k, v),
            Ok(Change::Delete(k)) if k.starts_with(&prefix) => WatchEvent::Delete(k),
            Ok(_) => continue,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                let Some(inner) = inner.upgrade() else { return };
                tracing::debug!(%prefix, missed, "embedded watch lagged; resyncing");
                let (kvs, fresh) = inner.snapshot_and_subscribe(&prefix);
                changes = fresh;
                WatchEvent::Resync(kvs)
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        if tx.send(event).await.is_err() {
            return;
        }
    }
}
