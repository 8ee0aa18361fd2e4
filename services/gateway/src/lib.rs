//! The gateway: ferrite's public front.
//!
//! # Layout
//!
//! - [`auth`]: API keys (bearer tokens on both APIs; health, reflection, metrics stay open).
//! - [`limits`]: per-caller request and token rate limits.
//! - [`listen`]: both listeners, in plaintext or TLS.
//! - [`pools`]: the view of placement (ready pools by model), kept current by a watch.
//! - [`models`]: each model's tokenizer and limits, fetched from a pool (no model files here).
//! - [`validate`]: prompt rendering/tokenization and the checks that build a
//!   [`validate::ValidatedRequest`].
//! - [`kv_index`]: which pools hold which KV blocks, from each pool's prefix-cache stream.
//! - [`route`]: KV-aware or power-of-two-choices routing, retry before the first token, and
//!   the bounds on waiting for a pool ([`route::UpstreamLimits`]).
//! - [`outlier`]: pools set aside for a while after failing calls in a row.
//! - [`stream`]: worker token ids → text deltas (incremental detokenization, stop strings).
//! - [`tools`]: tool calling: the tools put before the model in its family's format, the
//!   grammar holding it to them, its output read back as calls ([`tool_stream`]: as it is
//!   written, for streaming).
//! - [`trace`]: each request's GenAI span and metrics.
//! - [`grpc`]: the `ferrite.v1.Inference` service; [`http`]: the OpenAI-compatible API, whose
//!   request bodies [`openai`] reads (refusing what is not served) and whose log-probabilities
//!   [`logprobs`] writes, whose answers [`reply`] builds from the events of every choice, and
//!   whose errors [`api_error`] shapes as OpenAI's; [`tokenizer_http`]: vLLM's tokenizer
//!   endpoints beside it (for evaluation harnesses); [`embeddings`] and [`classify`]: the
//!   pooling endpoints (embeddings; rerank, score and classify for sequence classifiers).
//! - [`error`]: [`GatewayError`] and its mapping to gRPC status.
//!
//! The gateway owns text; workers own tokens.

pub mod api_error;
mod asked;
pub mod auth;
pub mod classify;
pub mod embeddings;
pub mod error;
pub mod grpc;
pub mod harmony;
pub mod http;
pub mod kv_index;
pub mod limits;
pub mod listen;
pub mod logprobs;
pub mod models;
pub mod openai;
pub mod outlier;
pub mod pools;
pub mod reply;
pub mod responses;
pub mod responses_reply;
pub mod responses_store;
pub mod route;
pub mod stream;
pub mod tokenizer_http;
pub mod tool_stream;
pub mod tools;
pub mod trace;
pub mod validate;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use ferrite_placement::{KeySchema, Store};
use ferrite_proto::v1 as api;
use futures::{Stream, StreamExt};
use tracing::Instrument;

pub use auth::ApiKeys;
pub use error::GatewayError;
use limits::Limiter;
pub use limits::RateLimits;
use models::{ModelText, ModelTexts};
use pools::{ChannelConfig, PoolView};
use stream::GenerateEvent;
use validate::Prompt;

/// Shared state of one gateway process. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Gateway {
    pools: PoolView,
    texts: Arc<ModelTexts>,
    keys: Arc<ApiKeys>,
    limiter: Arc<Limiter>,
    /// The public listeners' TLS files (none: plaintext).
    tls: Option<ferrite_tls::TlsFiles>,
    routing: route::Routing,
    limits: route::UpstreamLimits,
    /// The Responses API's kept responses.
    responses: Arc<responses_store::ResponseStore>,
    /// Sets the KV index gauges when `/metrics` is scraped (removed with the last clone).
    _index_gauges: Arc<ferrite_telemetry::metrics::ScrapeHook>,
}

impl Gateway {
    /// A gateway following the pools under `schema` in `store`, calling them in plaintext.
    pub fn new(store: Store, schema: KeySchema) -> Self {
        Self::with_worker_tls(store, schema, None)
    }

    /// A gateway following the pools under `schema` in `store`, calling their workers with
    /// `worker_tls` (the CA they chain to, and the gateway's client certificate for mutual
    /// TLS) when set.
    pub fn with_worker_tls(
        store: Store,
        schema: KeySchema,
        worker_tls: Option<tonic::transport::ClientTlsConfig>,
    ) -> Self {
        let channels = ChannelConfig {
            tls: worker_tls.map(pools::WorkerTls::Fixed),
            ..ChannelConfig::default()
        };
        Self::with_channels(store, schema, channels)
    }

