//! `ferrite worker`, `ferrite gateway` and `ferrite serve` (both in one process).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use ferrite_collective::{Collective, Solo};
use ferrite_engine::registry;
use ferrite_engine::tp::TpRank;
use ferrite_placement::CommRecord;
use ferrite_placement::{KeySchema, Store};
use ferrite_worker::rendezvous::{self, CommLeader, TpConfig};
use ferrite_worker::{RunningFollower, RunningWorker, WorkerConfig};

use ferrite_telemetry::Telemetry;
use ferrite_telemetry::phases;
use tracing::Instrument;

use crate::loading::{GenerationConfig, ModelArgs};
use crate::placement_args::PlacementArgs;
use crate::security_args::{AccessArgs, ListenTlsArgs, UpstreamArgs, WorkerTlsArgs};
use crate::serve_ranks::{RankLaunch, RankProcesses};

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The pool this rank belongs to.
    #[arg(long, default_value = "pool-0", env = "FERRITE_POOL")]
    pool: String,
    /// This process's rank in the pool: 0 leads (serves the worker API, schedules, samples);
    /// the others run its step plans on their shards.
    #[arg(long, default_value_t = 0, env = "FERRITE_RANK")]
    rank: u32,
    /// Ranks in the pool (tensor-parallel size): each holds 1/N of the model.
    #[arg(long, default_value_t = 1, env = "FERRITE_TP")]
    tp: u32,
    #[command(flatten)]
    comm: CommArgs,
    /// Worker gRPC listen address (port 0 = any free port).
    #[arg(long, default_value = "127.0.0.1:0", env = "FERRITE_LISTEN")]
    listen: SocketAddr,
    /// Host other processes reach this worker at (default: the listen IP).
    #[arg(long, env = "FERRITE_ADVERTISE_HOST")]
    advertise_host: Option<String>,
    /// Name clients use for this model (default: the --model name, or the file's stem).
    #[arg(long, env = "FERRITE_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    #[arg(long, default_value_t = 256, env = "FERRITE_MAX_WAITING")]
    max_waiting: usize,
    #[arg(long, default_value_t = 5, env = "FERRITE_LEASE_TTL_S")]
    lease_ttl_s: u64,
    #[arg(long, default_value_t = 30, env = "FERRITE_DRAIN_TIMEOUT_S")]
    drain_timeout_s: u64,
    /// What requests that leave temperature, top_p, top_k, min_p or repetition_penalty unset
    /// are sampled with: `auto`, the model's recommendation (generation_config.json, GGUF
    /// metadata, or a known model's card), or `none` (temperature 1, no truncation).
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "FERRITE_GENERATION_CONFIG"
    )]
    generation_config: GenerationConfig,
    /// Where to serve Prometheus `/metrics` (port 0 = any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:0", env = "FERRITE_METRICS_LISTEN")]
    metrics_listen: SocketAddr,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    tls: ListenTlsArgs,
}

/// How the ranks of a tensor-parallel pool find and wait for each other.
#[derive(Debug, Clone, Args)]
pub struct CommArgs {
    /// Where rank 0 listens for the pool's other ranks (default: the --listen IP, any free
    /// port); the address published is --advertise-host's with this port.
    #[arg(long, env = "FERRITE_COMM_LISTEN")]
    comm_listen: Option<SocketAddr>,
    /// How long forming the pool may take, in seconds (the ranks load their shards meanwhile).
    #[arg(long, default_value_t = 300, env = "FERRITE_TP_START_TIMEOUT_S")]
    tp_start_timeout_s: u64,
    /// How long a collective waits for a rank before the pool fails, in seconds.
    #[arg(long, default_value_t = 30, env = "FERRITE_COLLECTIVE_TIMEOUT_S")]
    collective_timeout_s: u64,
    /// Join rank 0 at this `host:port` instead of finding it in placement (`ferrite serve
    /// --tp N` sets it for the ranks it starts).
    #[arg(long, hide = true, requires = "comm_epoch")]
    comm_join: Option<String>,
    /// The pool epoch to join with --comm-join.
    #[arg(long, hide = true)]
    comm_epoch: Option<u64>,
    /// A file holding a secret every rank of the pool shares (a Kubernetes Secret, say): a
    /// rank must prove it knows it to join. The collective port is plaintext TCP and belongs
    /// on a private network either way.
    #[arg(long, env = "FERRITE_COMM_SECRET_FILE")]
    comm_secret_file: Option<std::path::PathBuf>,
    /// The secret itself (`ferrite serve --tp N` hands its ranks a fresh one this way).
    #[arg(long, hide = true, env = "FERRITE_COMM_SECRET", hide_env_values = true)]
    comm_secret: Option<String>,
}

