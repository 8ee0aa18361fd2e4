//! The gateway's view of placement: pools by model, kept current by a watch.
//!
//! The watch starts with a full snapshot (`Resync`) and then applies deltas. A resync (after
//! etcd was unreachable, a leader change, a compaction) is applied as a diff: pools it no
//! longer names leave, the others are added or updated in place, and a pool at an unchanged
//! address keeps its channel, its in-flight count, its health record and its prefix-cache
//! stream, so routing goes on undisturbed. While the store is unreachable no events arrive
//! and the last known view keeps serving.
//!
//! Until the first snapshot the view is not [`PoolView::is_synced`]: the gateway cannot tell
//! which models exist, so it is not ready and answers UNAVAILABLE rather than "no such model".
//! A model some pool served lately (or that has pools starting or draining) is also
//! UNAVAILABLE while none of its pools is ready: a drain or a restart is not a missing model.
//!
//! Channels to workers carry HTTP/2 keep-alive pings, so a worker that stops answering (a
//! stopped process, a dead host, a cut network) fails its calls within two ping intervals
//! instead of leaving them open for ever.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use ferrite_placement::{Key, KeySchema, PoolRecord, PoolState, Store, WatchEvent};
use ferrite_proto::worker::v1::worker_client::WorkerClient;
use tokio::sync::watch;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::error::GatewayError;
use crate::kv_index::KvIndex;
use crate::outlier::PoolHealth;

/// A model or LoRA adapter some ready pool serves ([`PoolView::models`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Served {
    pub name: String,
    /// The largest context of its ready pools.
    pub max_model_len: u32,
    pub ready_pools: u32,
    /// For an adapter, the model it adapts.
    pub parent: Option<String>,
}

/// How long after its last pool left a model is still answered UNAVAILABLE (not NOT_FOUND).
pub const MODEL_REMEMBERED_FOR: Duration = Duration::from_secs(600);

/// The largest message a worker may send: a scored prompt's scores come in its first one,
/// about 200 bytes a token with 20 alternatives each (27 MB for a prompt of 128K tokens),
/// past gRPC's default of 4 MiB.
pub const MAX_WORKER_MESSAGE: usize = 256 << 20;

/// A client of the worker at `channel`.
fn worker_client(channel: Channel) -> WorkerClient<Channel> {
    WorkerClient::new(channel).max_decoding_message_size(MAX_WORKER_MESSAGE)
}

/// One pool as the gateway sees it.
#[derive(Debug, Clone)]
pub struct Pool {
    pub name: String,
    pub record: PoolRecord,
    pub client: WorkerClient<Channel>,
    /// Requests this gateway has in flight on the pool (the routing signal).
    pub outstanding: Arc<AtomicUsize>,
    /// How this gateway's calls to the pool went lately.
    pub health: Arc<PoolHealth>,
}

impl Pool {
    pub fn load(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }
}

/// TLS of the channels to workers (their addresses are then `https://`).
#[derive(Debug, Clone)]
pub enum WorkerTls {
    /// One configuration for the gateway's life.
    Fixed(ClientTlsConfig),
    /// Files, as `loaded` now, and loaded again when they change: every pool's channel is
    /// then made anew, so a renewed client certificate is presented without a restart.
    Files {
        files: ferrite_tls::ClientTlsFiles,
        loaded: ClientTlsConfig,
    },
}

impl WorkerTls {
    /// TLS from `files`, loaded now (an error here is a start-up error).
    pub fn from_files(files: ferrite_tls::ClientTlsFiles) -> Result<Self, ferrite_tls::TlsError> {
        Ok(Self::Files {
            loaded: files.load()?,
            files,
        })
    }

    fn config(&self) -> &ClientTlsConfig {
        match self {
            WorkerTls::Fixed(c) | WorkerTls::Files { loaded: c, .. } => c,
        }
    }
}

/// How the gateway's channels to workers are set up.
#[derive(Debug, Clone)]
pub struct ChannelConfig {
    pub tls: Option<WorkerTls>,
    /// HTTP/2 ping interval, and how long a ping may go unanswered before the connection (and
    /// every call on it) fails.
    pub keepalive: Duration,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        Self {
            tls: None,
            keepalive: Duration::from_secs(5),
        }
    }
}

