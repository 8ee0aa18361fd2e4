//! `ferrite worker`, `ferrite gateway` and `ferrite serve` (both in one process).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use ferrite_engine::registry;
use ferrite_placement::{KeySchema, Store};
use ferrite_worker::{RunningWorker, WorkerConfig};

use ferrite_telemetry::Telemetry;
use ferrite_telemetry::phases;
use tracing::Instrument;

use crate::loading::ModelArgs;
use crate::security_args::{AccessArgs, EtcdTlsArgs, ListenTlsArgs, WorkerTlsArgs};

/// Where placement lives.
#[derive(Debug, Clone, Args)]
pub struct PlacementArgs {
    /// etcd endpoints, comma-separated (e.g. http://127.0.0.1:2379). `serve` without it uses an
    /// in-process store.
    #[arg(long, value_delimiter = ',', env = "FERRITE_ETCD")]
    pub etcd: Vec<String>,
    /// Key prefix in etcd.
    #[arg(long, default_value = "/ferrite/v1", env = "FERRITE_ETCD_PREFIX")]
    pub prefix: String,
    #[command(flatten)]
    pub tls: EtcdTlsArgs,
}

impl PlacementArgs {
    async fn store(&self, embedded_ok: bool) -> Result<(Store, KeySchema)> {
        let schema = KeySchema::new(self.prefix.clone());
        if self.etcd.is_empty() {
            anyhow::ensure!(embedded_ok, "--etcd is required");
            return Ok((Store::embedded(), schema));
        }
        let options = ferrite_placement::EtcdOptions {
            tls: self.tls.client_config()?,
            ..ferrite_placement::EtcdOptions::default()
        };
        let store = Store::connect_with(&self.etcd, &self.prefix, options)
            .await
            .with_context(|| format!("connecting to etcd at {}", self.etcd.join(",")))?;
        Ok((store, schema))
    }
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The pool this rank belongs to.
    #[arg(long, default_value = "pool-0", env = "FERRITE_POOL")]
    pool: String,
    #[arg(long, default_value_t = 0, env = "FERRITE_RANK")]
    rank: u32,
    /// Ranks in the pool (tensor-parallel size).
    #[arg(long, default_value_t = 1, env = "FERRITE_TP")]
    tp: u32,
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
    /// Where to serve Prometheus `/metrics` (port 0 = any free port, printed at start).
    #[arg(long, default_value = "127.0.0.1:0", env = "FERRITE_METRICS_LISTEN")]
    metrics_listen: SocketAddr,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    tls: ListenTlsArgs,
}

#[derive(Debug, Args)]
pub struct GatewayArgs {
    /// Public gRPC listen address.
    #[arg(long, default_value = "127.0.0.1:50051", env = "FERRITE_LISTEN")]
    listen: SocketAddr,
    /// OpenAI-compatible HTTP listen address.
    #[arg(long, default_value = "127.0.0.1:8000", env = "FERRITE_HTTP_LISTEN")]
    http_listen: SocketAddr,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    access: AccessArgs,
    #[command(flatten)]
    tls: ListenTlsArgs,
    #[command(flatten)]
    worker_tls: WorkerTlsArgs,
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
    /// The pool name this process registers.
    #[arg(long, default_value = "local", env = "FERRITE_POOL")]
    pool: String,
    #[arg(long, default_value_t = 256, env = "FERRITE_MAX_WAITING")]
    max_waiting: usize,
    #[arg(long, default_value_t = 30, env = "FERRITE_DRAIN_TIMEOUT_S")]
    drain_timeout_s: u64,
    #[command(flatten)]
    placement: PlacementArgs,
    #[command(flatten)]
    access: AccessArgs,
    /// TLS of the public listeners (the in-process worker stays on loopback, in plaintext).
    #[command(flatten)]
    tls: ListenTlsArgs,
}

