//! The etcd backend: thin request wrappers with a hard timeout, and the watch
//! task that turns etcd's watch stream into snapshot + deltas that survive
//! outages.
//!
//! Why every request is wrapped in `tokio::time::timeout` although the client
//! also has a request timeout: while no endpoint is connected, the balanced
//! channel can wait for readiness before the per-request timeout starts, and
//! an unreachable etcd must fail a request within `request_timeout`, not hang.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions, EventType, GetOptions, PutOptions, WatchOptions};
use tokio::sync::mpsc;

use crate::error::from_etcd;
use crate::lease::ttl_secs;
use crate::retry::Backoff;
use crate::watch::WATCH_BUFFER;
use crate::{KeySchema, LeaseId, PlacementError, Watch, WatchEvent};

/// Reconnect backoff of a lost watch: first retry soon, then at most every second.
const WATCH_RETRY_MIN: Duration = Duration::from_millis(100);
const WATCH_RETRY_MAX: Duration = Duration::from_secs(1);

/// HTTP/2 pings on open streams detect a silently dead connection (a
/// partition, not a closed socket). etcd rejects pings more often than every
/// 5 s (`--grpc-keepalive-min-time`), hence 10 s.
const H2_PING_INTERVAL: Duration = Duration::from_secs(10);
const H2_PING_TIMEOUT: Duration = Duration::from_secs(3);

/// Timeouts of the etcd client.
#[derive(Clone, Debug)]
pub struct EtcdOptions {
    /// Establishing a TCP/HTTP2 connection to an endpoint.
    pub connect_timeout: Duration,
    /// One unary request (or opening a stream), end to end.
    pub request_timeout: Duration,
    /// TLS to etcd (`https://` endpoints): the CA etcd's certificate chains to, and a client
    /// certificate when etcd requires one.
    pub tls: Option<etcd_client::TlsOptions>,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(2),
            tls: None,
        }
    }
}

/// See the module doc. Clones share one connection.
#[derive(Clone)]
pub struct EtcdStore {
    inner: Arc<Inner>,
}

struct Inner {
    client: Client,
    schema: KeySchema,
    endpoints: Vec<String>,
    request_timeout: Duration,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.inner.endpoints)
            .field("prefix", &self.inner.schema.prefix())
            .finish_non_exhaustive()
    }
}

