//! A rank > 0 of a tensor-parallel pool: its shard and KV cache, running the leader's step
//! plans on a thread of its own, with gRPC health on its listen address and its rank key in
//! placement.
//!
//! It ends when the leader says the pool stops (`Ok`), or when the pool is lost (the leader or
//! another rank gone, or silent past the collective timeout: `Err`, naming the rank).

use std::net::SocketAddr;

use ferrite_collective::Collective;
use ferrite_engine::EngineError;
use ferrite_engine::executor::Executor;
use ferrite_engine::model::EngineModel;
use ferrite_placement::{KeySchema, RankRecord, Registration, RegistrationState, Store};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

use crate::lifecycle::{WorkerConfig, WorkerError};

/// A started follower: joined, its KV cache sized, running the leader's plans.
#[derive(Debug)]
pub struct RunningFollower {
    pub addr: SocketAddr,
    /// Where `/metrics` is served (start-up phases, the process), if asked for.
    pub metrics_addr: Option<SocketAddr>,
    registration: Option<Registration>,
    done: oneshot::Receiver<Result<(), EngineError>>,
    stop_health: Option<oneshot::Sender<()>>,
}

impl RunningFollower {
    /// Builds this rank's executor over `model` (its shard) with `comm` to the pool, agrees on
    /// the KV block count with the other ranks, serves gRPC health on `cfg.listen`, registers
    /// `pools/{pool}/ranks/{rank}` (when there is a store), and runs the leader's plans.
    pub async fn start(
        model: EngineModel,
        cfg: WorkerConfig,
        store: Option<Store>,
        schema: KeySchema,
        comm: Box<dyn Collective>,
    ) -> Result<Self, WorkerError> {
        let engine_cfg = cfg.engine.clone();
        let span = tracing::Span::current();
        let exec = tokio::task::spawn_blocking(move || {
            span.in_scope(|| {
                let mut exec = Executor::new(model, &engine_cfg, comm)?;
                exec.agree_on_blocks()?;
                Ok::<_, EngineError>(exec)
            })
        })
        .await
        .map_err(|e| WorkerError::Join(e.to_string()))??;
        let listen_err = |source| WorkerError::Listen {
            addr: cfg.listen,
            source,
        };
        let listener = TcpListener::bind(cfg.listen).await.map_err(listen_err)?;
        let addr = listener.local_addr().map_err(listen_err)?;
        let metrics_addr = match cfg.metrics_listen {
            Some(at) => Some(crate::lifecycle::serve_metrics(at).await?),
            None => None,
        };
        let (stop_health, health) = serve_health(listener);
        health
            .set_service_status("", tonic_health::ServingStatus::NotServing)
            .await;
        let _register = tracing::info_span!(target: ferrite_telemetry::phases::TARGET, "register",
            pool = %cfg.pool, rank = i64::from(cfg.tp.rank), address = %addr)
        .entered();
        let registration = store.map(|store| {
            let host = cfg
                .advertise_host
                .clone()
                .unwrap_or_else(|| addr.ip().to_string());
            let record = RankRecord {
                addr: format!("http://{host}:{}", addr.port()),
                gpu_uuid: None,
                node: cfg.node.clone(),
            };
            let key = schema.rank(&cfg.pool, cfg.tp.rank);
            Registration::start(
                store,
                cfg.lease_ttl,
                vec![(key, ferrite_placement::keys::encode(&record))],
            )
        });
        drop(_register);
        // Ready (gRPC health SERVING) once the rank's key is in the store, or at once without
        // one (a rank of `ferrite serve --tp N`).
        let registered = registration.as_ref().map(Registration::subscribe);
        tokio::spawn(async move {
            if let Some(mut state) = registered {
                let _ = state
                    .wait_for(|s| matches!(s, RegistrationState::Registered(_)))
                    .await;
            }
            health
                .set_service_status("", tonic_health::ServingStatus::Serving)
                .await;
        });
        let (tx, done) = oneshot::channel();
        std::thread::Builder::new()
            .name(format!("ferrite-rank-{}", cfg.tp.rank))
            .spawn(move || {
                let mut exec = exec;
                let _ = tx.send(exec.follow());
            })
            .map_err(WorkerError::Thread)?;
        Ok(Self {
            addr,
            metrics_addr,
            registration,
            done,
            stop_health: Some(stop_health),
        })
    }

    /// Resolves when the pool ends: `Ok` when the leader stopped it, `Err` when it was lost.
    /// Cancel-safe (call it again to keep waiting).
    pub async fn finished(&mut self) -> Result<(), EngineError> {
        (&mut self.done).await.unwrap_or(Err(EngineError::Stopped))
    }

    /// Deregisters this rank and stops serving health.
    pub async fn leave(mut self) {
        if let Some(r) = self.registration.take()
            && let Err(e) = r.deregister().await
        {
            tracing::warn!("could not deregister (the key expires with the lease): {e}");
        }
        if let Some(stop) = self.stop_health.take() {
            let _ = stop.send(());
        }
    }
}

/// Serves the gRPC health service on `listener` (NOT_SERVING until told otherwise through the
/// returned reporter) until the returned sender fires or is dropped.
fn serve_health(
    listener: TcpListener,
) -> (oneshot::Sender<()>, tonic_health::server::HealthReporter) {
    let (stop, stopped) = oneshot::channel::<()>();
    let (reporter, service) = tonic_health::server::health_reporter();
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let served = tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(incoming, async {
                let _ = stopped.await;
            })
            .await;
        if let Err(e) = served {
            tracing::error!("health server: {e}");
        }
    });
    (stop, reporter)
}
