//! Forming a tensor-parallel pool through placement.
//!
//! Rank 0 binds the pool's collective listener, then writes how to reach it (the epoch, the
//! backend, the address) under `pools/{pool}/nccl` with a lease of its own, before it loads
//! its shard; the other ranks find the record with a watch while they load theirs. Once loaded,
//! every rank joins: rank 0 accepts the others, each of which says which epoch it joins (and
//! proves it knows the pool's secret, when there is one), so a rank that read the record of a
//! previous incarnation of the pool is refused instead of mixing two pools; once all are in,
//! rank 0 welcomes them. Every wait is bounded by the start-up timeout (a rank that loaded
//! early waits for rank 0's welcome that long), and the leader's error names the ranks that
//! never arrived. A rank whose try failed tries the newest record again shortly, whether or
//! not a new one was written.
//!
//! `ferrite serve --tp N` starts the other ranks itself and hands them the record on their
//! command line (`--comm-join`), since its placement store lives inside its own process.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use ferrite_collective::tcp::{JoinLimits, PoolKey, TcpCollective};
use ferrite_collective::{Collective, CollectiveError};
use ferrite_placement::{CommRecord, KeySchema, Registration, Store, WatchEvent};

/// How this process takes part in its pool.
#[derive(Debug, Clone)]
pub struct TpConfig {
    pub rank: u32,
    pub world: u32,
    /// Where rank 0 listens for the other ranks (port 0: any free port).
    pub comm_listen: SocketAddr,
    /// How long forming the pool may take (the other ranks load their shards meanwhile).
    pub start_timeout: Duration,
    /// How long one collective waits for a rank before the pool fails.
    pub collective_timeout: Duration,
    /// The leader's record, when the launcher handed it over (`--comm-join`): no watch.
    pub join: Option<CommRecord>,
    /// The secret every rank of the pool shares (empty: none; the epoch alone keeps stale
    /// ranks out).
    pub secret: Vec<u8>,
}

impl TpConfig {
    /// One rank, no collectives.
    pub fn solo() -> Self {
        Self {
            rank: 0,
            world: 1,
            comm_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            start_timeout: Duration::from_secs(300),
            collective_timeout: Duration::from_secs(30),
            join: None,
            secret: Vec::new(),
        }
    }
}

/// How long a rank waits between tries of a record that failed (a newer one is taken at once).
const RETRY_WAIT: Duration = Duration::from_millis(500);
/// How long one try to connect to rank 0 lasts, so a stale record does not hold up a newer one.
const CONNECT_PATIENCE: Duration = Duration::from_secs(5);

/// Why a pool did not form.
#[derive(Debug, thiserror::Error)]
pub enum RendezvousError {
    #[error("cannot listen for the pool's ranks on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Collective(#[from] CollectiveError),
    #[error(
        "rank {rank}: no usable record of rank 0 under {key} within {timeout:?} (is rank 0 of pool `{pool}` running, with the same --etcd and --tp?){last}"
    )]
    NoLeader {
        rank: u32,
        pool: String,
        key: String,
        timeout: Duration,
        last: String,
    },
    #[error("the forming thread: {0}")]
    Thread(String),
}

/// Rank 0's side before the pool forms: its listener, and the record it publishes.
#[derive(Debug)]
pub struct CommLeader {
    listener: TcpListener,
    record: CommRecord,
    registration: Option<Registration>,
}

impl CommLeader {
    /// Binds `listen`; the record names `advertise_host` (default: the listen IP; a loopback
    /// listener is named by its own IP, since only this host reaches it) and a new epoch.
    pub fn bind(
        listen: SocketAddr,
        advertise_host: Option<&str>,
        world: u32,
    ) -> Result<Self, RendezvousError> {
        let err = |source| RendezvousError::Listen {
            addr: listen,
            source,
        };
        let listener = TcpListener::bind(listen).map_err(err)?;
        let port = listener.local_addr().map_err(err)?.port();
        let host = match advertise_host {
            Some(h) if !listen.ip().is_loopback() => h.to_owned(),
            _ => listen.ip().to_string(),
        };
        Ok(Self {
            listener,
            record: CommRecord {
                epoch: new_epoch(),
                backend: "tcp".into(),
                address: join_host_port(&host, port),
                world,
            },
            registration: None,
        })
    }

    pub fn record(&self) -> &CommRecord {
        &self.record
    }

    /// Writes the record under `pools/{pool}/nccl`, under a lease of `ttl` kept while the
    /// pool lives.
    pub fn publish(&mut self, store: Store, schema: &KeySchema, pool: &str, ttl: Duration) {
        let entry = (
            schema.nccl(pool),
            ferrite_placement::keys::encode(&self.record),
        );
        self.registration = Some(Registration::start(store, ttl, vec![entry]));
    }

    /// Accepts the other ranks (the `comm_init` phase). Returns the collective and the
    /// registration that keeps the record alive (drop it when the pool ends).
    pub async fn accept(
        mut self,
        tp: &TpConfig,
    ) -> Result<(Box<dyn Collective>, Option<Registration>), RendezvousError> {
        let span = comm_init_span(tp, &self.record);
        let (start, io, secret) = (tp.start_timeout, tp.collective_timeout, tp.secret.clone());
        let registration = self.registration.take();
        let accepted = blocking(span, move || self.accept_now(start, io, secret)).await;
        match accepted {
            Ok(comm) => Ok((comm, registration)),
            Err(e) => {
                // The record names a pool that will not form: remove it now, not at the end of
                // its lease, so no rank tries it again.
                if let Some(r) = registration {
                    let _ = r.deregister().await;
                }
                Err(e)
            }
        }
    }