impl Default for CommArgs {
    fn default() -> Self {
        Self {
            comm_listen: None,
            tp_start_timeout_s: 300,
            collective_timeout_s: 30,
            comm_join: None,
            comm_epoch: None,
            comm_secret_file: None,
            comm_secret: None,
        }
    }
}

impl CommArgs {
    /// The pool's secret, from the file or the value (empty: none).
    fn secret(&self) -> Result<Vec<u8>> {
        if let Some(path) = &self.comm_secret_file {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading the pool secret {}", path.display()))?;
            let secret = text.trim().as_bytes().to_vec();
            anyhow::ensure!(
                !secret.is_empty(),
                "the pool secret {} is empty",
                path.display()
            );
            return Ok(secret);
        }
        Ok(self
            .comm_secret
            .as_deref()
            .map(|s| s.as_bytes().to_vec())
            .unwrap_or_default())
    }
}

impl WorkerArgs {
    /// This rank's place in the pool, checked.
    fn tp_config(&self) -> Result<TpConfig> {
        anyhow::ensure!(
            self.tp >= 1 && self.rank < self.tp,
            "--rank {} of --tp {}: the rank must be below the pool size",
            self.rank,
            self.tp
        );
        let c = &self.comm;
        let join = match (&c.comm_join, c.comm_epoch) {
            (Some(address), Some(epoch)) => Some(CommRecord {
                epoch,
                backend: "tcp".into(),
                address: address.clone(),
                world: self.tp,
            }),
            _ => None,
        };
        Ok(TpConfig {
            rank: self.rank,
            world: self.tp,
            comm_listen: c
                .comm_listen
                .unwrap_or_else(|| SocketAddr::new(self.listen.ip(), 0)),
            start_timeout: Duration::from_secs(c.tp_start_timeout_s.max(1)),
            collective_timeout: Duration::from_secs(c.collective_timeout_s.max(1)),
            join,
            secret: c.secret()?,
        })
    }

    fn lease_ttl(&self) -> Duration {
        Duration::from_secs(self.lease_ttl_s.max(1))
    }
}

/// How the gateway turns a request's JSON schema into a grammar.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct SchemaArgs {
    /// Bound what a JSON schema leaves unbounded, so that a small model held to it ends:
    /// strings 48 characters, arrays 4 items (1 with `uniqueItems`), free values 2 deep (a
    /// schema's own `maxLength`, `maxItems` and the like win). Off by default: a schema's strings and arrays are as long
    /// as the model writes them, up to `max_tokens`.
    #[arg(long, env = "FERRITE_JSON_SCHEMA_BOUNDS")]
    pub json_schema_bounds: bool,
}

