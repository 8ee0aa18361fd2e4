//! `Store`: one API over the embedded and the etcd backends, by static dispatch.

use std::time::Duration;

use crate::embedded::EmbeddedStore;
use crate::etcd::{EtcdOptions, EtcdStore};
use crate::lease::LeaseId;
use crate::{KeySchema, PlacementError, Watch};

/// The placement store. Cheap to clone (an `Arc` inside each backend); all
/// clones share one connection (etcd) or one map (embedded).
///
/// Keys are absolute (build them with [`Store::schema`]); values are opaque
/// bytes (JSON records from [`crate::keys`] by convention).
#[derive(Clone, Debug)]
pub enum Store {
    /// In-process, for `ferrite serve` and tests; same lease and watch semantics.
    Embedded(EmbeddedStore),
    Etcd(EtcdStore),
}

impl Store {
    /// `"embedded"` or `"etcd"`, for logs and spans.
    pub fn kind(&self) -> &'static str {
        match self {
            Store::Embedded(_) => "embedded",
            Store::Etcd(_) => "etcd",
        }
    }

    /// An empty in-process store under [`crate::DEFAULT_PREFIX`].
    pub fn embedded() -> Self {
        Self::Embedded(EmbeddedStore::new(KeySchema::default()))
    }

    /// An etcd-backed store with the default timeouts (2 s connect, 2 s per request).
    ///
    /// Does not contact etcd: an unreachable etcd makes each later request fail
    /// within the request timeout (never hang), and the store recovers by itself
    /// when etcd returns. So a worker may start before etcd does.
    pub async fn connect(endpoints: &[String], prefix: &str) -> Result<Self, PlacementError> {
        Self::connect_with(endpoints, prefix, EtcdOptions::default()).await
    }

    /// [`Store::connect`] with explicit timeouts.
    pub async fn connect_with(
        endpoints: &[String],
        prefix: &str,
        options: EtcdOptions,
    ) -> Result<Self, PlacementError> {
        let store = EtcdStore::connect(endpoints, KeySchema::new(prefix), options).await?;
        Ok(Self::Etcd(store))
    }

    /// The key schema under this store's prefix.
    pub fn schema(&self) -> &KeySchema {
        match self {
            Self::Embedded(s) => s.schema(),
            Self::Etcd(s) => s.schema(),
        }
    }

    /// Writes `key`, attached to `lease` if given (replacing any earlier lease of
    /// the key). Fails with `LeaseNotFound` if the lease is gone.
    pub async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<(), PlacementError> {
        match self {
            Self::Embedded(s) => s.put(key, value, lease),
            Self::Etcd(s) => s.put(key, value, lease).await,
        }
    }

    /// Deletes `key`; deleting a missing key is not an error.
    pub async fn delete(&self, key: &str) -> Result<(), PlacementError> {
        match self {
            Self::Embedded(s) => {
                s.delete(key);
                Ok(())
            }
            Self::Etcd(s) => s.delete(key).await,
        }
    }

    /// Every key starting with `prefix`, sorted by key.
    pub async fn get_prefix(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, PlacementError> {
        match self {
            Self::Embedded(s) => Ok(s.get_prefix(prefix)),
            Self::Etcd(s) => s.get_prefix(prefix).await,
        }
    }

    /// A new lease; its keys are deleted `ttl` (rounded up to whole seconds)
    /// after the last keep-alive.
    pub async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, PlacementError> {
        match self {
            Self::Embedded(s) => Ok(s.grant_lease(ttl)),
            Self::Etcd(s) => s.grant_lease(ttl).await,
        }
    }

    /// Ends the lease now and deletes its keys. Revoking a lease that is
    /// already gone is not an error.
    pub async fn revoke_lease(&self, id: LeaseId) -> Result<(), PlacementError> {
        match self {
            Self::Embedded(s) => {
                s.revoke_lease(id);
                Ok(())
            }
            Self::Etcd(s) => s.revoke_lease(id).await,
        }
    }

    /// Resets the lease's TTL. `Ok(false)`: the lease is gone (expired or
    /// revoked) and its keys with it. `Err`: could not tell (etcd unreachable).
    pub async fn keep_alive_once(&self, id: LeaseId) -> Result<bool, PlacementError> {
        match self {
            Self::Embedded(s) => Ok(s.keep_alive_once(id)),
            Self::Etcd(s) => s.keep_alive_once(id).await,
        }
    }

    /// Watches every key starting with `prefix`: a `Resync` snapshot first, then
    /// deltas (see [`Watch`] for the guarantees). Spawns a task, so call it
    /// inside a Tokio runtime; dropping the `Watch` ends it.
    pub fn watch_prefix(&self, prefix: &str) -> Watch {
        match self {
            Self::Embedded(s) => s.watch_prefix(prefix),
            Self::Etcd(s) => s.watch_prefix(prefix),
        }
    }
}