    /// [`Self::accept`] on this thread (blocking), for callers outside an async runtime:
    /// waits at most `start` for the ranks (who must know `secret`, if not empty); each
    /// collective then waits at most `io`.
    pub fn accept_now(
        self,
        start: Duration,
        io: Duration,
        secret: Vec<u8>,
    ) -> Result<Box<dyn Collective>, CollectiveError> {
        let key = PoolKey {
            world: self.record.world as usize,
            epoch: self.record.epoch,
            secret,
        };
        let comm = TcpCollective::lead(self.listener, &key, start, io)?;
        Ok(Box::new(comm))
    }

    /// Removes the published record now (rank 0 failed before the pool formed).
    pub async fn withdraw(mut self) {
        if let Some(r) = self.registration.take() {
            let _ = r.deregister().await;
        }
    }
}

/// A follower joins the pool (the `comm_init` phase): finds rank 0's record (given, or
/// watched for under `pools/{pool}/nccl`) and connects, then waits for rank 0's welcome. After
/// a failed try it tries the newest record again (a newer one at once, the same one after
/// [`RETRY_WAIT`]), until the start-up timeout.
pub async fn join(
    store: Option<&Store>,
    schema: &KeySchema,
    pool: &str,
    tp: &TpConfig,
) -> Result<Box<dyn Collective>, RendezvousError> {
    let deadline = Instant::now() + tp.start_timeout;
    let key = schema.nccl(pool);
    let mut watch = store.map(|s| s.watch_prefix(&key));
    let mut record = tp.join.clone();
    let mut last = String::new();
    loop {
        if let Some(w) = watch.as_mut() {
            // None known yet: wait for one. After a failed try: a little, for a newer one.
            let left = deadline.saturating_duration_since(Instant::now());
            let wait = if record.is_none() {
                left
            } else {
                RETRY_WAIT.min(left)
            };
            if let Ok(Some(event)) = tokio::time::timeout(wait, w.recv()).await
                && let Some(r) = record_in(event, &key)
            {
                record = Some(r);
            }
        }
        if let Some(r) = &record {
            if r.world != tp.world {
                last = format!(
                    "; rank 0 forms a pool of {} ranks, this rank was started with --tp {}",
                    r.world, tp.world
                );
            } else {
                match connect(r, tp, deadline).await {
                    Ok(comm) => return Ok(comm),
                    Err(e) => last = format!("; last try, at {}: {e}", r.address),
                }
            }
        }
        if Instant::now() >= deadline || watch.is_none() && tp.join.is_none() {
            return Err(RendezvousError::NoLeader {
                rank: tp.rank,
                pool: pool.to_owned(),
                key,
                timeout: tp.start_timeout,
                last,
            });
        }
        if watch.is_none() {
            // A record handed over on the command line: try it again shortly.
            tokio::time::sleep(RETRY_WAIT.min(deadline.saturating_duration_since(Instant::now())))
                .await;
        }
    }
}

/// The record in a watch event of `key`, if the event carries one that decodes.
fn record_in(event: WatchEvent, key: &str) -> Option<CommRecord> {
    let value = match event {
        WatchEvent::Resync(kvs) => kvs.into_iter().find(|(k, _)| k == key)?.1,
        WatchEvent::Put(k, v) if k == key => v,
        _ => return None,
    };
    ferrite_placement::keys::decode(key, &value).ok()
}

/// Connects to rank 0 as `r` says and waits for its welcome, at most until `deadline`.
async fn connect(
    r: &CommRecord,
    tp: &TpConfig,
    deadline: Instant,
) -> Result<Box<dyn Collective>, RendezvousError> {
    let addr = tokio::net::lookup_host(&r.address)
        .await
        .ok()
        .and_then(|mut a| a.next())
        .ok_or_else(|| {
            RendezvousError::Collective(CollectiveError::Rendezvous(format!(
                "cannot resolve {}",
                r.address
            )))
        })?;
    let rank = tp.rank as usize;
    let key = PoolKey {
        world: tp.world as usize,
        epoch: r.epoch,
        secret: tp.secret.clone(),
    };
    let left = deadline.saturating_duration_since(Instant::now());
    let limits = JoinLimits {
        connect: left.min(CONNECT_PATIENCE),
        welcome: left,
        collective: tp.collective_timeout,
    };
    let span = comm_init_span(tp, r);
    let comm = blocking(span, move || TcpCollective::join(addr, rank, &key, limits)).await?;
    Ok(Box::new(comm))
}

fn comm_init_span(tp: &TpConfig, r: &CommRecord) -> tracing::Span {
    tracing::info_span!(target: ferrite_telemetry::phases::TARGET, "comm_init",
        backend = %r.backend, rank = i64::from(tp.rank), world = i64::from(tp.world),
        address = %r.address, epoch = r.epoch as i64)
}

/// Runs blocking socket work off the async runtime, inside `span`.
async fn blocking<T: Send + 'static>(
    span: tracing::Span,
    f: impl FnOnce() -> Result<T, CollectiveError> + Send + 'static,
) -> Result<T, RendezvousError> {
    tokio::task::spawn_blocking(move || span.in_scope(f))
        .await
        .map_err(|e| RendezvousError::Thread(e.to_string()))?
        .map_err(RendezvousError::from)
}

/// `host:port`, with an IPv6 host in brackets.
fn join_host_port(host: &str, port: u16) -> String {
    if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// A new pool epoch: the time and the process id, so two incarnations never share one.
fn new_epoch() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    nanos ^ (u64::from(std::process::id()) << 48)
}
