//! Placement: where pools and their ranks live, and who is alive.
//!
//! Workers register their pools and ranks under a key prefix (default
//! `/ferrite/v1`) with leases, so a dead process disappears by itself; the
//! gateway watches the prefix (nothing polls) and routes to ready pools. In a
//! cluster the store is etcd; `ferrite serve` uses an in-process store with
//! the same semantics behind the same API.
//!
//! # Layout
//!
//! - [`keys`]: the key schema (`pools/{pool}`, `pools/{pool}/ranks/{rank}`, …)
//!   and the JSON records stored under it (`PoolRecord`, `RankRecord`).
//! - `store`: [`Store`], an enum over the two backends (static dispatch):
//!   put / delete / get_prefix, leases, watches.
//! - `lease`: [`LeaseId`] and whole-second TTLs, as both backends grant leases.
//! - `embedded`: [`EmbeddedStore`], in-process, with real TTL expiry.
//! - `etcd`: [`EtcdStore`]: request wrappers with hard timeouts, and the watch
//!   task that reconnects and resyncs.
//! - `watch`: [`Watch`] and [`WatchEvent`] (`Resync` snapshot, then deltas).
//! - `registration`: [`Registration`], a worker's keys kept alive under a lease
//!   by one task, through outages.
//! - `testing` (feature `testing`): `EtcdServer`, a real etcd on loopback ports.
//!
//! # Invariants
//!
//! - A [`Watch`] starts with a `Resync` (the full prefix at one revision); then
//!   every change arrives once, in order. When continuity is lost (etcd down or
//!   restarted, compaction, a consumer too slow for the embedded store) the
//!   watch retries with backoff (capped at 1 s) and the next event is a fresh
//!   `Resync`: no change is ever silently missed. While etcd is unreachable
//!   nothing arrives; consumers keep their last state.
//! - A [`Registration`] keeps its entries in the store under a live lease while
//!   its handle lives: it keeps the lease alive every ttl/3, and if the lease was
//!   lost (expired during an outage) it grants a new one and writes every entry
//!   again. `deregister` removes the keys at once; dropping the handle lets them
//!   expire after the TTL, like a crash.
//! - No request hangs: each etcd request fails after the request timeout
//!   (2 s default) when etcd is unreachable. Creating a store does not contact
//!   etcd, so processes may start before it.
//! - Lease TTLs are whole seconds (etcd's unit; rounded up), on both backends.

mod embedded;
mod error;
mod etcd;
pub mod keys;
mod lease;
mod registration;
mod retry;
mod store;
#[cfg(feature = "testing")]
pub mod testing;
mod watch;

pub use embedded::EmbeddedStore;
pub use error::PlacementError;
pub use etcd::{EtcdOptions, EtcdStore};
pub use keys::{CommRecord, DEFAULT_PREFIX, Key, KeySchema, PoolRecord, PoolState, RankRecord};
pub use lease::LeaseId;
pub use registration::{Registration, RegistrationState};
pub use store::Store;
pub use watch::{Watch, WatchEvent};
