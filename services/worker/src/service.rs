//! The `ferrite.worker.v1.Worker` gRPC service over an [`EngineHandle`].
//!
//! `WatchKvCache` is how a pool publishes its prefix cache to gateways (for KV-aware routing):
//! a stream per gateway, opened by the gateway, starting with a snapshot. Why a stream on the
//! worker API rather than keys in placement: blocks are stored and evicted thousands of times
//! a second, which etcd (a consensus log kept for slow-changing placement) should not carry;
//! a stream from the engine thread keeps the snapshot and the changes in order; a gateway that
//! starts (or restarts) simply opens it and is whole again; and when the pool dies its stream
//! ends, so its blocks leave the gateway's index at once, without leases per block.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use ferrite_engine::EngineError;
use ferrite_engine::engine::{EmbedParams, EngineStats, FinishReason, RequestTiming};
use ferrite_engine::handle::{EngineHandle, KvUpdate, RequestStream};
use ferrite_engine::kv_cache::BlockHash;
use ferrite_engine::model::pooling::Pooling;
use ferrite_engine::sampler::{SampledToken, SamplingParams};
use ferrite_proto::worker::v1 as pb;
use ferrite_structured::Vocabulary;
use ferrite_telemetry::metrics::{Load, RequestOutcome, WorkerMetrics};
use ferrite_telemetry::spans::{Clock, record_interval};
use ferrite_telemetry::{KeyValue, OpenTelemetrySpanExt, genai};
use futures::FutureExt;
use futures::StreamExt;
use futures::future::{BoxFuture, Shared};
use tonic::{Request, Response, Status};

use crate::streams::{KvStream, TokenStream};
use crate::synthetic::SyntheticEngine;

/// Maps an engine error to its gRPC status: the one place this mapping lives for workers.
pub fn status_of(e: &EngineError) -> Status {
    let msg = e.to_string();
    match e {
        EngineError::InvalidRequest(_)
        | EngineError::DoesNotFit(_)
        | EngineError::DuplicateRequest(_) => Status::invalid_argument(msg),
        EngineError::QueueFull(_) => Status::resource_exhausted(msg),
        // The pool cannot serve now; another may (the gateway retries before the first token).
        EngineError::Stopped
        | EngineError::ShutDown(_)
        | EngineError::Device(_)
        | EngineError::RankLost { .. }
        | EngineError::BadLogits(_) => Status::unavailable(msg),
        _ => Status::internal(msg),
    }
}

/// What produces the tokens.
#[derive(Debug, Clone)]
pub enum Backend {
    /// The real engine, on its own thread.
    Engine(EngineHandle),
    /// Fixed-rate tokens, no model (for measuring the gateway).
    Synthetic(SyntheticEngine),
}

/// The model's vocabulary for grammars (or why it has none), once it is built.
type VocabularyFuture = Shared<BoxFuture<'static, Result<Arc<Vocabulary>, String>>>;

fn ready_vocabulary(v: Result<Arc<Vocabulary>, String>) -> VocabularyFuture {
    futures::future::ready(v).boxed().shared()
}

/// The worker service. Cloning shares the backend and the draining flag.
#[derive(Debug, Clone)]
pub struct WorkerService {
    backend: Backend,
    info: Arc<pb::ModelInfo>,
    /// Compiles constrained requests' grammars (see [`crate::guide`]).
    vocabulary: VocabularyFuture,
    draining: Arc<AtomicBool>,
    /// Set when draining starts: ends the prefix-cache streams, which never end by themselves
    /// (the server's graceful stop waits for every open stream).
    closing: Arc<tokio::sync::watch::Sender<bool>>,
    metrics: WorkerMetrics,
    /// How the model's embeddings are pooled.
    pooling: Arc<Pooling>,
}

impl WorkerService {
    pub fn new(backend: Backend, info: pb::ModelInfo) -> Self {
        let metrics = WorkerMetrics::new(&info.model);
        if let Backend::Engine(e) = &backend {
            let c = e.prefix_cache();
            metrics.set_cache_config(c.block_size, c.num_blocks, c.seed.is_some());
        }
        Self {
            metrics,
            backend,
            info: Arc::new(info),
            vocabulary: ready_vocabulary(Err("it was started without one".into())),
            draining: Arc::new(AtomicBool::new(false)),
            closing: Arc::new(tokio::sync::watch::Sender::new(false)),
            pooling: Arc::new(Pooling::default()),
        }
    }