#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// Public gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:50051", env = "FERRITE_LISTEN")]
    listen: SocketAddr,
    /// OpenAI-compatible HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:8000", env = "FERRITE_HTTP_LISTEN")]
    http_listen: SocketAddr,
    /// How to pick a pool: `kv` (the pool whose prefix cache saves the most work, weighed
    /// against its backlog; power of two choices for cold requests and ties) or `p2c` (power
    /// of two choices on requests in flight).
    #[arg(long, default_value = "kv", env = "FERRITE_ROUTING")]
    routing: ferrite_gateway::Routing,
    #[command(flatten)]
    schema: SchemaArgs,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    access: AccessArgs,
    #[command(flatten)]
    tls: ListenTlsArgs,
    #[command(flatten)]
    worker_tls: WorkerTlsArgs,
    #[command(flatten)]
    upstream: UpstreamArgs,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Public gRPC listen address.
    #[arg(
        long,
        alias = "grpc-listen",
        default_value = "127.0.0.1:50051",
        env = "FERRITE_LISTEN"
    )]
    listen: SocketAddr,
    /// OpenAI-compatible HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:8000", env = "FERRITE_HTTP_LISTEN")]
    http_listen: SocketAddr,
    /// Name clients use for this model (default: the --model name, or the file's stem).
    #[arg(long, env = "FERRITE_SERVED_MODEL_NAME")]
    served_model_name: Option<String>,
    /// How the gateway picks a pool (with pools of other processes through --etcd): `kv` or
    /// `p2c`, as `ferrite gateway --routing`.
    #[arg(long, default_value = "kv", env = "FERRITE_ROUTING")]
    routing: ferrite_gateway::Routing,
    #[command(flatten)]
    schema: SchemaArgs,
    /// The pool name this process registers.
    #[arg(long, default_value = "local", env = "FERRITE_POOL")]
    pool: String,
    /// Ranks of the pool (tensor-parallel size): this process is rank 0 and starts ranks
    /// 1..N as processes of their own, each holding 1/N of the model.
    #[arg(long, default_value_t = 1, env = "FERRITE_TP")]
    tp: u32,
    /// Where the in-process worker listens (port 0 = any free port): set it, with
    /// --advertise-host, when gateways of other processes route to this pool through --etcd.
    #[arg(long, default_value = "127.0.0.1:0", env = "FERRITE_WORKER_LISTEN")]
    worker_listen: SocketAddr,
    /// Host other processes reach the in-process worker at (default: its listen IP).
    #[arg(long, env = "FERRITE_ADVERTISE_HOST")]
    advertise_host: Option<String>,
    #[arg(long, default_value_t = 256, env = "FERRITE_MAX_WAITING")]
    max_waiting: usize,
    #[arg(long, default_value_t = 30, env = "FERRITE_DRAIN_TIMEOUT_S")]
    drain_timeout_s: u64,
    /// Sampling defaults for requests that leave them unset: `auto` (the model's
    /// recommendation) or `none`, as `ferrite worker --generation-config`.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "FERRITE_GENERATION_CONFIG"
    )]
    generation_config: GenerationConfig,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    access: AccessArgs,
    /// TLS of the public listeners (the in-process worker stays on loopback, in plaintext).
    #[command(flatten)]
    tls: ListenTlsArgs,
    #[command(flatten)]
    upstream: UpstreamArgs,
}

impl ServeArgs {
    /// The worker half of `serve`: rank 0 of one pool (on a free loopback port by default),
    /// whose ranks share `secret`.
    fn worker_args(&self, secret: &str) -> WorkerArgs {
        WorkerArgs {
            model: self.model.clone(),
            pool: self.pool.clone(),
            rank: 0,
            tp: self.tp,
            // The ranks it starts are on this host: rank 0 listens for them on loopback.
            comm: CommArgs {
                comm_listen: Some(SocketAddr::from(([127, 0, 0, 1], 0))),
                comm_secret: Some(secret.to_owned()),
                ..CommArgs::default()
            },
            listen: self.worker_listen,
            advertise_host: self.advertise_host.clone(),
            served_model_name: self.served_model_name.clone(),
            max_waiting: self.max_waiting,
            lease_ttl_s: 5,
            drain_timeout_s: self.drain_timeout_s,
            generation_config: self.generation_config,
            metrics_listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            placement: self.placement.clone(),
            tls: ListenTlsArgs::default(),
        }
    }
}

fn served_name(args: &WorkerArgs) -> String {
    if let Some(n) = &args.served_model_name {
        return n.clone();
    }
    // A known name, or a Hub repository (`Qwen/Qwen2.5-0.5B-Instruct`, as vLLM serves it),
    // is the model's name as given.
    let name = &args.model.model;
    if registry::known(name).is_some()
        || (!Path::new(name).exists() && ferrite_hub::RepoRef::parse(name).is_some())
    {
        return name.clone();
    }
    let p = Path::new(&args.model.model);
    p.file_stem().map_or_else(
        || args.model.model.clone(),
        |s| s.to_string_lossy().into_owned(),
    )
}

/// Runs `main` on a fresh multi-threaded runtime, then shuts it down without waiting for its
/// blocking tasks: a start that failed can leave one behind (rank 0 accepting ranks that have
/// already exited, up to its start-up timeout), and the process must exit with its error now.
fn run<T>(main: impl std::future::Future<Output = Result<T>>) -> Result<T> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ferrite-io")
        .build()
        .context("starting the async runtime")?;
    let out = rt.block_on(main);
    rt.shutdown_timeout(Duration::from_millis(500));
    out
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// Runs a process's start-up under its `startup` span: the root of its start-up phases, or the
/// child of the context in `TRACEPARENT` when its launcher set one (so all ranks of a pool share
/// one trace). The span ends with `start`, and the trace is sent at once, not with the next
/// batch.
async fn start_up<T>(
    role: &'static str,
    telemetry: &Telemetry,
    start: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let span = tracing::info_span!(target: phases::TARGET, "startup", role,
        pid = i64::from(std::process::id()));
    ferrite_telemetry::propagation::set_parent_from_env(&span);
    let started = start.instrument(span).await?;
    telemetry.flush();
    Ok(started)
}

