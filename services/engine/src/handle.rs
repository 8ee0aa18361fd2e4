//! The engine on its own OS thread, and the small handle the rest of a process uses to reach it.
//!
//! The hot path is not async: one thread owns the [`Engine`] and loops `commands → step →
//! deliver`. Async code (gRPC, HTTP) talks to it through an [`EngineHandle`]: `submit` sends the
//! request over a channel and waits for admission on a oneshot; tokens come back on a
//! per-request channel. Dropping the [`RequestStream`] before it finished aborts the request,
//! which frees its KV blocks before the next step is planned.
//!
//! When every handle is gone the loop finishes the requests in flight, then exits.
//!
//! Listeners to the prefix cache ([`EngineHandle::watch_kv`], the pool's KV events for
//! gateways) get a snapshot of every cached block first and then, after each step, what was
//! stored and evicted, with the engine's load; the loop sends both, so nothing falls between
//! them. A listener that falls [`KV_WATCH_BUFFER`] updates behind is dropped (its stream ends)
//! rather than slowing the loop: it reconnects and starts again from a snapshot.
//!
//! In a tensor-parallel pool the loop is the leader's: while idle it tells the other ranks it
//! is alive. If the pool loses a rank, every request in the engine fails with that error (a
//! server fault, UNAVAILABLE upstream), the loop exits, and [`EngineHandle::lost`] resolves
//! with the reason, so the worker can leave. A panic on the engine thread ends it the same
//! way: the requests' streams close (UNAVAILABLE upstream) and `lost` resolves.

use std::collections::HashMap;
use std::collections::HashSet;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc as tmpsc, oneshot, watch};

use crate::constraint::Constraint;
use crate::engine::{Engine, EngineStats, TokenEvent};
use crate::error::{EngineError, Result};
use crate::kv_cache::{BlockHash, KvEvent};
use crate::sampler::SamplingParams;
use crate::scheduler::SeqId;

enum Command {
    Add {
        id: SeqId,
        prompt: Vec<u32>,
        params: Box<SamplingParams>,
        constraint: Option<Box<dyn Constraint>>,
        events: tmpsc::UnboundedSender<Result<TokenEvent>>,
        admitted: oneshot::Sender<Result<()>>,
    },
    Abort(SeqId),
    /// Fails every request in the engine with this reason (a drain that ran out of time).
    AbortAll(String),
    WatchKv(tmpsc::Sender<KvUpdate>),
}

/// Updates a prefix-cache listener may fall behind by before it is dropped.
pub const KV_WATCH_BUFFER: usize = 1024;

/// Load-only updates (no block stored or evicted) go out at most this often while busy.
const LOAD_UPDATE_INTERVAL: Duration = Duration::from_millis(50);

/// What the prefix cache holds, or how it changed, for a listener.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvUpdate {
    /// The first update of a watch: `stored` is everything cached now (forget what you knew).
    pub snapshot: bool,
    /// Blocks evicted, then blocks stored: apply in that order.
    pub removed: Vec<BlockHash>,
    pub stored: Vec<BlockHash>,
    /// The engine's load as of this update.
    pub stats: EngineStats,
}

/// How this engine names its blocks, for listeners that hash prompts themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheInfo {
    pub block_size: usize,
    /// The seed of the hashes; `None`: prefix caching is off.
    pub seed: Option<BlockHash>,
    pub num_blocks: usize,
}

/// A cloneable way to submit requests to the engine thread.
#[derive(Debug, Clone)]
pub struct EngineHandle {
    tx: Sender<Command>,
    next_id: Arc<AtomicU64>,
    stats: Arc<Mutex<EngineStats>>,
    /// Set (once) when the pool was lost and the engine thread stopped.
    lost: watch::Receiver<Option<String>>,
    prefix_cache: PrefixCacheInfo,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Add { id, .. } => write!(f, "Add({id})"),
            Command::Abort(id) => write!(f, "Abort({id})"),
            Command::AbortAll(why) => write!(f, "AbortAll({why})"),
            Command::WatchKv(_) => write!(f, "WatchKv"),
        }
    }
}