    /// This service with the model's pooling of embeddings (the default: last token,
    /// normalized).
    pub fn with_pooling(mut self, pooling: Pooling) -> Self {
        self.pooling = Arc::new(pooling);
        self
    }

    /// The engine's parameters of `req`: its sampling, or an embeddings request's (one greedy
    /// token, the embedding pooled as the model says), refused where the model pools its
    /// embeddings otherwise.
    fn params_of(&self, req: &pb::GenerateRequest) -> Result<SamplingParams, Status> {
        let lora = self.lora_of(req)?;
        let Some(embed) = &req.embed else {
            return Ok(SamplingParams {
                lora,
                ..SamplingParams::from(req.sampling.clone().unwrap_or_default())
            });
        };
        if req.grammar.is_some() {
            return Err(Status::invalid_argument(
                "an embeddings request has no output to constrain",
            ));
        }
        if embed.classify {
            return Ok(SamplingParams {
                lora,
                ..SamplingParams::classify()
            });
        }
        if let Some(why) = &self.pooling.refused {
            return Err(Status::invalid_argument(why.clone()));
        }
        Ok(SamplingParams {
            ignore_eos: true,
            embed: Some(EmbedParams {
                normalize: self.pooling.normalize,
                dimensions: (embed.dimensions > 0).then_some(embed.dimensions as usize),
                classify: false,
            }),
            lora,
            ..SamplingParams::greedy(1)
        })
    }

    /// The engine's number of the LoRA adapter `req` names, if it names one.
    fn lora_of(&self, req: &pb::GenerateRequest) -> Result<Option<u32>, Status> {
        let Some(name) = &req.lora else {
            return Ok(None);
        };
        match self.info.lora.iter().position(|n| n == name) {
            Some(i) => Ok(Some(i as u32)),
            None => Err(Status::not_found(format!(
                "this pool serves no LoRA adapter `{name}` (it serves {:?})",
                self.info.lora
            ))),
        }
    }

    /// This service with `vocabulary` for constrained requests (or why there is none).
    pub fn with_vocabulary(mut self, vocabulary: Result<Vocabulary, String>) -> Self {
        self.vocabulary = ready_vocabulary(vocabulary.map(Arc::new));
        self
    }

    /// This service with the vocabulary `build` makes, on a blocking thread from now on: it
    /// takes longer than the rest of a small model's start-up (0.13 s of the default model's
    /// 0.27 s), and only constrained requests need it; the first of them waits for it.
    pub fn with_vocabulary_built_by(
        mut self,
        build: impl FnOnce() -> Result<Vocabulary, String> + Send + 'static,
    ) -> Self {
        let task = tokio::task::spawn_blocking(move || {
            let built = build();
            if let Err(why) = &built {
                tracing::warn!("structured outputs are off for this model: {why}");
            }
            built
        });
        self.vocabulary = async move {
            let built = task
                .await
                .map_err(|e| format!("building the vocabulary failed: {e}"));
            built.and_then(|v| v).map(Arc::new)
        }
        .boxed()
        .shared();
        self
    }

    /// What `GetModelInfo` answers.
    pub fn info(&self) -> &pb::ModelInfo {
        &self.info
    }

    /// Sets the load gauges from the engine's figures (run before each `/metrics` render).
    pub fn publish_load(&self) {
        let s = self.stats();
        self.metrics.set_load(&Load {
            running: s.running,
            waiting: s.waiting,
            kv_blocks_used: s.kv_blocks_used,
            kv_blocks_total: s.kv_blocks_total,
            preemptions: s.preemptions,
            prefix_cache_queries: s.prefix_cache_queries,
            prefix_cache_hits: s.prefix_cache_hits,
            spec_draft_tokens: s.spec_draft_tokens,
            spec_accepted_tokens: s.spec_accepted_tokens,
        });
    }

    /// From now on new requests are refused with UNAVAILABLE; running ones finish.
    pub fn start_draining(&self) {
        self.draining.store(true, Ordering::SeqCst);
        // A draining pool takes no new requests: gateways need not know its cache any more.
        self.closing.send_replace(true);
    }