/// Pools by name. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct PoolView {
    pools: Arc<RwLock<HashMap<String, Pool>>>,
    /// TLS of new channels (replaced when the files of [`WorkerTls::Files`] change).
    tls: Arc<RwLock<Option<ClientTlsConfig>>>,
    keepalive: Duration,
    /// What each pool's prefix cache holds, from the pools' streams (one per pool known here).
    kv: KvIndex,
    /// Set once the first snapshot of placement arrived.
    synced: Arc<watch::Sender<bool>>,
    /// Models by when a pool of theirs was last added or removed here.
    seen: Arc<Mutex<HashMap<String, Instant>>>,
    /// The context lengths last reported in the log for each model with pools that differ.
    contexts: Arc<Mutex<HashMap<String, BTreeSet<u32>>>>,
}

impl Default for PoolView {
    fn default() -> Self {
        Self::new(ChannelConfig::default())
    }
}

impl PoolView {
    /// A view whose channels are set up as `channels` says. With TLS files, a task looks at
    /// them every [`ferrite_tls::RECHECK`] and remakes every channel when they change.
    pub fn new(channels: ChannelConfig) -> Self {
        let view = Self {
            pools: Arc::default(),
            tls: Arc::new(RwLock::new(
                channels.tls.as_ref().map(|t| t.config().clone()),
            )),
            keepalive: channels.keepalive,
            kv: KvIndex::default(),
            synced: Arc::new(watch::Sender::new(false)),
            seen: Arc::default(),
            contexts: Arc::default(),
        };
        if let Some(WorkerTls::Files { files, .. }) = channels.tls {
            let follower = view.clone();
            tokio::spawn(async move { follower.reload_tls(files).await });
        }
        view
    }

    /// Loads `files` again whenever they change, and remakes every pool's channel with them
    /// (calls in flight finish on the old ones). A change that does not load keeps the last
    /// good configuration and is tried again when the files change again.
    async fn reload_tls(&self, files: ferrite_tls::ClientTlsFiles) {
        let mut seen = files.stamp();
        loop {
            tokio::time::sleep(ferrite_tls::RECHECK).await;
            let now = files.stamp();
            if now == seen {
                continue;
            }
            seen = now;
            match files.load() {
                Ok(cfg) => {
                    *self.tls.write().unwrap_or_else(PoisonError::into_inner) = Some(cfg);
                    tracing::info!(ca = %files.ca.display(), "the TLS files for workers changed: reloaded");
                    self.remake_channels();
                }
                Err(e) => tracing::warn!(
                    "the TLS files for workers changed but do not load ({e}): keeping the previous ones"
                ),
            }
        }
    }

    /// Gives every pool a new channel (with the current TLS) and reopens its prefix-cache
    /// stream on it.
    fn remake_channels(&self) {
        self.with_pools(|pools| {
            for (name, p) in pools.iter_mut() {
                match self.channel(&p.record.leader_addr) {
                    Ok(channel) => {
                        p.client = worker_client(channel);
                        self.kv.watch(name, p.client.clone());
                    }
                    Err(e) => tracing::warn!(pool = %name, "cannot remake the channel: {e}"),
                }
            }
        });
    }

    /// The pools' prefix caches, for KV-aware routing.
    pub fn kv(&self) -> &KvIndex {
        &self.kv
    }

    /// Whether placement has answered (the first snapshot arrived).
    pub fn is_synced(&self) -> bool {
        *self.synced.borrow()
    }

    /// Follows [`Self::is_synced`].
    pub fn subscribe_synced(&self) -> watch::Receiver<bool> {
        self.synced.subscribe()
    }

    /// Ready pools serving `model`.
    pub fn ready(&self, model: &str) -> Vec<Pool> {
        let guard = self.pools.read().unwrap_or_else(PoisonError::into_inner);
        guard
            .values()
            .filter(|p| p.record.serves(model) && p.record.state == PoolState::Ready)
            .cloned()
            .collect()
    }