/// The token stream of one request. Dropping it early aborts the request.
#[derive(Debug)]
pub struct RequestStream {
    id: SeqId,
    rx: tmpsc::UnboundedReceiver<Result<TokenEvent>>,
    tx: Sender<Command>,
    finished: bool,
}

impl RequestStream {
    pub fn id(&self) -> SeqId {
        self.id
    }

    /// The next token, an engine error, or `None` after the last token.
    pub async fn next(&mut self) -> Option<Result<TokenEvent>> {
        if self.finished {
            return None;
        }
        let item = self.rx.recv().await;
        match &item {
            Some(Ok(ev)) if ev.finish.is_none() => {}
            _ => self.finished = true,
        }
        match item {
            Some(i) => Some(i),
            None => Some(Err(EngineError::Stopped)),
        }
    }
}

impl Drop for RequestStream {
    fn drop(&mut self) {
        if !self.finished {
            let _ = self.tx.send(Command::Abort(self.id));
        }
    }
}

impl EngineHandle {
    /// Starts the engine thread. At most `max_waiting` requests wait for admission; more are
    /// refused with [`EngineError::QueueFull`].
    pub fn spawn(
        mut engine: Engine,
        max_waiting: usize,
    ) -> std::io::Result<(Self, JoinHandle<()>)> {
        let (tx, rx) = mpsc::channel();
        let prefix_cache = PrefixCacheInfo {
            block_size: engine.block_size(),
            seed: engine.prefix_cache_seed(),
            num_blocks: engine.stats().kv_blocks_total,
        };
        engine.record_kv_events(prefix_cache.seed.is_some());
        let stats = Arc::new(Mutex::new(engine.stats()));
        let loop_stats = stats.clone();
        let (lost_tx, lost) = watch::channel(None);
        let thread = std::thread::Builder::new()
            .name("ferrite-engine".into())
            .spawn(move || {
                // However the loop ends but by every handle going (a lost pool, a panic
                // anywhere under it), `lost` says so: the worker then leaves placement and
                // exits non-zero instead of serving on without an engine.
                let ended = catch_unwind(AssertUnwindSafe(|| {
                    run(engine, rx, loop_stats, max_waiting)
                }));
                let why = match ended {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => e.to_string(),
                    Err(panic) => format!("the engine thread panicked: {}", panic_text(&*panic)),
                };
                tracing::error!("the engine stopped: {why}");
                let _ = lost_tx.send(Some(why));
            })?;
        Ok((
            Self {
                tx,
                next_id: Arc::new(AtomicU64::new(1)),
                stats,
                lost,
                prefix_cache,
            },
            thread,
        ))
    }

    /// How the engine names its KV blocks (and whether it caches prefixes at all).
    pub fn prefix_cache(&self) -> PrefixCacheInfo {
        self.prefix_cache
    }

    /// Follows the prefix cache: the first update is a snapshot of every cached block, the
    /// next ones what each step stored and evicted, with the load. The channel closes when the
    /// engine stops, or when this listener fell [`KV_WATCH_BUFFER`] updates behind.
    pub fn watch_kv(&self) -> Result<tmpsc::Receiver<KvUpdate>> {
        let (tx, rx) = tmpsc::channel(KV_WATCH_BUFFER);
        self.tx
            .send(Command::WatchKv(tx))
            .map_err(|_| EngineError::Stopped)?;
        Ok(rx)
    }

