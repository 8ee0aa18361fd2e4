//! The gateway's view of placement: ready pools by model, kept current by a watch.
//!
//! The watch starts with a full snapshot (`Resync`) and then applies deltas; a resync replaces
//! the whole view. While the store is unreachable no events arrive and the last known view
//! keeps serving.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use ferrite_placement::{Key, KeySchema, PoolRecord, PoolState, Store, WatchEvent};
use ferrite_proto::worker::v1::worker_client::WorkerClient;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::kv_index::KvIndex;

/// One pool as the gateway sees it.
#[derive(Debug, Clone)]
pub struct Pool {
    pub name: String,
    pub record: PoolRecord,
    pub client: WorkerClient<Channel>,
    /// Requests this gateway has in flight on the pool (the routing signal).
    pub outstanding: Arc<AtomicUsize>,
}

impl Pool {
    pub fn load(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }
}

/// Pools by name. Cheap to clone (shared).
#[derive(Debug, Clone, Default)]
pub struct PoolView {
    pools: Arc<RwLock<HashMap<String, Pool>>>,
    /// TLS for the channels to workers (their addresses are then `https://`).
    worker_tls: Option<ClientTlsConfig>,
    /// What each pool's prefix cache holds, from the pools' streams (one per pool known here).
    kv: KvIndex,
}

impl PoolView {
    pub fn new(worker_tls: Option<ClientTlsConfig>) -> Self {
        Self {
            pools: Arc::default(),
            worker_tls,
            kv: KvIndex::default(),
        }
    }

    /// The pools' prefix caches, for KV-aware routing.
    pub fn kv(&self) -> &KvIndex {
        &self.kv
    }

    /// Ready pools serving `model`.
    pub fn ready(&self, model: &str) -> Vec<Pool> {
        let guard = self.pools.read().unwrap_or_else(PoisonError::into_inner);
        guard
            .values()
            .filter(|p| p.record.model == model && p.record.state == PoolState::Ready)
            .cloned()
            .collect()
    }

    /// Models with at least one ready pool: (name, max_model_len, ready pools).
    pub fn models(&self) -> Vec<(String, u32, u32)> {
        let guard = self.pools.read().unwrap_or_else(PoisonError::into_inner);
        let mut by_model: HashMap<&str, (u32, u32)> = HashMap::new();
        for p in guard
            .values()
            .filter(|p| p.record.state == PoolState::Ready)
        {
            let e = by_model
                .entry(&p.record.model)
                .or_insert((p.record.max_model_len, 0));
            e.1 += 1;
        }
        let mut out: Vec<_> = by_model
            .into_iter()
            .map(|(m, (len, n))| (m.to_owned(), len, n))
            .collect();
        out.sort();
        out
    }

    fn with_pools(&self, f: impl FnOnce(&mut HashMap<String, Pool>)) {
        let mut guard = self.pools.write().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard);
    }

    fn upsert(&self, name: String, record: PoolRecord) {
        self.with_pools(|pools| {
            // Keep the channel and the in-flight count when only the state changed.
            if let Some(p) = pools.get_mut(&name)
                && p.record.leader_addr == record.leader_addr
            {
                p.record = record;
                return;
            }
            let endpoint = Endpoint::from_shared(record.leader_addr.clone()).and_then(|ep| {
                match &self.worker_tls {
                    Some(tls) => ep.tls_config(tls.clone()),
                    None => Ok(ep),
                }
            });
            match endpoint {
                Ok(ep) => {
                    let channel = ep
                        .connect_timeout(std::time::Duration::from_secs(2))
                        .tcp_nodelay(true)
                        .connect_lazy();
                    let client = WorkerClient::new(channel);
                    // A new pool (or one at a new address): follow its prefix cache.
                    self.kv.watch(&name, client.clone());
                    pools.insert(
                        name.clone(),
                        Pool {
                            name,
                            record,
                            client,
                            outstanding: Arc::new(AtomicUsize::new(0)),
                        },
                    );
                }
                Err(e) => tracing::warn!(pool = %name, addr = %record.leader_addr, "unusable pool address: {e}"),
            }
        });
    }

    fn apply(&self, schema: &KeySchema, event: WatchEvent) {
        match event {
            WatchEvent::Resync(entries) => {
                self.with_pools(|pools| pools.clear());
                self.kv.forget_all();
                for (key, value) in entries {
                    self.apply_put(schema, &key, &value);
                }
            }
            WatchEvent::Put(key, value) => self.apply_put(schema, &key, &value),
            WatchEvent::Delete(key) => {
                if let Some(Key::Pool(name)) = schema.parse(&key) {
                    self.with_pools(|pools| {
                        pools.remove(&name);
                    });
                    self.kv.forget(&name);
                }
            }
        }
    }

    fn apply_put(&self, schema: &KeySchema, key: &str, value: &[u8]) {
        if let Some(Key::Pool(name)) = schema.parse(key) {
            match serde_json::from_slice::<PoolRecord>(value) {
                Ok(record) => self.upsert(name, record),
                Err(e) => tracing::warn!(%key, "ignoring an unreadable pool record: {e}"),
            }
        }
    }

    /// Follows the pools under `schema` in `store` until the store's watch ends.
    pub async fn follow(&self, store: Store, schema: KeySchema) {
        let mut watch = store.watch_prefix(&schema.pools_prefix());
        while let Some(event) = watch.recv().await {
            self.apply(&schema, event);
        }
    }
}

/// Pools for unit tests: a lazy channel to a closed port, a given load and text digest.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    pub fn pool(name: &str, load: usize, digest: Option<&str>) -> Pool {
        let channel = Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
        Pool {
            name: name.into(),
            record: PoolRecord {
                model: "m".into(),
                tp: 1,
                leader_addr: "http://127.0.0.1:9".into(),
                state: PoolState::Ready,
                max_model_len: 16,
                text_digest: digest.map(str::to_owned),
            },
            client: WorkerClient::new(channel),
            outstanding: Arc::new(AtomicUsize::new(load)),
        }
    }
}