    /// A gateway following the pools under `schema` in `store`, calling their workers over
    /// channels set up as `channels` says (TLS, keep-alive).
    pub fn with_channels(store: Store, schema: KeySchema, channels: ChannelConfig) -> Self {
        let pools = PoolView::new(channels);
        let follower = pools.clone();
        tokio::spawn(async move { follower.follow(store, schema).await });
        let index = pools.kv().clone();
        let index_gauges = ferrite_telemetry::metrics::ScrapeHook::new(move || {
            for (pool, blocks) in index.block_counts() {
                ferrite_telemetry::metrics::gateway_kv_index_blocks(&pool, blocks);
            }
        });
        Self {
            pools,
            texts: Arc::new(ModelTexts::default()),
            keys: Arc::new(ApiKeys::default()),
            limiter: Arc::new(Limiter::default()),
            tls: None,
            routing: route::Routing::default(),
            limits: route::UpstreamLimits::default(),
            responses: Arc::default(),
            _index_gauges: Arc::new(index_gauges),
        }
    }

    /// Bounds what JSON schemas leave unbounded (strings, arrays, free values) when `on`, so
    /// that a small model held to a schema ends (default: off; the schema as written).
    pub fn with_json_bounds(mut self, on: bool) -> Self {
        self.texts = Arc::new(ModelTexts::with_json_bounds(on));
        self
    }

    /// Routes with `routing` (default: KV-aware).
    pub fn with_routing(mut self, routing: route::Routing) -> Self {
        self.routing = routing;
        self
    }

    pub fn routing(&self) -> route::Routing {
        self.routing
    }

    /// Waits on pools at most as `limits` say (default: [`route::UpstreamLimits::default`]).
    pub fn with_upstream_limits(mut self, limits: route::UpstreamLimits) -> Self {
        self.limits = limits;
        self
    }