    /// Fails every request in flight (UNAVAILABLE: the worker shut down before it finished),
    /// for a drain whose time ran out. The synthetic backend's streams end by themselves.
    pub fn abort_all(&self, why: &str) {
        if let Backend::Engine(e) = &self.backend
            && let Err(err) = e.abort_all(why)
        {
            tracing::warn!("could not abort the requests in flight: {err}");
        }
    }

    /// Whether [`Self::start_draining`] was called.
    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// What produces the tokens.
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// Load figures of the backend (the synthetic one has no KV cache).
    pub fn stats(&self) -> EngineStats {
        match &self.backend {
            Backend::Engine(e) => e.stats(),
            Backend::Synthetic(s) => EngineStats {
                running: s.running(),
                ..EngineStats::default()
            },
        }
    }
}

fn finish_to_proto(f: Option<FinishReason>) -> i32 {
    match f {
        None | Some(FinishReason::Abort) => pb::FinishReason::Unspecified as i32,
        Some(FinishReason::Stop) => pb::FinishReason::Stop as i32,
        Some(FinishReason::Length) => pb::FinishReason::Length as i32,
    }
}

/// Block hashes per message: a large pool's snapshot goes out in pieces well under the 4 MiB
/// a gRPC message may have by default.
const HASHES_PER_MESSAGE: usize = 16_384;

fn load_of(s: &EngineStats) -> pb::Load {
    let n = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
    pb::Load {
        running: n(s.running),
        waiting: n(s.waiting),
        kv_blocks_used: n(s.kv_blocks_used),
        kv_blocks_total: n(s.kv_blocks_total),
        kv_blocks_cached: n(s.kv_blocks_cached),
        kv_blocks_empty: n(s.kv_blocks_empty),
        pending_tokens: s.pending_tokens as u64,
    }
}

fn hash_bytes(hashes: &[BlockHash]) -> Vec<Vec<u8>> {
    hashes.iter().map(|h| h.to_bytes().to_vec()).collect()
}

/// One engine update as stream messages: removals first, then stores, in pieces; the first
/// piece of a snapshot says `reset` (and how hashes are formed), every piece has the load.
fn kv_messages(u: KvUpdate, block_size: u32, seed: Option<BlockHash>) -> Vec<pb::KvCacheUpdate> {
    let load = load_of(&u.stats);
    let mut out: Vec<pb::KvCacheUpdate> = u
        .removed
        .chunks(HASHES_PER_MESSAGE)
        .map(|c| pb::KvCacheUpdate {
            removed: hash_bytes(c),
            ..pb::KvCacheUpdate::default()
        })
        .chain(
            u.stored
                .chunks(HASHES_PER_MESSAGE)
                .map(|c| pb::KvCacheUpdate {
                    stored: hash_bytes(c),
                    ..pb::KvCacheUpdate::default()
                }),
        )
        .collect();
    if out.is_empty() {
        out.push(pb::KvCacheUpdate::default());
    }
    if u.snapshot {
        out[0].reset = true;
        out[0].block_size = if seed.is_some() { block_size } else { 0 };
        out[0].hash_seed = seed.map(|s| s.to_bytes().to_vec()).unwrap_or_default();
    }
    for m in &mut out {
        m.load = Some(load);
    }
    out
}

/// One request's stream with what its span and metrics need.
struct Tracked {
    stream: RequestStream,
    span: tracing::Span,
    metrics: WorkerMetrics,
    last_token: Option<Instant>,
}