    /// Why no pool of `model` is ready, as the client is told: UNAVAILABLE while placement
    /// has not answered, while the model has pools that are not ready (starting, draining),
    /// or for [`MODEL_REMEMBERED_FOR`] after its last pool left; NOT_FOUND otherwise.
    pub fn none_ready(&self, model: &str) -> GatewayError {
        if !self.is_synced() {
            return GatewayError::Unavailable(
                "this gateway has not heard from placement (etcd) yet: try again shortly".into(),
            );
        }
        let states: Vec<PoolState> = {
            let guard = self.pools.read().unwrap_or_else(PoisonError::into_inner);
            guard
                .values()
                .filter(|p| p.record.serves(model))
                .map(|p| p.record.state)
                .collect()
        };
        let count = |s| states.iter().filter(|&&x| x == s).count();
        if !states.is_empty() {
            return GatewayError::Unavailable(format!(
                "no pool of `{model}` is ready ({} starting, {} draining): try again shortly",
                count(PoolState::Starting),
                count(PoolState::Draining)
            ));
        }
        let lately = self
            .seen
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(model)
            .is_some_and(|t| t.elapsed() < MODEL_REMEMBERED_FOR);
        if lately {
            return GatewayError::Unavailable(format!(
                "no pool of `{model}` is registered now (one was lately): try again shortly"
            ));
        }
        GatewayError::ModelNotFound(model.to_owned())
    }