/// A started rank: the leader (rank 0, serving the worker API) or a follower.
#[derive(Debug)]
enum Started {
    Leader(Box<RunningWorker>),
    Follower(RunningFollower),
}

/// Rank 0 of a pool of several: binds the pool's listener and publishes it under
/// `pools/{pool}/nccl` before the shard loads, so the other ranks find it while they load.
fn bind_leader(args: &WorkerArgs, store: &Store, schema: &KeySchema) -> Result<Option<CommLeader>> {
    let tp = args.tp_config()?;
    if tp.world == 1 || tp.rank != 0 {
        return Ok(None);
    }
    let mut leader = CommLeader::bind(tp.comm_listen, args.advertise_host.as_deref(), tp.world)?;
    leader.publish(store.clone(), schema, &args.pool, args.lease_ttl());
    Ok(Some(leader))
}

/// Loads this rank's shard, forms the pool (the `comm_init` phase) and starts the rank; its
/// phases are spans under the current span. `store` is `None` only for a follower handed its
/// leader on the command line without placement.
async fn start_worker(
    args: &WorkerArgs,
    leader: Option<CommLeader>,
    metrics_listen: Option<SocketAddr>,
    store: Option<Store>,
    schema: KeySchema,
) -> Result<Started> {
    let tp = args.tp_config()?;
    let shard = TpRank::new(tp.rank as usize, tp.world as usize)?;
    let model_args = args.model.for_rank(shard.rank, shard.world)?;
    let generation_config = args.generation_config;
    let span = tracing::Span::current();
    // Loading (and opening a GPU, which may compile kernels) blocks: off the runtime.
    let loaded = tokio::task::spawn_blocking(move || {
        span.in_scope(|| {
            let (model, tokenizer, pooling) = model_args.load_shard_for_engine(shard)?;
            let mut engine = model_args.engine_config(&model)?;
            if let Some(c) = engine.cuda.as_mut() {
                c.opts.comm_init_timeout = tp.start_timeout;
                c.opts.collective_timeout = tp.collective_timeout;
            }
            let defaults = model_args.sampling_defaults(generation_config)?;
            anyhow::Ok((model, tokenizer, engine, (defaults, pooling)))
        })
    })
    .await
    .context("model loading thread")
    .and_then(|r| r);
    let (model, tokenizer, engine, (sampling_defaults, pooling)) = match loaded {
        Ok(l) => l,
        Err(e) => {
            // Rank 0 published where to join a pool that will not form: take it back now.
            if let Some(l) = leader {
                l.withdraw().await;
            }
            return Err(e);
        }
    };
    let cfg = WorkerConfig {
        model_name: served_name(args),
        pool: args.pool.clone(),
        tp: tp.clone(),
        listen: args.listen,
        advertise_host: args.advertise_host.clone(),
        engine,
        max_waiting: args.max_waiting,
        lease_ttl: args.lease_ttl(),
        drain_timeout: Duration::from_secs(args.drain_timeout_s),
        node: hostname(),
        metrics_listen,
        tls: args.tls.files(),
        sampling_defaults,
        pooling,
        score_template: args.model.score_template_source()?,
        reasoning_parser: (args.model.reasoning_parser.clone())
            .or_else(|| default_reasoning_parser(&model, tokenizer.as_ref())),
        default_chat_template_kwargs: args.model.default_chat_template_kwargs.clone(),
    };
    if tp.rank > 0 {
        let comm = rendezvous::join(store.as_ref(), &schema, &args.pool, &tp).await?;
        let follower = RunningFollower::start(model, cfg, store, schema, comm).await?;
        return Ok(Started::Follower(follower));
    }
    let store = store.context("rank 0 needs placement (--etcd, or the embedded store)")?;
    let (comm, record): (Box<dyn Collective>, _) = match leader {
        Some(l) => l.accept(&tp).await?,
        None => (Box::new(Solo), None),
    };
    let worker = RunningWorker::start(model, tokenizer, cfg, store, schema, comm, record).await?;
    Ok(Started::Leader(Box::new(worker)))
}