/// Records how a finished request went: its `queue`, `prefill` and `decode` child spans (with
/// the engine's timestamps), its usage on the request span, and its latency metrics.
fn on_finished(
    span: &tracing::Span,
    metrics: &WorkerMetrics,
    reason: FinishReason,
    t: &RequestTiming,
) {
    let clock = Clock::now();
    let at = |i| clock.system_time(i);
    record_interval(span, "queue", at(t.arrived), at(t.scheduled), vec![]);
    record_interval(
        span,
        "prefill",
        at(t.scheduled),
        at(t.first_token),
        vec![
            KeyValue::new("prompt_tokens", t.prompt_tokens as i64),
            KeyValue::new("cached_tokens", t.cached_tokens as i64),
            KeyValue::new("preemptions", i64::from(t.preemptions)),
        ],
    );
    record_interval(
        span,
        "decode",
        at(t.first_token),
        at(t.finished),
        vec![KeyValue::new(
            "output_tokens",
            t.output_tokens.saturating_sub(1) as i64,
        )],
    );
    let secs = |a: Instant, b: Instant| b.saturating_duration_since(a).as_secs_f64();
    span.set_attribute(genai::USAGE_INPUT_TOKENS, t.prompt_tokens as i64);
    span.set_attribute(genai::USAGE_OUTPUT_TOKENS, t.output_tokens as i64);
    span.set_attribute(genai::TIME_TO_FIRST_TOKEN, secs(t.arrived, t.first_token));
    span.set_attribute(genai::RESPONSE_FINISH_REASONS, reason.as_str());
    metrics.finished(
        reason.as_str(),
        &RequestOutcome {
            queue_s: secs(t.arrived, t.scheduled),
            time_to_first_token_s: secs(t.arrived, t.first_token),
            e2e_s: secs(t.arrived, t.finished),
            prompt_tokens: t.prompt_tokens as u64,
        },
    );
}

/// Each engine token becomes one response. The [`RequestStream`] lives inside the returned
/// stream, so when the client cancels and tonic drops it, the request is aborted at once (and
/// the request's span ends there).
fn responses(tracked: Tracked) -> TokenStream {
    Box::pin(futures::stream::unfold(Some(tracked), |state| async move {
        let mut t = state?;
        match t.stream.next().await? {
            Ok(ev) => {
                let now = Instant::now();
                t.metrics
                    .token(t.last_token.map(|p| now.duration_since(p).as_secs_f64()));
                t.last_token = Some(now);
                if let (Some(reason), Some(timing)) = (ev.finish, &ev.timing) {
                    on_finished(&t.span, &t.metrics, reason, timing);
                }
                let last = ev.finish.is_some();
                let msg = pb::GenerateResponse {
                    // An embeddings request's token is not its answer.
                    tokens: match ev.embedding {
                        Some(_) => vec![],
                        None => vec![token_of(&ev.token)],
                    },
                    embedding: ev.embedding.unwrap_or_default(),
                    finish_reason: finish_to_proto(ev.finish),
                    cached_tokens: ev
                        .cached_tokens
                        .map(|c| u32::try_from(c).unwrap_or(u32::MAX)),
                    prompt_logprobs: ev.prompt_logprobs.iter().map(token_of).collect(),
                };
                Some((Ok(msg), (!last).then_some(t)))
            }
            Err(e) => {
                let status = status_of(&e);
                t.span
                    .set_attribute(genai::ERROR_TYPE, format!("{:?}", status.code()));
                Some((Err(status), None))
            }
        }
    }))
}

/// A token and its logprobs, as the worker API carries them.
fn token_of(t: &SampledToken) -> pb::Token {
    pb::Token {
        id: t.id,
        logprob: t.logprob,
        top: (t.top.iter())
            .map(|&(token_id, logprob)| pb::TopLogprob { token_id, logprob })
            .collect(),
    }
}

#[tonic::async_trait]
impl pb::worker_server::Worker for WorkerService {
    type GenerateStream = TokenStream;