    /// Models and LoRA adapters with at least one ready pool, by name.
    pub fn models(&self) -> Vec<Served> {
        let guard = self.pools.read().unwrap_or_else(PoisonError::into_inner);
        let mut by_name: HashMap<&str, Served> = HashMap::new();
        for p in guard
            .values()
            .filter(|p| p.record.state == PoolState::Ready)
        {
            let r = &p.record;
            let adapters = r.lora.iter().map(|l| (l, Some(&r.model)));
            for (name, parent) in std::iter::once((&r.model, None)).chain(adapters) {
                let e = by_name.entry(name).or_insert_with(|| Served {
                    name: name.clone(),
                    parent: parent.cloned(),
                    ..Served::default()
                });
                e.max_model_len = e.max_model_len.max(r.max_model_len);
                e.ready_pools += 1;
            }
        }
        let mut out: Vec<Served> = by_name.into_values().collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    fn with_pools<T>(&self, f: impl FnOnce(&mut HashMap<String, Pool>) -> T) -> T {
        let mut guard = self.pools.write().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    /// Notes that the model of `record`, and its adapters, were served just now.
    fn saw(&self, record: &PoolRecord) {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        for name in std::iter::once(&record.model).chain(&record.lora) {
            seen.insert(name.clone(), Instant::now());
        }
    }

    /// A channel to `addr` as configured (lazy: it connects on first use, and again after a
    /// failure).
    fn channel(&self, addr: &str) -> Result<Channel, tonic::transport::Error> {
        let ep = Endpoint::from_shared(addr.to_owned())?;
        let tls = self
            .tls
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let ep = match tls {
            Some(tls) => ep.tls_config(tls)?,
            None => ep,
        };
        let keepalive = self.keepalive;
        Ok(ep
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(keepalive)
            .keep_alive_timeout(keepalive)
            .keep_alive_while_idle(true)
            .connect_lazy())
    }

    fn upsert(&self, name: String, record: PoolRecord) {
        self.saw(&record);
        let model = record.model.clone();
        let old_model = self.with_pools(|pools| {
            // Keep the channel, the in-flight count and the health record when only the state
            // (or another field) changed.
            if let Some(p) = pools.get_mut(&name)
                && p.record.leader_addr == record.leader_addr
            {
                return Some(std::mem::replace(&mut p.record, record).model);
            }
            match self.channel(&record.leader_addr) {
                Ok(channel) => {
                    let client = worker_client(channel);
                    // A new pool (or one at a new address): follow its prefix cache.
                    self.kv.watch(&name, client.clone());
                    let old = pools.insert(
                        name.clone(),
                        Pool {
                            name: name.clone(),
                            record,
                            client,
                            outstanding: Arc::new(AtomicUsize::new(0)),
                            health: Arc::new(PoolHealth::default()),
                        },
                    );
                    old.map(|p| p.record.model)
                }
                Err(e) => {
                    tracing::warn!(pool = %name, addr = %record.leader_addr, "unusable pool address: {e}");
                    None
                }
            }
        });
        self.note_contexts(&model);
        if let Some(m) = old_model.filter(|m| *m != model) {
            self.note_contexts(&m);
        }
    }

    fn remove(&self, name: &str) {
        if let Some(p) = self.with_pools(|pools| pools.remove(name)) {
            self.saw(&p.record);
            ferrite_telemetry::metrics::gateway_pool_max_model_len(&p.record.model, name, 0);
            self.note_contexts(&p.record.model);
        }
        self.kv.forget(name);
    }

    /// Sets each ready pool's context gauge for `model`, and says in the log when its ready
    /// pools start or stop differing in context length (requests longer than a pool's context
    /// go only to the others).
    fn note_contexts(&self, model: &str) {
        let mut lengths = BTreeSet::new();
        for p in self.ready(model) {
            ferrite_telemetry::metrics::gateway_pool_max_model_len(
                model,
                &p.name,
                p.record.max_model_len,
            );
            lengths.insert(p.record.max_model_len);
        }
        let mut noted = self.contexts.lock().unwrap_or_else(PoisonError::into_inner);
        let differ = lengths.len() > 1;
        let before = noted.get(model);
        if differ && before != Some(&lengths) {
            tracing::warn!(%model, contexts = ?lengths,
                "the ready pools of this model serve different context lengths: a request goes only to pools whose context holds its prompt and max_tokens");
            noted.insert(model.to_owned(), lengths);
        } else if !differ && noted.remove(model).is_some() {
            tracing::info!(%model, "the ready pools of this model serve one context length again");
        }
    }

    fn apply(&self, schema: &KeySchema, event: WatchEvent) {
        match event {
            WatchEvent::Resync(entries) => {
                let records: HashMap<String, PoolRecord> = entries
                    .iter()
                    .filter_map(|(key, value)| Self::parse_put(schema, key, value))
                    .collect();
                let gone: Vec<String> = {
                    let guard = self.pools.read().unwrap_or_else(PoisonError::into_inner);
                    guard
                        .keys()
                        .filter(|n| !records.contains_key(*n))
                        .cloned()
                        .collect()
                };
                for name in gone {
                    self.remove(&name);
                }
                for (name, record) in records {
                    self.upsert(name, record);
                }
                self.synced.send_replace(true);
            }
            WatchEvent::Put(key, value) => {
                if let Some((name, record)) = Self::parse_put(schema, &key, &value) {
                    self.upsert(name, record);
                }
            }
            WatchEvent::Delete(key) => {
                if let Some(Key::Pool(name)) = schema.parse(&key) {
                    self.remove(&name);
                }
            }
        }
    }

    /// The pool a put of `key` describes, if it is a readable pool record.
    fn parse_put(schema: &KeySchema, key: &str, value: &[u8]) -> Option<(String, PoolRecord)> {
        let Some(Key::Pool(name)) = schema.parse(key) else {
            return None;
        };
        match serde_json::from_slice::<PoolRecord>(value) {
            Ok(record) => Some((name, record)),
            Err(e) => {
                tracing::warn!(%key, "ignoring an unreadable pool record: {e}");
                None
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

    pub fn record(digest: Option<&str>) -> PoolRecord {
        PoolRecord {
            model: "m".into(),
            tp: 1,
            leader_addr: "http://127.0.0.1:9".into(),
            state: PoolState::Ready,
            max_model_len: 16,
            text_digest: digest.map(str::to_owned),
            lora: Vec::new(),
        }
    }

    pub fn pool(name: &str, load: usize, digest: Option<&str>) -> Pool {
        let channel = Endpoint::from_static("http://127.0.0.1:9").connect_lazy();
        Pool {
            name: name.into(),
            record: record(digest),
            client: WorkerClient::new(channel),
            outstanding: Arc::new(AtomicUsize::new(load)),
            health: Arc::new(PoolHealth::default()),
        }
    }
}

#[cfg(test)]
#[path = "pools_tests.rs"]
mod tests;