/// The parser `model`'s chats need where `--reasoning-parser` does not say (gpt-oss's), if its
/// tokenizer has the parser's tokens: a checkpoint served by token ids alone has none.
fn default_reasoning_parser(
    model: &ferrite_engine::model::EngineModel,
    tokenizer: Option<&ferrite_text::Tokenizer>,
) -> Option<String> {
    let name = model.config().default_reasoning_parser()?;
    ferrite_text::Reasoning::new(name, tokenizer?).ok()?;
    Some(name.to_owned())
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub fn worker(args: WorkerArgs, telemetry: &Telemetry) -> Result<()> {
    run(async {
        let started = start_up("worker", telemetry, async {
            // A follower handed its leader on the command line may run without placement.
            let store = if args.comm.comm_join.is_some() && args.placement.etcd.is_empty() {
                None
            } else {
                Some(args.placement.store(false).await?)
            };
            let schema = KeySchema::new(args.placement.prefix.clone());
            let store = store.map(|(s, _)| s);
            let leader = match &store {
                Some(s) => bind_leader(&args, s, &schema)?,
                None => None,
            };
            start_worker(&args, leader, Some(args.metrics_listen), store, schema).await
        })
        .await?;
        match started {
            Started::Leader(worker) => lead(&args, *worker).await,
            Started::Follower(follower) => follow(&args, follower).await,
        }
    })
}

/// Rank 0 serves until SIGTERM (drain, exit 0) or until its pool loses a rank (deregister at
/// once, exit with the error).
async fn lead(args: &WorkerArgs, worker: RunningWorker) -> Result<()> {
    println!(
        "ferrite worker: pool {} rank 0 of {} serving on {}",
        args.pool, args.tp, worker.addr
    );
    if let Some(m) = worker.metrics_addr {
        println!("  metrics: http://{m}/metrics");
    }
    println!("ready");
    let lost = tokio::select! {
        _ = shutdown_signal() => None,
        why = worker.lost() => Some(why),
    };
    match lost {
        None => {
            ferrite_telemetry::notice("info", "ferrite worker: draining");
            worker.drain().await?;
            Ok(())
        }
        Some(why) => {
            worker.abandon().await;
            anyhow::bail!("pool {}: {why}", args.pool)
        }
    }
}

/// A rank > 0 runs the leader's steps until the leader stops the pool (exit 0) or the pool is
/// lost (exit with the error). SIGTERM does not stop it at once: the leader drains first and
/// then stops the pool; past the drain timeout it leaves anyway.
async fn follow(args: &WorkerArgs, mut follower: RunningFollower) -> Result<()> {
    println!(
        "ferrite worker: pool {} rank {} of {}; gRPC health on {}",
        args.pool, args.rank, args.tp, follower.addr
    );
    if let Some(m) = follower.metrics_addr {
        println!("  metrics: http://{m}/metrics");
    }
    println!("ready");
    let ended = tokio::select! {
        r = follower.finished() => Some(r),
        _ = shutdown_signal() => None,
    };
    let ended = match ended {
        Some(r) => r,
        None => {
            let limit = Duration::from_secs(args.drain_timeout_s + 5);
            tokio::time::timeout(limit, follower.finished())
                .await
                .unwrap_or(Ok(()))
        }
    };
    follower.leave().await;
    ended.with_context(|| format!("pool {}: rank {}", args.pool, args.rank))
}

pub fn gateway(args: GatewayArgs, telemetry: &Telemetry) -> Result<()> {
    run(async {
        // A gateway has no model: its start-up is connecting to placement and listening.
        let (addrs, task) = start_up("gateway", telemetry, async {
            let (store, schema) = args
                .placement
                .store(false)
                .instrument(tracing::info_span!(target: phases::TARGET, "config",
                    etcd = %args.placement.etcd.join(",")))
                .await?;
            let gw = args
                .access
                .gateway(store, schema, &args.worker_tls, &args.upstream)?
                .with_routing(args.routing)
                .with_json_bounds(args.schema.json_schema_bounds);
            let gw = match args.tls.files() {
                Some(files) => gw.with_tls(files),
                None => gw,
            };
            ferrite_gateway::serve(gw, args.listen, args.http_listen, shutdown_signal())
                .await
                .context("binding the gateway's listeners")
        })
        .await?;
        println!(
            "ferrite gateway: gRPC on {}, HTTP on {}",
            addrs.grpc, addrs.http
        );
        println!("ready");
        task.await.context("gateway task")?;
        Ok(())
    })
}

pub fn serve(args: ServeArgs, telemetry: &Telemetry) -> Result<()> {
    // The ranks this process starts share a fresh secret: nothing else can join their pool.
    let secret = crate::serve_ranks::fresh_secret();
    let worker_args = args.worker_args(&secret);
    if args.tp > 1 {
        // This process is rank 0: its share of the cores, like the ranks it starts. (Fails
        // only if the pool was already built, which keeps that one.)
        let threads = crate::serve_ranks::threads_per_rank(args.tp);
        let _ = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build_global();
    }
    run(async {
        let (stop_gateway, gateway_stopped) = tokio::sync::oneshot::channel::<()>();
        let (worker, ranks, addrs, task, view) = start_up("serve", telemetry, async {
            let (store, schema) = args.placement.store(true).await?;
            let leader = bind_leader(&worker_args, &store, &schema)?;
            let mut ranks = match &leader {
                Some(l) => Some(RankProcesses::spawn(&RankLaunch {
                    model: &args.model,
                    pool: &args.pool,
                    world: args.tp,
                    record: l.record(),
                    secret: &secret,
                    placement: Some(&args.placement),
                    otlp_endpoint: telemetry.endpoint(),
                })?),
                None => None,
            };
            // The gateway's /metrics (on its HTTP port) shows the worker's metrics too.
            let started = start_worker(
                &worker_args,
                leader,
                None,
                Some(store.clone()),
                schema.clone(),
            );
            // A rank that exits while the pool forms (a bad flag, a model it cannot load)
            // fails the start now, not after the start-up timeout.
            let started = match ranks.as_mut() {
                Some(r) => tokio::select! {
                    s = started => s?,
                    exited = r.first_exit() => anyhow::bail!("{exited} before the pool formed"),
                },
                None => started.await?,
            };
            let Started::Leader(worker) = started else {
                anyhow::bail!("serve runs rank 0 of its pool");
            };
            let worker = *worker;
            let gw = args
                .access
                .gateway(store, schema, &WorkerTlsArgs::default(), &args.upstream)?
                .with_routing(args.routing)
                .with_json_bounds(args.schema.json_schema_bounds);
            let gw = match args.tls.files() {
                Some(files) => gw.with_tls(files),
                None => gw,
            };
            let view = gw.clone();
            let (addrs, task) = ferrite_gateway::serve(gw, args.listen, args.http_listen, async {
                let _ = gateway_stopped.await;
            })
            .await
            .context("binding the gateway's listeners")?;
            anyhow::Ok((worker, ranks, addrs, task, view))
        })
        .await?;
        // `ready` means a request is served: the gateway has seen this process's pool (it
        // learns of it through placement, a moment after the worker registered it).
        let model = served_name(&worker_args);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while view.pools().ready(&model).is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        view.warm(&model);
        println!("ferrite serve: model {}", served_name(&worker_args));
        if let Some(r) = &ranks {
            let pids: Vec<String> = r.pids().iter().map(u32::to_string).collect();
            println!(
                "  pool {}: {} ranks; this process is rank 0; rank pids: {}",
                args.pool,
                args.tp,
                pids.join(" ")
            );
        }
        println!("  gRPC (ferrite.v1.Inference): {}", addrs.grpc);
        println!("  HTTP (OpenAI-compatible):    http://{}/v1", addrs.http);
        println!("ready");
        let lost = tokio::select! {
            _ = shutdown_signal() => None,
            why = worker.lost() => Some(why),
        };
        if let Some(why) = lost {
            worker.abandon().await;
            let _ = stop_gateway.send(());
            anyhow::bail!("pool {}: {why}", args.pool);
        }
        ferrite_telemetry::notice("info", "ferrite serve: draining");
        // Finish in-flight requests first, then stop accepting connections.
        worker.drain().await?;
        if let Some(r) = ranks {
            // The leader's engine is gone: the ranks were told to stop.
            r.wait_exit(Duration::from_secs(10)).await;
        }
        let _ = stop_gateway.send(());
        task.await.context("gateway task")?;
        Ok(())
    })
}
