//! Start-up, registration and draining of one worker.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use ferrite_collective::Collective;
use ferrite_engine::engine::{Engine, EngineConfig};
use ferrite_engine::executor::Executor;
use ferrite_engine::handle::EngineHandle;
use ferrite_engine::model::EngineModel;
use ferrite_placement::{
    KeySchema, PoolRecord, PoolState, RankRecord, Registration, RegistrationState, Store,
};
use ferrite_proto::worker::v1 as pb;
use ferrite_telemetry::metrics::ScrapeHook;
use ferrite_text::Tokenizer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::rendezvous::TpConfig;
use crate::service::{Backend, WorkerService};
use crate::synthetic::SyntheticEngine;

/// What a worker needs to start.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// The name the pool is registered under (what clients ask for).
    pub model_name: String,
    pub pool: String,
    /// This rank's place in its pool, and how the pool forms.
    pub tp: TpConfig,
    /// Where to listen (port 0: any free port).
    pub listen: SocketAddr,
    /// The host others reach this worker at; default: the listen address's IP.
    pub advertise_host: Option<String>,
    pub engine: EngineConfig,
    /// Requests allowed to wait for admission before RESOURCE_EXHAUSTED.
    pub max_waiting: usize,
    /// Lease TTL of the registration.
    pub lease_ttl: Duration,
    /// How long draining waits for in-flight requests.
    pub drain_timeout: Duration,
    pub node: String,
    /// Where to serve Prometheus `/metrics` over HTTP (port 0: any free port); `None`: not
    /// here (`ferrite serve` shows the worker's metrics on the gateway's HTTP port).
    pub metrics_listen: Option<SocketAddr>,
    /// TLS for the worker API (with `client_ca`: only callers with a certificate of that CA,
    /// the gateways); its address is then `https://`.
    pub tls: Option<ferrite_tls::TlsFiles>,
    /// The model's recommended sampling, which gateways apply to requests that leave a field
    /// unset (`None`: the API's neutral defaults).
    pub sampling_defaults: Option<ferrite_proto::v1::SamplingDefaults>,
    /// How the model's embeddings are pooled (what its checkpoint says).
    pub pooling: ferrite_engine::model::pooling::Pooling,
    /// A reranker's score template (`--score-template`), its Jinja source.
    pub score_template: Option<String>,
    /// A reasoning model's parser (`--reasoning-parser`), by vLLM's name.
    pub reasoning_parser: Option<String>,
    /// What the chat template gets unless a request says otherwise
    /// (`--default-chat-template-kwargs`), a JSON object.
    pub default_chat_template_kwargs: Option<String>,
}