    /// Resolves when the engine stopped by itself, with why: its pool was lost (a rank died),
    /// or the engine thread panicked. Never while it serves, nor when it ended because every
    /// handle was gone.
    pub async fn lost(&self) -> String {
        let mut rx = self.lost.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(why) => why.clone().unwrap_or_default(),
            // The thread ended without a loss (every handle gone): never resolve.
            Err(_) => std::future::pending().await,
        }
    }

    /// Fails every request queued or running now with [`EngineError::ShutDown`] (`why`) and
    /// frees their KV blocks; the engine goes on serving new requests. A drain whose time ran
    /// out calls it, so the worker ends when it said it would.
    pub fn abort_all(&self, why: impl Into<String>) -> Result<()> {
        self.tx
            .send(Command::AbortAll(why.into()))
            .map_err(|_| EngineError::Stopped)
    }

    /// Load figures as of the last step.
    pub fn stats(&self) -> EngineStats {
        *self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a request; returns its token stream once the engine accepted it, or the reason
    /// it refused (bad parameters, prompt too long, queue full).
    pub async fn submit(&self, prompt: Vec<u32>, params: SamplingParams) -> Result<RequestStream> {
        self.submit_constrained(prompt, params, None).await
    }

    /// [`EngineHandle::submit`] for a request whose output follows `constraint`.
    pub async fn submit_constrained(
        &self,
        prompt: Vec<u32>,
        params: SamplingParams,
        constraint: Option<Box<dyn Constraint>>,
    ) -> Result<RequestStream> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (events, rx) = tmpsc::unbounded_channel();
        let (admitted, admission) = oneshot::channel();
        self.tx
            .send(Command::Add {
                id,
                prompt,
                params: Box::new(params),
                constraint,
                events,
                admitted,
            })
            .map_err(|_| EngineError::Stopped)?;
        // The stream exists before admission is awaited, so a submitter dropped at any point
        // from here on (client cancelled, deadline) sends the abort itself: the engine may
        // have admitted the request after the caller stopped listening.
        let mut stream = RequestStream {
            id,
            rx,
            tx: self.tx.clone(),
            finished: false,
        };
        match admission.await {
            Ok(Ok(())) => Ok(stream),
            Ok(Err(e)) => {
                stream.finished = true;
                Err(e)
            }
            Err(_) => {
                stream.finished = true;
                Err(EngineError::Stopped)
            }
        }
    }
}

/// A panic's message (its payload, when it is a string).
fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".to_owned())
}

type Streams = HashMap<SeqId, tmpsc::UnboundedSender<Result<TokenEvent>>>;

/// The prefix-cache listeners and what they were last told.
#[derive(Default)]
struct Watchers {
    senders: Vec<tmpsc::Sender<KvUpdate>>,
    last_stats: EngineStats,
    last_sent: Option<Instant>,
}

impl Watchers {
    /// Sends `engine`'s cache to a new listener.
    fn add(&mut self, engine: &Engine, tx: tmpsc::Sender<KvUpdate>) {
        let stats = engine.stats();
        let snapshot = KvUpdate {
            snapshot: true,
            stored: engine.cached_block_hashes(),
            removed: Vec::new(),
            stats,
        };
        if tx.try_send(snapshot).is_ok() {
            self.senders.push(tx);
        }
    }

    /// Sends what changed since the last call: the blocks stored and evicted (netted, so each
    /// hash appears once, where its last event puts it), with the load; a load-only update at
    /// most every [`LOAD_UPDATE_INTERVAL`] while busy, at once when idle.
    fn publish(&mut self, engine: &mut Engine) {
        let events = engine.take_kv_events();
        if self.senders.is_empty() {
            return;
        }
        let stats = engine.stats();
        let due = self
            .last_sent
            .is_none_or(|t| t.elapsed() >= LOAD_UPDATE_INTERVAL || !engine.has_unfinished());
        if events.is_empty() && (stats == self.last_stats || !due) {
            return;
        }
        let (mut stored, mut removed) = (HashSet::new(), HashSet::new());
        for e in events {
            match e {
                KvEvent::Stored(h) => {
                    removed.remove(&h);
                    stored.insert(h);
                }
                KvEvent::Removed(h) => {
                    stored.remove(&h);
                    removed.insert(h);
                }
            }
        }
        let update = KvUpdate {
            snapshot: false,
            stored: stored.into_iter().collect(),
            removed: removed.into_iter().collect(),
            stats,
        };
        // A listener that is gone or too far behind is dropped; it resyncs when it returns.
        self.senders
            .retain(|tx| tx.try_send(update.clone()).is_ok());
        self.last_stats = stats;
        self.last_sent = Some(Instant::now());
    }
}