impl EtcdStore {
    pub(crate) async fn connect(
        endpoints: &[String],
        schema: KeySchema,
        options: EtcdOptions,
    ) -> Result<Self, PlacementError> {
        if endpoints.is_empty() {
            return Err(PlacementError::InvalidEndpoint {
                endpoint: String::new(),
                reason: "no etcd endpoints given".into(),
            });
        }
        for e in endpoints {
            // Fail here with a clear message rather than on the first request: an https
            // endpoint needs the CA to trust, and TLS options talk to https endpoints only.
            let https = e.starts_with("https://");
            if https != options.tls.is_some() {
                let reason = if https {
                    "an https:// endpoint needs TLS options (--etcd-ca)"
                } else {
                    "TLS to etcd (--etcd-ca) needs https:// endpoints"
                };
                return Err(PlacementError::InvalidEndpoint {
                    endpoint: e.clone(),
                    reason: reason.into(),
                });
            }
        }
        let connect = ConnectOptions::new()
            .with_connect_timeout(options.connect_timeout)
            .with_timeout(options.request_timeout)
            .with_keep_alive(H2_PING_INTERVAL, H2_PING_TIMEOUT)
            // Without a leader etcd would serve a stale watch forever; with
            // this it cancels the watch and we resync once a leader exists.
            .with_require_leader(true);
        let connect = match options.tls.clone() {
            Some(tls) => connect.with_tls(tls),
            None => connect,
        };
        // Lazy: no request is made here (no auth), so this only validates URLs.
        let client =
            Client::connect(endpoints, Some(connect))
                .await
                .map_err(|e| match from_etcd(e, None) {
                    PlacementError::InvalidEndpoint { reason, .. } => {
                        PlacementError::InvalidEndpoint {
                            endpoint: endpoints.join(","),
                            reason,
                        }
                    }
                    other => other,
                })?;
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                schema,
                endpoints: endpoints.to_vec(),
                request_timeout: options.request_timeout,
            }),
        })
    }

    pub(crate) fn schema(&self) -> &KeySchema {
        &self.inner.schema
    }

    /// Runs one request under the hard timeout (see the module doc).
    async fn call<T>(
        &self,
        lease: Option<i64>,
        request: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<T, PlacementError> {
        let timeout = self.inner.request_timeout;
        match tokio::time::timeout(timeout, request).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(from_etcd(e, lease)),
            Err(_) => Err(PlacementError::Timeout(timeout)),
        }
    }

    pub(crate) async fn put(
        &self,
        key: &str,
        value: Vec<u8>,
        lease: Option<LeaseId>,
    ) -> Result<(), PlacementError> {
        let mut kv = self.inner.client.kv_client();
        let options = lease.map(|l| PutOptions::new().with_lease(l.0));
        self.call(lease.map(|l| l.0), kv.put(key, value, options))
            .await
            .map(drop)
    }

    pub(crate) async fn delete(&self, key: &str) -> Result<(), PlacementError> {
        let mut kv = self.inner.client.kv_client();
        self.call(None, kv.delete(key, None)).await.map(drop)
    }

    pub(crate) async fn get_prefix(
        &self,
        prefix: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, PlacementError> {
        Ok(self.get_prefix_at(prefix).await?.0)
    }

    /// The keys under `prefix` and the store revision they were read at.
    async fn get_prefix_at(
        &self,
        prefix: &str,
    ) -> Result<(Vec<(String, Vec<u8>)>, i64), PlacementError> {
        let mut kv = self.inner.client.kv_client();
        let options = GetOptions::new().with_prefix();
        let mut resp = self.call(None, kv.get(prefix, Some(options))).await?;
        let revision = resp.header().map_or(0, |h| h.revision());
        let kvs = resp
            .take_kvs()
            .into_iter()
            .filter_map(|kv| {
                let (key, value) = kv.into_key_value();
                utf8_key(key).map(|k| (k, value))
            })
            .collect();
        Ok((kvs, revision))
    }

    pub(crate) async fn grant_lease(&self, ttl: Duration) -> Result<LeaseId, PlacementError> {
        let mut lease = self.inner.client.lease_client();
        let resp = self.call(None, lease.grant(ttl_secs(ttl), None)).await?;
        Ok(LeaseId(resp.id()))
    }

    pub(crate) async fn revoke_lease(&self, LeaseId(id): LeaseId) -> Result<(), PlacementError> {
        let mut lease = self.inner.client.lease_client();
        match self.call(Some(id), lease.revoke(id)).await {
            Ok(_) | Err(PlacementError::LeaseNotFound(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    pub(crate) async fn keep_alive_once(
        &self,
        LeaseId(id): LeaseId,
    ) -> Result<bool, PlacementError> {
        let mut lease = self.inner.client.lease_client();
        // Opens a keep-alive stream, sends one request and reads one answer
        // (TTL 0 = lease unknown). A stream per call costs a little more than
        // one long-lived stream but cannot get stuck on a dead connection.
        match self.call(Some(id), lease.keep_alive(id)).await {
            Ok(_) => Ok(true),
            Err(PlacementError::LeaseNotFound(_)) => Ok(false),
            Err(e) => Err(e),
        }
    }

    pub(crate) fn watch_prefix(&self, prefix: &str) -> Watch {
        let (tx, rx) = mpsc::channel(WATCH_BUFFER);
        let task = tokio::spawn(run_watch(self.clone(), prefix.to_owned(), tx));
        Watch::new(rx, task)
    }
}

fn utf8_key(key: Vec<u8>) -> Option<String> {
    match String::from_utf8(key) {
        Ok(k) => Some(k),
        Err(e) => {
            // Placement only writes UTF-8 keys; skip whatever else shares the prefix.
            tracing::warn!(key = ?e.as_bytes(), "ignoring non-UTF-8 etcd key");
            None
        }
    }
}

/// Why a watch session ended.
enum Lost {
    /// The `Watch` was dropped: stop.
    ConsumerGone,
    /// etcd unreachable, stream broken, watch canceled (compaction, no leader).
    Etcd(String),
}

impl From<PlacementError> for Lost {
    fn from(e: PlacementError) -> Self {
        Self::Etcd(e.to_string())
    }
}

/// The watch task: sessions of (snapshot, then deltas) until the consumer goes
/// away, with backoff between them. Each session starts with a `Resync`, so a
/// consumer never has to know that a session ended.
async fn run_watch(store: EtcdStore, prefix: String, tx: mpsc::Sender<WatchEvent>) {
    let mut backoff = Backoff::new(WATCH_RETRY_MIN, WATCH_RETRY_MAX);
    let mut failures = 0u32;
    loop {
        let lost = tokio::select! {
            _ = tx.closed() => return,
            lost = watch_session(&store, &prefix, &tx, &mut backoff, &mut failures) => lost,
        };
        match lost {
            Lost::ConsumerGone => return,
            Lost::Etcd(why) if failures == 0 => {
                tracing::warn!(%prefix, %why, "etcd watch lost; reconnecting");
            }
            Lost::Etcd(why) => tracing::debug!(%prefix, %why, failures, "etcd watch retry failed"),
        }
        failures = failures.saturating_add(1);
        let delay = backoff.next_delay();
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(delay) => {}
        }
    }
}

/// One session: read the prefix at revision R, watch from R + 1 (so nothing
/// between the read and the watch is missed), and once etcd confirms the watch,
/// emit `Resync` and forward events until the stream fails.
async fn watch_session(
    store: &EtcdStore,
    prefix: &str,
    tx: &mpsc::Sender<WatchEvent>,
    backoff: &mut Backoff,
    failures: &mut u32,
) -> Lost {
    let (kvs, revision) = match store.get_prefix_at(prefix).await {
        Ok(r) => r,
        Err(e) => return e.into(),
    };
    let mut watcher = store.inner.client.watch_client();
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(revision + 1);
    let mut stream = match store.call(None, watcher.watch(prefix, Some(options))).await {
        Ok(s) => s,
        Err(e) => return e.into(),
    };
    // etcd answers a create request with a `created` (or `canceled`, e.g. when
    // R + 1 was compacted meanwhile) message before any event.
    let first = store.call(None, stream.message()).await;
    match first {
        Ok(Some(resp)) if resp.created() && !resp.canceled() => {}
        Ok(Some(resp)) => {
            return Lost::Etcd(format!("watch not created: {}", resp.cancel_reason()));
        }
        Ok(None) => return Lost::Etcd("watch stream closed before creation".into()),
        Err(e) => return e.into(),
    }
    if *failures > 0 {
        tracing::info!(%prefix, revision, keys = kvs.len(), "etcd watch re-established; resyncing");
    }
    if tx.send(WatchEvent::Resync(kvs)).await.is_err() {
        return Lost::ConsumerGone;
    }
    backoff.reset();
    *failures = 0;
    loop {
        let resp = match stream.message().await {
            Ok(Some(resp)) => resp,
            Ok(None) => return Lost::Etcd("watch stream closed".into()),
            Err(e) => return from_etcd(e, None).into(),
        };
        if resp.canceled() {
            return Lost::Etcd(format!(
                "watch canceled: {} (compact revision {})",
                resp.cancel_reason(),
                resp.compact_revision()
            ));
        }
        for event in resp.events() {
            let Some(kv) = event.kv() else { continue };
            let Some(key) = utf8_key(kv.key().to_vec()) else {
                continue;
            };
            let event = match event.event_type() {
                EventType::Put => WatchEvent::Put(key, kv.value().to_vec()),
                EventType::Delete => WatchEvent::Delete(key),
            };
            if tx.send(event).await.is_err() {
                return Lost::ConsumerGone;
            }
        }
    }
}