    async fn generate(
        &self,
        request: Request<pb::GenerateRequest>,
    ) -> Result<Response<Self::GenerateStream>, Status> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(Status::unavailable("this worker is draining"));
        }
        let span = tracing::info_span!("worker.generate", otel.kind = "server");
        ferrite_telemetry::propagation::set_parent_from_metadata(&span, request.metadata());
        let req = request.into_inner();
        let engine = match &self.backend {
            Backend::Engine(e) => e,
            Backend::Synthetic(s) => return Ok(Response::new(s.generate(req)?)),
        };
        span.set_attribute(genai::REQUEST_MODEL, self.info.model.clone());
        span.set_attribute("ferrite.prompt_tokens", req.prompt_token_ids.len() as i64);
        let params = self.params_of(&req)?;
        let constraint = match &req.grammar {
            Some(g) => {
                let vocabulary = self.vocabulary.clone().await;
                let guide = crate::guide::compile(&vocabulary, g).await?;
                Some(match &req.reasoning {
                    Some(span) => crate::guide::after_reasoning(guide, span),
                    None => guide,
                })
            }
            None => None,
        };
        let stream = engine
            .submit_constrained(req.prompt_token_ids, params, constraint)
            .await
            .map_err(|e| {
                let status = status_of(&e);
                span.set_attribute(genai::ERROR_TYPE, format!("{:?}", status.code()));
                status
            })?;
        Ok(Response::new(responses(Tracked {
            stream,
            span,
            metrics: self.metrics.clone(),
            last_token: None,
        })))
    }

    async fn get_model_info(
        &self,
        _: Request<pb::GetModelInfoRequest>,
    ) -> Result<Response<pb::ModelInfo>, Status> {
        Ok(Response::new((*self.info).clone()))
    }

    async fn get_load(&self, _: Request<pb::GetLoadRequest>) -> Result<Response<pb::Load>, Status> {
        Ok(Response::new(load_of(&self.stats())))
    }

    type WatchKvCacheStream = KvStream;

    async fn watch_kv_cache(
        &self,
        _: Request<pb::WatchKvCacheRequest>,
    ) -> Result<Response<Self::WatchKvCacheStream>, Status> {
        if self.draining.load(Ordering::SeqCst) {
            return Err(Status::unavailable("this worker is draining"));
        }
        let mut closing = self.closing.subscribe();
        let closed = async move {
            let _ = closing.wait_for(|c| *c).await;
        };
        let engine = match &self.backend {
            Backend::Engine(e) => e,
            Backend::Synthetic(_) => {
                // No cache: say so once, and keep the stream open (no reconnecting).
                let first = pb::KvCacheUpdate {
                    reset: true,
                    load: Some(load_of(&self.stats())),
                    ..pb::KvCacheUpdate::default()
                };
                let stream = futures::stream::once(async move { Ok(first) })
                    .chain(futures::stream::pending())
                    .take_until(closed);
                return Ok(Response::new(Box::pin(stream)));
            }
        };
        let info = engine.prefix_cache();
        let block_size = u32::try_from(info.block_size).unwrap_or(0);
        let updates = engine.watch_kv().map_err(|e| status_of(&e))?;
        let stream = tokio_stream::wrappers::ReceiverStream::new(updates)
            .flat_map(move |u| {
                futures::stream::iter(kv_messages(u, block_size, info.seed).into_iter().map(Ok))
            })
            // The engine dropped this listener (it fell behind) or stopped: the caller
            // reconnects and resyncs from a new snapshot.
            .chain(futures::stream::once(async {
                Err(Status::unavailable(
                    "the prefix-cache stream ended: reconnect for a new snapshot",
                ))
            }))
            .take_until(closed);
        Ok(Response::new(Box::pin(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn kv_updates_become_messages_in_order_and_in_pieces() {
        let seed = BlockHash(7);
        let hashes: Vec<BlockHash> = (0..20_000u128).map(BlockHash).collect();
        let snapshot = KvUpdate {
            snapshot: true,
            stored: hashes.clone(),
            ..KvUpdate::default()
        };
        let msgs = kv_messages(snapshot, 16, Some(seed));
        assert_eq!(msgs.len(), 2, "20,000 hashes in two pieces");
        assert!(msgs[0].reset && !msgs[1].reset);
        assert_eq!(
            (msgs[0].block_size, &msgs[0].hash_seed[..]),
            (16, &seed.to_bytes()[..])
        );
        assert_eq!(msgs[0].stored.len() + msgs[1].stored.len(), 20_000);
        assert_eq!(msgs[0].stored[0], hashes[0].to_bytes().to_vec());
        let delta = KvUpdate {
            removed: hashes[..1].to_vec(),
            stored: hashes[1..2].to_vec(),
            ..KvUpdate::default()
        };
        let msgs = kv_messages(delta, 16, Some(seed));
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            (msgs[0].removed.len(), msgs[1].stored.len()),
            (1, 1),
            "removals first"
        );
        assert!(msgs.iter().all(|m| !m.reset && m.load.is_some()));
        let load_only = kv_messages(KvUpdate::default(), 16, Some(seed));
        assert_eq!(load_only.len(), 1);
        // Caching off: the snapshot says block size 0.
        let off = KvUpdate {
            snapshot: true,
            ..KvUpdate::default()
        };
        let msgs = kv_messages(off, 16, None);
        assert!(msgs[0].reset && msgs[0].block_size == 0 && msgs[0].hash_seed.is_empty());
    }

    #[test]
    fn only_the_requests_own_faults_are_invalid_argument() {
        let cases = [
            (
                EngineError::InvalidRequest("x".into()),
                Code::InvalidArgument,
            ),
            (EngineError::DoesNotFit("x".into()), Code::InvalidArgument),
            (EngineError::QueueFull(8), Code::ResourceExhausted),
            (EngineError::Stopped, Code::Unavailable),
            (EngineError::BadLogits("NaN".into()), Code::Unavailable),
            (
                EngineError::Device("x".into()).for_failed_step(),
                Code::Unavailable,
            ),
            (
                EngineError::Internal("x".into()).for_failed_step(),
                Code::Internal,
            ),
            (
                EngineError::BadConfig("x".into()).for_failed_step(),
                Code::Internal,
            ),
        ];
        for (e, code) in cases {
            assert_eq!(status_of(&e).code(), code, "{e}");
        }
    }

    /// An embeddings request samples one greedy token with the model's pooling; a model that
    /// pools otherwise, or a grammar on it, is refused as the request's fault. A
    /// classification request takes the classifier's head instead.
    #[tokio::test]
    async fn embeddings_requests_take_the_models_pooling() {
        let service = WorkerService::new(
            Backend::Synthetic(SyntheticEngine::new(100.0)),
            pb::ModelInfo::default(),
        );
        let req = |dimensions, grammar: Option<&str>| pb::GenerateRequest {
            prompt_token_ids: vec![1, 2],
            embed: Some(pb::EmbedOptions {
                dimensions,
                classify: false,
            }),
            grammar: grammar.map(str::to_owned),
            ..pb::GenerateRequest::default()
        };
        let p = service.params_of(&req(0, None)).expect("params");
        assert_eq!((p.max_tokens, p.temperature), (1, 0.0));
        let want = EmbedParams {
            normalize: true,
            dimensions: None,
            classify: false,
        };
        assert_eq!(p.embed, Some(want));
        let cut = service.params_of(&req(8, None)).expect("params").embed;
        assert_eq!(cut.and_then(|e| e.dimensions), Some(8));
        let grammar = service.params_of(&req(0, Some("{}"))).expect_err("grammar");
        assert_eq!(grammar.code(), Code::InvalidArgument);
        let mean = service.with_pooling(Pooling {
            refused: Some("pools by `mean_tokens`".into()),
            ..Pooling::default()
        });
        let refused = mean.params_of(&req(0, None)).expect_err("mean pooling");
        assert_eq!(refused.code(), Code::InvalidArgument);
        assert!(refused.message().contains("mean_tokens"));
        // A classifier's request reads its head, whatever the embeddings' pooling.
        let classify = pb::GenerateRequest {
            embed: Some(pb::EmbedOptions {
                dimensions: 0,
                classify: true,
            }),
            ..req(0, None)
        };
        let p = mean.params_of(&classify).expect("classify params");
        assert_eq!(p.embed, SamplingParams::classify().embed);
    }

    /// A request naming a LoRA adapter runs with the engine's number of it (the order of
    /// `ModelInfo.lora`), embeddings requests too; a name the pool does not serve is NOT_FOUND.
    #[tokio::test]
    async fn adapters_are_numbered_as_the_pool_lists_them() {
        let info = pb::ModelInfo {
            lora: vec!["sql".into(), "chat".into()],
            ..pb::ModelInfo::default()
        };
        let service = WorkerService::new(Backend::Synthetic(SyntheticEngine::new(100.0)), info);
        let req = |lora: Option<&str>, embed: bool| pb::GenerateRequest {
            prompt_token_ids: vec![1, 2],
            lora: lora.map(str::to_owned),
            embed: embed.then(pb::EmbedOptions::default),
            ..pb::GenerateRequest::default()
        };
        let lora = |r| service.params_of(&r).map(|p| p.lora);
        assert_eq!(lora(req(None, false)).expect("base"), None);
        assert_eq!(lora(req(Some("chat"), false)).expect("chat"), Some(1));
        assert_eq!(lora(req(Some("sql"), true)).expect("embed"), Some(0));
        let unknown = lora(req(Some("nope"), false)).expect_err("unknown");
        assert_eq!(unknown.code(), Code::NotFound);
        assert!(unknown.message().contains("nope"), "{}", unknown.message());
    }
}