/// The engine thread's loop. Returns `Err` when the pool was lost (every request failed).
fn run(
    mut engine: Engine,
    rx: Receiver<Command>,
    stats: Arc<Mutex<EngineStats>>,
    max_waiting: usize,
) -> Result<()> {
    let mut streams = Streams::new();
    let mut watchers = Watchers::default();
    let mut connected = true;
    loop {
        watchers.publish(&mut engine);
        // Idle: block for the next command (waking now and then to notice a lost sender, and
        // to tell the other ranks of a pool that the leader is alive).
        if !engine.has_unfinished() {
            if !connected {
                return Ok(());
            }
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(cmd) => apply(&mut engine, &mut streams, &mut watchers, cmd, max_waiting),
                Err(RecvTimeoutError::Timeout) => {
                    engine.keep_alive()?;
                    continue;
                }
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        }
        loop {
            match rx.try_recv() {
                Ok(cmd) => apply(&mut engine, &mut streams, &mut watchers, cmd, max_waiting),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => {
                    connected = false;
                    break;
                }
            }
        }
        match engine.step() {
            Ok(out) => {
                for (id, e) in out.failed {
                    if let Some(tx) = streams.remove(&id) {
                        let _ = tx.send(Err(e));
                    }
                }
                deliver(&mut engine, &mut streams, out.events);
            }
            Err(e) if e.is_fatal() => {
                // No step can run any more: every request fails, not just this step's.
                for (_, tx) in streams.drain() {
                    let _ = tx.send(Err(e.for_failed_step()));
                }
                return Err(e);
            }
            Err(e) => {
                // The engine dropped the requests of the failed step; tell their clients.
                let failed: Vec<SeqId> = streams
                    .keys()
                    .copied()
                    .filter(|id| !engine.contains(*id))
                    .collect();
                for id in failed {
                    if let Some(tx) = streams.remove(&id) {
                        // A server fault, never the request's: UNAVAILABLE or INTERNAL upstream.
                        let _ = tx.send(Err(e.for_failed_step()));
                    }
                }
            }
        }
        if let Ok(mut s) = stats.lock() {
            *s = engine.stats();
        }
    }
}

/// Sends a step's tokens to their streams; a stream whose client went away has its request
/// aborted (its blocks freed now).
fn deliver(engine: &mut Engine, streams: &mut Streams, events: Vec<TokenEvent>) {
    for ev in events {
        let id = ev.id;
        let last = ev.finish.is_some();
        let delivered = streams.get(&id).is_some_and(|tx| tx.send(Ok(ev)).is_ok());
        if !delivered {
            engine.abort(id);
            streams.remove(&id);
        } else if last {
            streams.remove(&id);
        }
    }
}

fn apply(
    engine: &mut Engine,
    streams: &mut Streams,
    watchers: &mut Watchers,
    cmd: Command,
    max_waiting: usize,
) {
    match cmd {
        Command::Add {
            prompt,
            params,
            admitted,
            ..
        } if engine.stats().waiting >= max_waiting => {
            // A bad request is refused as bad even when the queue is full.
            let err = engine
                .check_request(&prompt, &params)
                .err()
                .unwrap_or(EngineError::QueueFull(max_waiting));
            let _ = admitted.send(Err(err));
        }
        Command::Add {
            id,
            prompt,
            params,
            constraint,
            events,
            admitted,
        } => match engine.add_constrained(id, prompt, *params, constraint) {
            Ok(()) => {
                if admitted.send(Ok(())).is_ok() {
                    streams.insert(id, events);
                } else {
                    // The submitter gave up (cancelled, deadline) before admission: nothing
                    // would ever read or abort this request, so drop it now.
                    engine.abort(id);
                }
            }
            Err(e) => {
                let _ = admitted.send(Err(e));
            }
        },
        Command::Abort(id) => {
            engine.abort(id);
            streams.remove(&id);
        }
        Command::AbortAll(why) => {
            for (id, tx) in streams.drain() {
                engine.abort(id);
                let _ = tx.send(Err(EngineError::ShutDown(why.clone())));
            }
        }
        Command::WatchKv(tx) => watchers.add(engine, tx),
    }
}