    /// Serves both public listeners with TLS from `files`.
    pub fn with_tls(mut self, files: ferrite_tls::TlsFiles) -> Self {
        self.tls = Some(files);
        self
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

    /// The responses kept for the Responses API.
    pub fn stored_responses(&self) -> &Arc<responses_store::ResponseStore> {
        &self.responses
    }

    pub fn api_keys(&self) -> &ApiKeys {
        &self.keys
    }

    pub fn pools(&self) -> &PoolView {
        &self.pools
    }

    /// The text side of `model`, and the largest context of its ready pools with that text
    /// side. No ready pool: UNAVAILABLE, or NOT_FOUND for a model never served here (see
    /// [`PoolView::none_ready`]).
    pub async fn model_text(&self, model: &str) -> Result<(Arc<ModelText>, usize), GatewayError> {
        let ready = self.pools.ready(model);
        if ready.is_empty() {
            return Err(self.pools.none_ready(model));
        }
        let text = self.texts.get(model, &ready).await?;
        let context = ready
            .iter()
            .filter(|p| p.record.text_digest == text.digest)
            .map(|p| p.record.max_model_len as usize)
            .max()
            .unwrap_or(0);
        Ok((text, context))
    }

    /// Fetches `model`'s text side and builds its grammar compiler in the background, so the
    /// first constrained request does not wait for them (the compiler takes ~140 ms to build
    /// for the default model; a request that comes sooner waits for the build under way).
    pub fn warm(&self, model: &str) {
        let (gateway, model) = (self.clone(), model.to_owned());
        tokio::spawn(async move {
            let Ok((text, _)) = gateway.model_text(&model).await else {
                return;
            };
            let _ = tokio::task::spawn_blocking(move || text.vocabulary().is_ok()).await;
        });
    }

    /// What `model`'s requests that leave a sampling field unset get (`None`: its text side
    /// could not be fetched now).
    pub async fn sampling_defaults(&self, model: &str) -> Option<api::SamplingDefaults> {
        let (text, _) = self.model_text(model).await.ok()?;
        Some(text.sampling_defaults.clone())
    }

    /// Validates, routes and streams one completion request, for `request.choices`
    /// completions. `span` is the request's span ([`trace::request_span`], parented to the
    /// client's context); it ends with the last stream.
    ///
    /// Returns once the first choice has its first token. The others start when their streams
    /// are first polled: on the first choice's pool, whose prefix cache holds the prompt once
    /// it has a token, so the prompt is prefilled once. A caller's limits count the request
    /// once, with every choice's `max_tokens`.
    pub async fn generate(
        &self,
        request: GenerateArgs<'_>,
        span: tracing::Span,
    ) -> Result<Choices, GatewayError> {
        let GenerateArgs {
            model,
            prompt,
            sampling,
            constraint,
            tools,
            deadline,
            started,
            api,
            caller,
            choices,
        } = request;
        let mut trace = trace::RequestTrace::new(span.clone(), model, api, started)
            .with_choices(choices as usize);
        let opened = async {
            // A caller over its request limit is refused before its prompt costs anything.
            self.limiter.check_requests(caller, Instant::now())?;
            let validated = async {
                let (text, context) = self.model_text(model).await?;
                // Rendering and tokenizing a long prompt takes milliseconds: off the runtime's
                // threads, which carry every other stream.
                let prompt = prompt.clone();
                tokio::task::spawn_blocking(move || {
                    let c = constraint.as_ref();
                    validate::validate(text, context, &prompt, sampling, c, tools)
                })
                .await
                .map_err(|e| GatewayError::Internal(format!("the tokenizing thread: {e}")))?
            }
            .instrument(tracing::info_span!("validate"))
            .await?;
            trace.validated(&validated);
            let outputs = validated.sampling().max_tokens as usize * choices.max(1) as usize;
            let tokens = validated.prompt_ids().len() + outputs;
            self.limiter.admit(caller, tokens, Instant::now())?;
            let upstream = route::open(&self.pools, &validated, deadline, self.routes(), None);
            let upstream = upstream.await?;
            Ok((validated, upstream))
        }
        .instrument(span)
        .await;
        let (req, upstream) = match opened {
            Ok(opened) => opened,
            Err(e) => {
                trace.failed(&e);
                return Err(e);
            }
        };
        // The later choices take the first's prompt scores, and find the prompt in the cache.
        let scores = (req.sampling().prompt_logprobs.is_some())
            .then(|| stream::shared_prompt_event(&req, &upstream.first));
        let others = (1..choices.max(1))
            .map(|i| {
                let choice = match scores {
                    Some(_) => req.for_choice(i).without_prompt_scores(),
                    None => req.for_choice(i),
                };
                let later = (choice, scores.clone());
                self.later_choice(later, &upstream.pool, trace.clone(), deadline)
            })
            .collect();
        let idle = self.limits.idle;
        let first = stream::events(&req, upstream, trace, deadline, idle);
        Ok(Choices {
            first: Box::pin(first),
            others,
        })
    }

    fn routes(&self) -> (route::Routing, route::UpstreamLimits) {
        (self.routing, self.limits)
    }

    /// The stream of a later choice `req` of a request whose first choice is on `pool`: it is
    /// routed (to `pool` first) when first polled; the first choice's prompt scores, where
    /// there are, come first.
    fn later_choice(
        &self,
        (req, scores): (validate::ValidatedRequest, Option<GenerateEvent>),
        pool: &str,
        mut trace: trace::RequestTrace,
        deadline: Option<Instant>,
    ) -> EventStream {
        let (view, routes, pool) = (self.pools.clone(), self.routes(), pool.to_owned());
        let span = trace.span().clone();
        let opened = async move {
            let upstream = route::open(&view, &req, deadline, routes, Some(&pool));
            match upstream.instrument(span).await {
                Ok(up) => stream::events(&req, up, trace, deadline, routes.1.idle).boxed(),
                Err(e) => {
                    trace.failed(&e);
                    futures::stream::once(async { Err(e) }).boxed()
                }
            }
        };
        let scores = futures::stream::iter(scores.map(Ok));
        Box::pin(scores.chain(futures::stream::once(opened).flatten()))
    }
}

/// The events of one choice of a completion.
pub type EventStream = Pin<Box<dyn Stream<Item = Result<GenerateEvent, GatewayError>> + Send>>;

/// The streams of a request's choices, index 0 first.
pub struct Choices {
    /// Choice 0, which has its first token.
    pub first: EventStream,
    /// Choices 1.., routed when first polled.
    pub others: Vec<EventStream>,
}

impl std::fmt::Debug for Choices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Choices")
            .field("others", &self.others.len())
            .finish_non_exhaustive()
    }
}

impl Choices {
    /// Every choice's stream, by index.
    pub fn into_streams(self) -> Vec<EventStream> {
        let mut all = vec![self.first];
        all.extend(self.others);
        all
    }
}

/// One completion request, as both APIs hand it to [`Gateway::generate`].
#[derive(Debug)]
pub struct GenerateArgs<'a> {
    pub model: &'a str,
    pub prompt: &'a Prompt,
    pub sampling: Option<api::SamplingParams>,
    /// What the output must follow, if anything.
    pub constraint: Option<validate::Constraint>,
    /// The tools the model may call (chats only).
    pub tools: Option<std::sync::Arc<tools::Tools>>,
    pub deadline: Option<Instant>,
    /// When the request arrived (time to first token counts from here).
    pub started: Instant,
    pub api: trace::Api,
    /// Whose rate limits the request counts against.
    pub caller: auth::Caller,
    /// How many completions of the prompt to make (`n`).
    pub choices: u32,
}

pub use listen::{GatewayAddrs, serve};
pub use route::Routing;