/// Why a worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Engine(#[from] ferrite_engine::EngineError),
    #[error(transparent)]
    Text(#[from] ferrite_text::TextError),
    #[error(transparent)]
    Placement(#[from] ferrite_placement::PlacementError),
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("TLS: {0}")]
    Tls(#[from] ferrite_tls::TlsError),
    #[error("cannot start the engine thread: {0}")]
    Thread(std::io::Error),
    #[error("cannot serve /metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("forming the pool: {0}")]
    Rendezvous(#[from] crate::rendezvous::RendezvousError),
    #[error("the engine start-up thread: {0}")]
    Join(String),
}

/// The `GetModelInfo` answer: what a gateway needs to own text for this model (`cfg` names it
/// and says its recommended sampling).
pub fn model_info(
    cfg: &WorkerConfig,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
    max_model_len: usize,
) -> Result<pb::ModelInfo, ferrite_text::TextError> {
    let mut info = pb::ModelInfo {
        model: cfg.model_name.clone(),
        vocab_size: u32::try_from(vocab_size).unwrap_or(u32::MAX),
        max_model_len: u32::try_from(max_model_len).unwrap_or(u32::MAX),
        sampling_defaults: cfg.sampling_defaults.clone(),
        score_template: cfg.score_template.clone(),
        reasoning_parser: cfg.reasoning_parser.clone(),
        default_chat_template_kwargs: cfg.default_chat_template_kwargs.clone(),
        ..pb::ModelInfo::default()
    };
    if let Some(kwargs) = &cfg.default_chat_template_kwargs {
        ferrite_text::chat::parse_kwargs(kwargs)?;
    }
    if let Some(t) = tokenizer {
        info.tokenizer_json = t.to_tokenizer_json()?;
        info.bos_token = t.bos_token().map(str::to_owned);
        info.eos_token = t.eos_token().map(str::to_owned);
        info.chat_template = t.chat_template().map(|c| c.source().to_owned());
        info.eos_token_ids = t.eos_ids().to_vec();
        // Whether encoding text adds anything (a BOS) tells the gateway how to tokenize.
        info.add_special_tokens = t.encode("a", true)? != t.encode("a", false)?;
        // Its markers must be tokens of this vocabulary: refused here, at start-up.
        if let Some(name) = &cfg.reasoning_parser {
            ferrite_text::Reasoning::new(name, t)?;
        }
    } else if let Some(name) = &cfg.reasoning_parser {
        return Err(ferrite_text::TextError::Reasoning(format!(
            "reasoning parser `{name}`: the model has no tokenizer"
        )));
    }
    info.text_digest = text_digest(&info);
    Ok(info)
}

/// SHA-256 (first 16 hex digits) of `info`'s encoding without its digest and context length:
/// equal text sides give equal digests. (Pools of one model may hold different contexts; the
/// gateway routes each request to the pools whose context holds it.)
fn text_digest(info: &pb::ModelInfo) -> String {
    use prost::Message;
    use sha2::Digest;
    let bytes = pb::ModelInfo {
        text_digest: String::new(),
        max_model_len: 0,
        ..info.clone()
    }
    .encode_to_vec();
    let hash = sha2::Sha256::digest(&bytes);
    hash.iter().take(8).map(|b| format!("{b:02x}")).collect()
}

/// A started worker: serving, registered, Ready.
#[derive(Debug)]
pub struct RunningWorker {
    pub addr: SocketAddr,
    /// Where `/metrics` is served, if this worker serves it.
    pub metrics_addr: Option<SocketAddr>,
    pub service: WorkerService,
    _load_gauges: ScrapeHook,
    registration: Registration,
    schema: KeySchema,
    pool: String,
    pool_record: PoolRecord,
    stop_server: Option<oneshot::Sender<()>>,
    server: JoinHandle<Result<(), tonic::transport::Error>>,
    health: tonic_health::server::HealthReporter,
    drain_timeout: Duration,
    /// Keeps rank 0's record of the pool (`pools/{pool}/nccl`) alive while the pool lives.
    comm_record: Option<Registration>,
    /// The engine's thread: joined at the end of a drain, so the leader has told the other
    /// ranks to stop before the process exits.
    engine_thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningWorker {
    /// Rank 0 (the leader): builds the engine over `model` (its shard) with `comm` to the other
    /// ranks, who must be starting their followers ([`crate::RunningFollower`]), and warms it
    /// up; then serves the worker API on `cfg.listen`, registers the pool (Starting) and its
    /// rank in `store`, and marks the pool Ready. The pool is Ready only once every rank has
    /// joined, loaded and sized its KV cache. Start-up phases (`kv_cache_init`, `warmup`,
    /// `register`) are spans under the caller's. `comm_record` keeps the pool's record alive.
    pub async fn start(
        model: EngineModel,
        tokenizer: Option<Tokenizer>,
        cfg: WorkerConfig,
        store: Store,
        schema: KeySchema,
        comm: Box<dyn Collective>,
        comm_record: Option<Registration>,
    ) -> Result<Self, WorkerError> {
        let vocab_size = model.config().vocab_size;
        let eos = tokenizer
            .as_ref()
            .map(|t| t.eos_ids().to_vec())
            .unwrap_or_default();
        let engine_cfg = cfg.engine.clone();
        let span = tracing::Span::current();
        // Building waits for the other ranks (the KV block count is agreed): off the runtime.
        let built = tokio::task::spawn_blocking(move || {
            span.in_scope(|| {
                let exec = Executor::new(model, &engine_cfg, comm)?;
                let mut engine = Engine::from_executor(exec, eos, &engine_cfg)?;
                engine.warmup()?;
                Ok::<_, ferrite_engine::EngineError>(engine)
            })
        })
        .await
        .map_err(|e| WorkerError::Join(e.to_string()))
        .and_then(|r| r.map_err(WorkerError::from));
        let engine = match built {
            Ok(engine) => engine,
            Err(e) => {
                // The pool will not serve: its record goes now, not at the end of its lease.
                if let Some(r) = comm_record {
                    let _ = r.deregister().await;
                }
                return Err(e);
            }
        };
        let max_model_len = engine.max_model_len();
        let info = pb::ModelInfo {
            lora: engine.lora_names().to_vec(),
            labels: engine.labels().unwrap_or_default().to_vec(),
            ..model_info(&cfg, tokenizer.as_ref(), vocab_size, max_model_len)?
        };
        let (handle, thread) =
            EngineHandle::spawn(engine, cfg.max_waiting).map_err(WorkerError::Thread)?;
        let for_vocabulary = info.clone();
        let build = move || match tokenizer {
            Some(t) => crate::guide::vocabulary(&for_vocabulary, t),
            None => Err("the model has no tokenizer".into()),
        };
        let service = WorkerService::new(Backend::Engine(handle), info)
            .with_vocabulary_built_by(build)
            .with_pooling(cfg.pooling.clone());
        let mut worker = Self::serve(service, max_model_len, cfg, store, schema).await?;
        worker.comm_record = comm_record;
        worker.engine_thread = Some(thread);
        Ok(worker)
    }

    /// Resolves when the pool was lost (a rank died, see [`EngineHandle::lost`]), with why;
    /// never while the pool serves.
    pub async fn lost(&self) -> String {
        match &self.service.backend() {
            Backend::Engine(h) => h.lost().await,
            Backend::Synthetic(_) => std::future::pending().await,
        }
    }

    /// After the pool was lost (or its engine failed): refuses new requests, reports
    /// NOT_SERVING, deregisters at once (the keys go now, not after the TTL) and stops
    /// serving.
    pub async fn abandon(mut self) {
        self.service.start_draining();
        self.health
            .set_not_serving::<pb::worker_server::WorkerServer<WorkerService>>()
            .await;
        leave(
            self.registration,
            self.comm_record.take(),
            self.stop_server.take(),
        )
        .await;
    }

    /// A worker over the [`SyntheticEngine`]: no model, `tokens_per_s` per stream.
    pub async fn start_synthetic(
        tokens_per_s: f64,
        cfg: WorkerConfig,
        store: Store,
        schema: KeySchema,
    ) -> Result<Self, WorkerError> {
        let synthetic = SyntheticEngine::new(tokens_per_s);
        let tokenizer = SyntheticEngine::tokenizer()?;
        let max_model_len = synthetic.max_model_len();
        let info = model_info(&cfg, Some(&tokenizer), 256, max_model_len)?;
        let service = WorkerService::new(Backend::Synthetic(synthetic), info);
        Self::serve(service, max_model_len, cfg, store, schema).await
    }

    /// Serves `service` on `cfg.listen`, registers the pool (Starting) and its rank, then marks
    /// the pool Ready: the `register` start-up phase.
    async fn serve(
        service: WorkerService,
        max_model_len: usize,
        cfg: WorkerConfig,
        store: Store,
        schema: KeySchema,
    ) -> Result<Self, WorkerError> {
        let span = tracing::info_span!(target: ferrite_telemetry::phases::TARGET, "register",
            pool = %cfg.pool, rank = i64::from(cfg.tp.rank), store = store.kind(), address = tracing::field::Empty);
        async move {
            let listener =
                TcpListener::bind(cfg.listen)
                    .await
                    .map_err(|source| WorkerError::Listen {
                        addr: cfg.listen,
                        source,
                    })?;
            let addr = listener
                .local_addr()
                .map_err(|source| WorkerError::Listen {
                    addr: cfg.listen,
                    source,
                })?;
            tracing::Span::current().record("address", tracing::field::display(addr));
            let metrics_addr = match cfg.metrics_listen {
                Some(at) => Some(serve_metrics(at).await?),
                None => None,
            };
            let hooked = service.clone();
            let load_gauges = ScrapeHook::new(move || hooked.publish_load());
            let (health, health_service) = tonic_health::server::health_reporter();
            health
                .set_not_serving::<pb::worker_server::WorkerServer<WorkerService>>()
                .await;
            let (stop_server, stopped) = oneshot::channel::<()>();
            let router = tonic::transport::Server::builder()
                .add_service(health_service)
                .add_service(pb::worker_server::WorkerServer::new(service.clone()));
            let stopped = async {
                let _ = stopped.await;
            };
            let server = match &cfg.tls {
                Some(files) => {
                    let tls = ferrite_tls::ServerTls::new(files.clone(), ferrite_tls::ALPN_GRPC)?;
                    let incoming = ferrite_tls::incoming(listener, tls);
                    tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
                }
                None => {
                    // Tokens go out as small frames: without TCP_NODELAY, Nagle holds them.
                    let incoming = tonic::transport::server::TcpIncoming::from(listener)
                        .with_nodelay(Some(true));
                    tokio::spawn(router.serve_with_incoming_shutdown(incoming, stopped))
                }
            };

            let host = cfg
                .advertise_host
                .clone()
                .unwrap_or_else(|| addr.ip().to_string());
            let scheme = if cfg.tls.is_some() { "https" } else { "http" };
            let leader_addr = format!("{scheme}://{host}:{}", addr.port());
            let mut pool_record = PoolRecord {
                model: cfg.model_name.clone(),
                tp: cfg.tp.world,
                leader_addr: leader_addr.clone(),
                state: PoolState::Starting,
                max_model_len: u32::try_from(max_model_len).unwrap_or(u32::MAX),
                text_digest: Some(service.info().text_digest.clone()),
                lora: service.info().lora.clone(),
            };
            let rank = RankRecord {
                addr: leader_addr,
                gpu_uuid: None,
                node: cfg.node.clone(),
            };
            let mut entries = vec![(schema.rank(&cfg.pool, cfg.tp.rank), json_bytes(&rank))];
            if cfg.tp.rank == 0 {
                entries.push((schema.pool(&cfg.pool), json_bytes(&pool_record)));
            }
            // Returns at once; if the store is unreachable it keeps trying in the background.
            let registration = Registration::start(store, cfg.lease_ttl, entries);
            serving_once_registered(&registration, health.clone(), service.clone());
            if cfg.tp.rank == 0 {
                pool_record.state = PoolState::Ready;
                if let Err(e) = registration
                    .update(schema.pool(&cfg.pool), json_bytes(&pool_record))
                    .await
                {
                    // The value is kept and written once the store answers again.
                    tracing::warn!("could not mark the pool ready yet: {e}");
                }
            }
            tracing::info!(%addr, pool = %cfg.pool, model = %cfg.model_name, "worker ready");
            Ok(Self {
                addr,
                metrics_addr,
                service,
                _load_gauges: load_gauges,
                registration,
                schema,
                pool: cfg.pool,
                pool_record,
                stop_server: Some(stop_server),
                server,
                health,
                drain_timeout: cfg.drain_timeout,
                comm_record: None,
                engine_thread: None,
            })
        }
        .instrument(span)
        .await
    }

    /// Marks the pool Draining, refuses new requests, waits (at most the drain timeout) for
    /// in-flight ones, deregisters and stops serving.
    pub async fn drain(mut self) -> Result<(), WorkerError> {
        self.service.start_draining();
        self.health
            .set_not_serving::<pb::worker_server::WorkerServer<WorkerService>>()
            .await;
        self.pool_record.state = PoolState::Draining;
        if let Err(e) = self
            .registration
            .update(self.schema.pool(&self.pool), json_bytes(&self.pool_record))
            .await
        {
            tracing::warn!("could not mark the pool draining: {e}");
        }
        let deadline = Instant::now() + self.drain_timeout;
        loop {
            let s = self.service.stats();
            let (running, waiting) = (s.running, s.waiting);
            if running == 0 && waiting == 0 {
                break;
            }
            if Instant::now() >= deadline {
                tracing::warn!(
                    running,
                    waiting,
                    "drain timeout: failing the requests still in flight"
                );
                let why = format!("its drain timeout ({:?}) passed", self.drain_timeout);
                self.service.abort_all(&why);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        leave(
            self.registration,
            self.comm_record.take(),
            self.stop_server.take(),
        )
        .await;
        // The server's graceful stop waits for its open streams, which the aborts above just
        // ended; a stream that still hangs on (a client that reads nothing) is cut.
        if tokio::time::timeout(SERVER_STOP_GRACE, &mut self.server)
            .await
            .is_err()
        {
            tracing::warn!("the worker API did not stop within {SERVER_STOP_GRACE:?}: cutting it");
            self.server.abort();
        }
        // Every handle of the engine goes with `self`; its thread then ends (within its idle
        // poll), and the executor stops the pool's other ranks as it goes.
        let thread = self.engine_thread.take();
        drop(self.service);
        drop(self._load_gauges);
        if let Some(t) = thread {
            let _ = tokio::task::spawn_blocking(move || t.join()).await;
        }
        Ok(())
    }
}

/// How long a drained worker's server may take to close its streams once every request
/// ended or was failed.
const SERVER_STOP_GRACE: Duration = Duration::from_secs(2);

/// Removes a worker's keys now (else they expire with the lease) and stops its server.
async fn leave(
    registration: Registration,
    comm_record: Option<Registration>,
    stop_server: Option<oneshot::Sender<()>>,
) {
    if let Err(e) = registration.deregister().await {
        tracing::warn!("could not deregister (the keys expire with the lease): {e}");
    }
    if let Some(r) = comm_record {
        let _ = r.deregister().await;
    }
    if let Some(stop) = stop_server {
        let _ = stop.send(());
    }
}

/// Reports the worker API SERVING on gRPC health (what readiness probes ask) once the
/// registration is in the store, not before: a worker no gateway can find is not ready. Not
/// after a drain began.
fn serving_once_registered(
    registration: &Registration,
    health: tonic_health::server::HealthReporter,
    service: WorkerService,
) {
    let mut state = registration.subscribe();
    tokio::spawn(async move {
        let registered = state
            .wait_for(|s| matches!(s, RegistrationState::Registered(_)))
            .await
            .is_ok();
        if registered && !service.is_draining() {
            health
                .set_serving::<pb::worker_server::WorkerServer<WorkerService>>()
                .await;
        }
    });
}

/// Serves `/metrics` on `at` until the process ends; returns the bound address.
pub(crate) async fn serve_metrics(at: SocketAddr) -> Result<SocketAddr, WorkerError> {
    let err = |source| WorkerError::Metrics { addr: at, source };
    let listener = TcpListener::bind(at).await.map_err(err)?;
    let addr = listener.local_addr().map_err(err)?;
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, ferrite_telemetry::metrics::router()).await {
            tracing::error!("metrics server: {e}");
        }
    });
    Ok(addr)
}

fn json_bytes<T: serde::Serialize>(v: &T) -> Vec<u8> {
    // Serializing these plain records cannot fail.
    serde_json::to_vec(v).unwrap_or_default()
}
