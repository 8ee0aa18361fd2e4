//! The gateway: ferrite's public front.
//!
//! # Layout
//!
//! - [`auth`]: API keys (bearer tokens on both APIs; health, reflection, metrics stay open).
//! - [`limits`]: per-caller request and token rate limits.
//! - [`pools`]: the view of placement (ready pools by model), kept current by a watch.
//! - [`models`]: each model's tokenizer and limits, fetched from a pool (no model files here).
//! - [`validate`]: prompt rendering/tokenization and the checks that build a
//!   [`validate::ValidatedRequest`].
//! - [`route`]: power-of-two-choices routing, retry before the first token.
//! - [`stream`]: worker token ids → text deltas (incremental detokenization, stop strings).
//! - [`trace`]: each request's GenAI span and metrics.
//! - [`grpc`]: the `ferrite.v1.Inference` service; [`http`]: the OpenAI-compatible API, whose
//!   request bodies [`openai`] reads (refusing what is not served).
//! - [`error`]: [`GatewayError`] and its mapping to gRPC status.
//!
//! The gateway owns text; workers own tokens.

pub mod auth;
pub mod error;
pub mod grpc;
pub mod http;
pub mod limits;
pub mod models;
pub mod openai;
pub mod pools;
pub mod route;
pub mod stream;
pub mod trace;
pub mod validate;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use ferrite_placement::{KeySchema, Store};
use ferrite_proto::v1 as api;
use futures::Stream;
use tokio::net::TcpListener;
use tracing::Instrument;

pub use auth::ApiKeys;
pub use error::GatewayError;
use limits::Limiter;
pub use limits::RateLimits;
use models::{ModelText, ModelTexts};
use pools::PoolView;
use stream::GenerateEvent;
use validate::Prompt;

/// Shared state of one gateway process. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Gateway {
    pools: PoolView,
    texts: Arc<ModelTexts>,
    keys: Arc<ApiKeys>,
    limiter: Arc<Limiter>,
}

impl Gateway {
    /// A gateway following the pools under `schema` in `store`.
    pub fn new(store: Store, schema: KeySchema) -> Self {
        let pools = PoolView::default();
        let follower = pools.clone();
        tokio::spawn(async move { follower.follow(store, schema).await });
        Self {
            pools,
            texts: Arc::new(ModelTexts::default()),
            keys: Arc::new(ApiKeys::default()),
            limiter: Arc::new(Limiter::default()),
        }
    }

    /// Limits every caller (API key, or everyone alike without keys) to `limits`.
    pub fn with_rate_limits(mut self, limits: RateLimits) -> Self {
        self.limiter = Arc::new(Limiter::new(limits));
        self
    }

    /// Requires one of `keys` on every API call (none: no check).
    pub fn with_api_keys(mut self, keys: ApiKeys) -> Self {
        self.keys = Arc::new(keys);
        self
    }

    pub fn api_keys(&self) -> &ApiKeys {
        &self.keys
    }

    pub fn pools(&self) -> &PoolView {
        &self.pools
    }

    /// The text side of `model`: NOT_FOUND if no ready pool serves it.
    pub async fn model_text(&self, model: &str) -> Result<Arc<ModelText>, GatewayError> {
        let ready = self.pools.ready(model);
        if ready.is_empty() {
            return Err(GatewayError::ModelNotFound(model.to_owned()));
        }
        self.texts.get(model, &ready).await
    }

    /// Validates, routes and streams one completion. `span` is the request's span
    /// ([`trace::request_span`], parented to the client's context); it ends with the stream.
    pub async fn generate(
        &self,
        request: GenerateArgs<'_>,
        span: tracing::Span,
    ) -> Result<impl Stream<Item = Result<GenerateEvent, GatewayError>> + Send + use<>, GatewayError>
    {
        let GenerateArgs {
            model,
            prompt,
            sampling,
            deadline,
            started,
            api,
            caller,
        } = request;
        let mut trace = trace::RequestTrace::new(span.clone(), model, api, started);
        let opened = async {
            let validated = async {
                let text = self.model_text(model).await?;
                validate::validate(text, prompt, sampling)
            }
            .instrument(tracing::info_span!("validate"))
            .await?;
            trace.validated(&validated);
            let tokens = validated.prompt_ids().len() + validated.sampling().max_tokens as usize;
            self.limiter.admit(caller, tokens, Instant::now())?;
            let upstream = route::open(&self.pools, &validated, deadline).await?;
            Ok((validated, upstream))
        }
        .instrument(span)
        .await;
        match opened {
            Ok((req, upstream)) => Ok(stream::events(&req, upstream, trace, deadline)),
            Err(e) => {
                trace.failed(&e);
                Err(e)
            }
        }
    }
}

/// One completion request, as both APIs hand it to [`Gateway::generate`].
#[derive(Debug)]
pub struct GenerateArgs<'a> {
    pub model: &'a str,
    pub prompt: &'a Prompt,
    pub sampling: Option<api::SamplingParams>,
    pub deadline: Option<Instant>,
    /// When the request arrived (time to first token counts from here).
    pub started: Instant,
    pub api: trace::Api,
    /// Whose rate limits the request counts against.
    pub caller: auth::Caller,
}

/// Where a running gateway listens.
#[derive(Debug, Clone, Copy)]
pub struct GatewayAddrs {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
}

/// Binds both listeners and serves until `shutdown` resolves.
pub async fn serve(
    gateway: Gateway,
    grpc_listen: SocketAddr,
    http_listen: SocketAddr,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<(GatewayAddrs, tokio::task::JoinHandle<()>)> {
    let grpc_listener = TcpListener::bind(grpc_listen).await?;
    let http_listener = TcpListener::bind(http_listen).await?;
    let addrs = GatewayAddrs {
        grpc: grpc_listener.local_addr()?,
        http: http_listener.local_addr()?,
    };
    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_serving::<api::inference_server::InferenceServer<grpc::InferenceService>>()
        .await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ferrite_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(std::io::Error::other)?;
    // The older package name too: grpcio-reflection's default module and many GUI clients
    // still speak only v1alpha.
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(ferrite_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(std::io::Error::other)?;
    let (stop_tx, _) = tokio::sync::broadcast::channel::<()>(1);
    let mut stop_grpc = stop_tx.subscribe();
    let mut stop_http = stop_tx.subscribe();
    let grpc = tonic::transport::Server::builder()
        .add_service(health_service)
        .add_service(reflection)
        .add_service(reflection_v1alpha)
        .add_service(api::inference_server::InferenceServer::with_interceptor(
            grpc::InferenceService::new(gateway.clone()),
            grpc::key_check(gateway.keys.clone()),
        ))
        .serve_with_incoming_shutdown(
            // Deltas go out as small frames: without TCP_NODELAY, Nagle holds them for an ACK.
            tonic::transport::server::TcpIncoming::from(grpc_listener).with_nodelay(Some(true)),
            async move {
                let _ = stop_grpc.recv().await;
            },
        );
    let http =
        axum::serve(http_listener, http::router(gateway)).with_graceful_shutdown(async move {
            let _ = stop_http.recv().await;
        });
    let task = tokio::spawn(async move {
        let stopper = tokio::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(());
        });
        let (g, h) = tokio::join!(grpc, http);
        if let Err(e) = g {
            tracing::error!("gRPC server: {e}");
        }
        if let Err(e) = h {
            tracing::error!("HTTP server: {e}");
        }
        stopper.abort();
    });
    Ok((addrs, task))
}