impl ServeArgs {
    /// The worker half of `serve`: rank 0 of one pool, on a free loopback port.
    fn worker_args(&self) -> WorkerArgs {
        WorkerArgs {
            model: self.model.clone(),
            pool: self.pool.clone(),
            rank: 0,
            tp: 1,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            advertise_host: None,
            served_model_name: self.served_model_name.clone(),
            max_waiting: self.max_waiting,
            lease_ttl_s: 5,
            drain_timeout_s: self.drain_timeout_s,
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
    if registry::known(&args.model.model).is_some() {
        return args.model.model.clone();
    }
    let p = Path::new(&args.model.model);
    p.file_stem().map_or_else(
        || args.model.model.clone(),
        |s| s.to_string_lossy().into_owned(),
    )
}

fn runtime() -> Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("ferrite-io")
        .build()
        .context("starting the async runtime")
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

/// Loads the model and starts the worker; its phases are spans under the current span.
async fn start_worker(
    args: &WorkerArgs,
    metrics_listen: Option<SocketAddr>,
    store: Store,
    schema: KeySchema,
) -> Result<RunningWorker> {
    let model_args = args.model.clone();
    let span = tracing::Span::current();
    // Loading (and opening a GPU, which may compile kernels) blocks: off the runtime.
    let (model, tokenizer, engine) = tokio::task::spawn_blocking(move || {
        span.in_scope(|| {
            let (model, tokenizer) = model_args.load_for_engine()?;
            let engine = model_args.engine_config(&model)?;
            anyhow::Ok((model, tokenizer, engine))
        })
    })
    .await
    .context("model loading thread")??;
    let cfg = WorkerConfig {
        model_name: served_name(args),
        pool: args.pool.clone(),
        rank: args.rank,
        tp: args.tp,
        listen: args.listen,
        advertise_host: args.advertise_host.clone(),
        engine,
        max_waiting: args.max_waiting,
        lease_ttl: Duration::from_secs(args.lease_ttl_s.max(1)),
        drain_timeout: Duration::from_secs(args.drain_timeout_s),
        node: hostname(),
        metrics_listen,
        tls: args.tls.files(),
    };
    Ok(RunningWorker::start(model, tokenizer, cfg, store, schema).await?)
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

pub fn worker(args: WorkerArgs, telemetry: &Telemetry) -> Result<()> {
    runtime()?.block_on(async {
        let worker = start_up("worker", telemetry, async {
            let (store, schema) = args.placement.store(false).await?;
            start_worker(&args, Some(args.metrics_listen), store, schema).await
        })
        .await?;
        println!(
            "ferrite worker: pool {} rank {} serving on {}",
            args.pool, args.rank, worker.addr
        );
        if let Some(m) = worker.metrics_addr {
            println!("  metrics: http://{m}/metrics");
        }
        println!("ready");
        shutdown_signal().await;
        ferrite_telemetry::notice("info", "ferrite worker: draining");
        worker.drain().await?;
        Ok(())
    })
}

pub fn gateway(args: GatewayArgs, telemetry: &Telemetry) -> Result<()> {
    runtime()?.block_on(async {
        // A gateway has no model: its start-up is connecting to placement and listening.
        let (addrs, task) = start_up("gateway", telemetry, async {
            let (store, schema) = args
                .placement
                .store(false)
                .instrument(tracing::info_span!(target: phases::TARGET, "config",
                    etcd = %args.placement.etcd.join(",")))
                .await?;
            let gw = args.access.gateway(store, schema, &args.worker_tls)?;
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
    let worker_args = args.worker_args();
    runtime()?.block_on(async {
        let (stop_gateway, gateway_stopped) = tokio::sync::oneshot::channel::<()>();
        let (worker, addrs, task) = start_up("serve", telemetry, async {
            let (store, schema) = args.placement.store(true).await?;
            // The gateway's /metrics (on its HTTP port) shows the worker's metrics too.
            let worker = start_worker(&worker_args, None, store.clone(), schema.clone()).await?;
            let gw = args
                .access
                .gateway(store, schema, &WorkerTlsArgs::default())?;
            let gw = match args.tls.files() {
                Some(files) => gw.with_tls(files),
                None => gw,
            };
            let (addrs, task) = ferrite_gateway::serve(gw, args.listen, args.http_listen, async {
                let _ = gateway_stopped.await;
            })
            .await
            .context("binding the gateway's listeners")?;
            anyhow::Ok((worker, addrs, task))
        })
        .await?;
        println!("ferrite serve: model {}", served_name(&worker_args));
        println!("  gRPC (ferrite.v1.Inference): {}", addrs.grpc);
        println!("  HTTP (OpenAI-compatible):    http://{}/v1", addrs.http);
        println!("ready");
        shutdown_signal().await;
        ferrite_telemetry::notice("info", "ferrite serve: draining");
        // Finish in-flight requests first, then stop accepting connections.
        worker.drain().await?;
        let _ = stop_gateway.send(());
        task.await.context("gateway task")?;
        Ok(())
    })
}
