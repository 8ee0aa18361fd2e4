//! Prometheus metrics: every metric name ferrite exports is in [`names`], and every update goes
//! through the recorders here ([`WorkerMetrics`], [`GatewayMetrics`], [`startup_phase`]).
//!
//! One recorder per process (the `metrics` facade): `ferrite serve` runs the gateway and a
//! worker in one process, so their metrics have distinct names and one `/metrics` shows both.
//! Until [`install`] runs, every update is a no-op.
//!
//! Load gauges (running, waiting, KV usage) are set from the engine's figures when `/metrics`
//! is scraped ([`WorkerMetrics::set_load`] in the handler), so they are never stale and cost
//! nothing between scrapes.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use metrics::{
    Counter, Gauge, Histogram, Unit, counter, describe_counter, describe_gauge, describe_histogram,
    gauge, histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// Metric names. The Kubernetes Gateway API Inference Extension's endpoint picker routes on
/// three of them; point its flags at these (the README shows how):
///
/// | what the picker reads | ferrite metric |
/// |---|---|
/// | queue depth (`--total-queued-requests-metric`) | [`NUM_REQUESTS_WAITING`] |
/// | running requests (`--total-running-requests-metric`) | [`NUM_REQUESTS_RUNNING`] |
/// | KV-cache utilization (`--kv-cache-usage-percentage-metric`) | [`KV_CACHE_USAGE_PERC`] |
/// | cache info: `block_size`, `num_gpu_blocks` labels (`--cache-info-metric`) | [`CACHE_CONFIG_INFO`] |
pub mod names {
    // Worker (one per rank 0 of a pool).
    pub const NUM_REQUESTS_RUNNING: &str = "ferrite_num_requests_running";
    pub const NUM_REQUESTS_WAITING: &str = "ferrite_num_requests_waiting";
    /// Fraction of KV blocks in use, 0..1 (vLLM's `kv_cache_usage_perc` is also a fraction).
    pub const KV_CACHE_USAGE_PERC: &str = "ferrite_kv_cache_usage_perc";
    pub const KV_CACHE_BLOCKS: &str = "ferrite_kv_cache_blocks";
    pub const TIME_TO_FIRST_TOKEN: &str = "ferrite_time_to_first_token_seconds";
    pub const INTER_TOKEN_LATENCY: &str = "ferrite_inter_token_latency_seconds";
    pub const E2E_REQUEST_LATENCY: &str = "ferrite_e2e_request_latency_seconds";
    pub const REQUEST_QUEUE_TIME: &str = "ferrite_request_queue_time_seconds";
    pub const PROMPT_TOKENS: &str = "ferrite_prompt_tokens_total";
    pub const GENERATION_TOKENS: &str = "ferrite_generation_tokens_total";
    pub const NUM_PREEMPTIONS: &str = "ferrite_num_preemptions_total";
    pub const REQUEST_SUCCESS: &str = "ferrite_request_success_total";
    /// Prompt tokens looked up in the prefix cache (vLLM's `prefix_cache_queries`).
    pub const PREFIX_CACHE_QUERIES: &str = "ferrite_prefix_cache_queries_total";
    /// Prompt tokens found in the prefix cache (hits / queries is the hit rate).
    pub const PREFIX_CACHE_HITS: &str = "ferrite_prefix_cache_hits_total";
    /// Draft tokens checked under speculative decoding (vLLM's `spec_decode_num_draft_tokens`).
    pub const SPEC_DECODE_DRAFT_TOKENS: &str = "ferrite_spec_decode_num_draft_tokens_total";
    /// Draft tokens accepted (accepted / draft is the acceptance rate).
    pub const SPEC_DECODE_ACCEPTED_TOKENS: &str = "ferrite_spec_decode_num_accepted_tokens_total";
    /// Always 1; labels `block_size`, `num_gpu_blocks` (the pool's KV blocks, on any device:
    /// the label name is the Inference Extension's) and `enable_prefix_caching`, as vLLM's
    /// `cache_config_info`, which the endpoint picker's prefix scorer reads.
    pub const CACHE_CONFIG_INFO: &str = "ferrite_cache_config_info";

    // Gateway.
    pub const GATEWAY_REQUESTS: &str = "ferrite_gateway_requests_total";
    pub const GATEWAY_REQUESTS_IN_FLIGHT: &str = "ferrite_gateway_requests_in_flight";
    pub const GATEWAY_TIME_TO_FIRST_TOKEN: &str = "ferrite_gateway_time_to_first_token_seconds";
    pub const GATEWAY_INTER_TOKEN_LATENCY: &str = "ferrite_gateway_inter_token_latency_seconds";
    pub const GATEWAY_E2E_REQUEST_LATENCY: &str = "ferrite_gateway_e2e_request_latency_seconds";
    pub const GATEWAY_PROMPT_TOKENS: &str = "ferrite_gateway_prompt_tokens_total";
    pub const GATEWAY_GENERATION_TOKENS: &str = "ferrite_gateway_generation_tokens_total";
    /// Routing decisions by policy and reason: `p2c` (always reason `p2c`), or `kv` with
    /// `prefix` (a pool's cached prefix won), `cold` (no pool holds any of it: power of two
    /// choices) or `tie` (pools within one block of each other: power of two choices among
    /// them); either policy with `sibling` (a request's later choice, sent where its first
    /// was prefilled).
    pub const GATEWAY_ROUTE_DECISIONS: &str = "ferrite_gateway_route_decisions_total";
    /// KV blocks the gateway's index says each pool holds (from the pool's KV events; 0 while
    /// the pool's stream is down).
    pub const GATEWAY_KV_INDEX_BLOCKS: &str = "ferrite_gateway_kv_index_blocks";
    /// Each ready pool's context length (labels `model`, `pool`): pools of one model may
    /// differ, and a request goes only to pools whose context holds it.
    pub const GATEWAY_POOL_MAX_MODEL_LEN: &str = "ferrite_gateway_pool_max_model_len";
    /// Calls to a pool that failed before their first token, by `pool` and `reason`
    /// (`unavailable`, `queue_full`, `first_token_timeout`), each retried on another pool.
    pub const GATEWAY_UPSTREAM_RETRIES: &str = "ferrite_gateway_upstream_retries_total";
    /// Times a pool was set aside for failing calls in a row (label `pool`).
    pub const GATEWAY_POOL_EJECTIONS: &str = "ferrite_gateway_pool_ejections_total";

    // Every process.
    pub const STARTUP_PHASE: &str = "ferrite_startup_phase_seconds";
    pub const BUILD_INFO: &str = "ferrite_build_info";
}

use names::*;

const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0,
];
const ITL_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
    0.4, 0.5, 0.75, 1.0, 2.5,
];
const REQUEST_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0,
];

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Installs the process's Prometheus recorder (once; later calls are no-ops).
pub fn install() -> Result<(), String> {
    if HANDLE.get().is_some() {
        return Ok(());
    }
    let mut builder = PrometheusBuilder::new();
    for (names, buckets) in [
        (
            &[TIME_TO_FIRST_TOKEN, GATEWAY_TIME_TO_FIRST_TOKEN][..],
            TTFT_BUCKETS,
        ),
        (
            &[INTER_TOKEN_LATENCY, GATEWAY_INTER_TOKEN_LATENCY][..],
            ITL_BUCKETS,
        ),
        (
            &[
                E2E_REQUEST_LATENCY,
                GATEWAY_E2E_REQUEST_LATENCY,
                REQUEST_QUEUE_TIME,
            ][..],
            REQUEST_BUCKETS,
        ),
    ] {
        for name in names {
            builder = builder
                .set_buckets_for_metric(Matcher::Full((*name).to_owned()), buckets)
                .map_err(|e| e.to_string())?;
        }
    }
    let handle = builder.install_recorder().map_err(|e| e.to_string())?;
    describe();
    gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
    let _ = HANDLE.set(handle);
    Ok(())
}

fn describe() {
    describe_gauge!(
        NUM_REQUESTS_RUNNING,
        "Requests in the running batch (KV blocks held)."
    );
    describe_gauge!(NUM_REQUESTS_WAITING, "Requests queued for admission.");
    describe_gauge!(
        KV_CACHE_USAGE_PERC,
        "Fraction of KV-cache blocks in use (0..1)."
    );
    describe_gauge!(KV_CACHE_BLOCKS, "KV-cache blocks in the pool.");
    describe_histogram!(
        TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Worker: arrival to first token."
    );
    describe_histogram!(
        INTER_TOKEN_LATENCY,
        Unit::Seconds,
        "Worker: time between tokens."
    );
    describe_histogram!(
        E2E_REQUEST_LATENCY,
        Unit::Seconds,
        "Worker: arrival to last token."
    );
    describe_histogram!(
        REQUEST_QUEUE_TIME,
        Unit::Seconds,
        "Worker: arrival to first scheduled."
    );
    describe_counter!(PROMPT_TOKENS, "Worker: prompt tokens of finished requests.");
    describe_counter!(GENERATION_TOKENS, "Worker: tokens generated.");
    describe_counter!(
        NUM_PREEMPTIONS,
        "Worker: requests preempted (KV blocks reclaimed)."
    );
    describe_counter!(
        REQUEST_SUCCESS,
        "Worker: finished requests by finish reason."
    );
    describe_counter!(
        PREFIX_CACHE_QUERIES,
        "Worker: prompt tokens looked up in the prefix cache."
    );
    describe_counter!(
        PREFIX_CACHE_HITS,
        "Worker: prompt tokens found in the prefix cache."
    );
    describe_gauge!(
        CACHE_CONFIG_INFO,
        "Worker: KV cache configuration (labels); always 1."
    );
    describe_counter!(
        GATEWAY_ROUTE_DECISIONS,
        "Gateway: routing decisions by policy and reason."
    );
    describe_gauge!(
        GATEWAY_KV_INDEX_BLOCKS,
        "Gateway: KV blocks each pool holds, as its KV events say."
    );
    describe_gauge!(
        GATEWAY_POOL_MAX_MODEL_LEN,
        "Gateway: the context length of each ready pool."
    );
    describe_counter!(
        GATEWAY_UPSTREAM_RETRIES,
        "Gateway: calls retried on another pool before their first token, by reason."
    );
    describe_counter!(
        GATEWAY_POOL_EJECTIONS,
        "Gateway: pools set aside for failing calls in a row."
    );
    describe_counter!(
        GATEWAY_REQUESTS,
        "Gateway: requests by API and status code."
    );
    describe_gauge!(
        GATEWAY_REQUESTS_IN_FLIGHT,
        "Gateway: requests being streamed now."
    );
    describe_histogram!(
        GATEWAY_TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Gateway: request to first token."
    );
    describe_histogram!(
        GATEWAY_INTER_TOKEN_LATENCY,
        Unit::Seconds,
        "Gateway: time between deltas."
    );
    describe_histogram!(
        GATEWAY_E2E_REQUEST_LATENCY,
        Unit::Seconds,
        "Gateway: request to end of stream."
    );
    describe_counter!(
        GATEWAY_PROMPT_TOKENS,
        "Gateway: prompt tokens of finished requests."
    );
    describe_counter!(
        GATEWAY_GENERATION_TOKENS,
        "Gateway: tokens streamed to clients."
    );
    describe_gauge!(
        STARTUP_PHASE,
        Unit::Seconds,
        "Duration of each start-up phase of this process."
    );
    describe_gauge!(
        BUILD_INFO,
        "Always 1; the version label says which ferrite."
    );
}

type Hook = Arc<dyn Fn() + Send + Sync>;

static HOOKS: Mutex<Vec<(u64, Hook)>> = Mutex::new(Vec::new());
static NEXT_HOOK: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A function run before every render (to set gauges from live figures); removed when dropped.
#[must_use = "the hook is removed when this is dropped"]
pub struct ScrapeHook(u64);

impl std::fmt::Debug for ScrapeHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScrapeHook({})", self.0)
    }
}

impl ScrapeHook {
    pub fn new(hook: impl Fn() + Send + Sync + 'static) -> Self {
        let id = NEXT_HOOK.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        HOOKS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((id, Arc::new(hook)));
        Self(id)
    }
}

impl Drop for ScrapeHook {
    fn drop(&mut self) {
        HOOKS
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|(id, _)| *id != self.0);
    }
}

/// The metrics in the Prometheus text format, after running the scrape hooks; `None` if no
/// recorder was installed.
pub fn render() -> Option<String> {
    let handle = HANDLE.get()?;
    let hooks: Vec<Hook> = HOOKS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .iter()
        .map(|(_, h)| h.clone())
        .collect();
    for hook in hooks {
        hook();
    }
    Some(handle.render())
}

/// `GET /metrics` (and nothing else), for processes without another HTTP server.
pub fn router() -> axum::Router {
    axum::Router::new().route("/metrics", axum::routing::get(metrics_handler))
}

/// The `/metrics` handler: 404 when this process has no recorder.
pub async fn metrics_handler() -> axum::response::Response {
    use axum::response::IntoResponse;
    match render() {
        Some(text) => ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response(),
        None => (
            axum::http::StatusCode::NOT_FOUND,
            "metrics are not enabled in this process",
        )
            .into_response(),
    }
}

/// The content type of [`render`]'s text.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Counts one routing decision of the gateway (see [`names::GATEWAY_ROUTE_DECISIONS`]).
pub fn route_decision(policy: &'static str, reason: &'static str) {
    counter!(GATEWAY_ROUTE_DECISIONS, "policy" => policy, "reason" => reason).increment(1);
}

/// Sets how many KV blocks the gateway's index holds for `pool`.
pub fn gateway_kv_index_blocks(pool: &str, blocks: usize) {
    gauge!(GATEWAY_KV_INDEX_BLOCKS, "pool" => pool.to_owned()).set(blocks as f64);
}

/// Sets `pool`'s context length (0: the pool is gone or not ready).
pub fn gateway_pool_max_model_len(model: &str, pool: &str, tokens: u32) {
    gauge!(GATEWAY_POOL_MAX_MODEL_LEN, "model" => model.to_owned(), "pool" => pool.to_owned())
        .set(f64::from(tokens));
}

/// Counts one call to `pool` retried on another before its first token.
pub fn gateway_upstream_retry(pool: &str, reason: &'static str) {
    counter!(GATEWAY_UPSTREAM_RETRIES, "pool" => pool.to_owned(), "reason" => reason).increment(1);
}

/// Counts one time `pool` was set aside.
pub fn gateway_pool_ejection(pool: &str) {
    counter!(GATEWAY_POOL_EJECTIONS, "pool" => pool.to_owned()).increment(1);
}

/// Records one start-up phase's duration.
pub fn startup_phase(phase: &str, seconds: f64) {
    gauge!(STARTUP_PHASE, "phase" => phase.to_owned()).set(seconds);
}

/// The engine's load at one instant.
#[derive(Debug, Clone, Copy, Default)]
pub struct Load {
    pub running: usize,
    pub waiting: usize,
    pub kv_blocks_used: usize,
    pub kv_blocks_total: usize,
    /// Preemptions since start (a running total, set as the counter's value).
    pub preemptions: u64,
    /// Prompt tokens looked up in the prefix cache, and found there, since start (totals).
    pub prefix_cache_queries: u64,
    pub prefix_cache_hits: u64,
    /// Draft tokens checked under speculative decoding, and accepted, since start (totals).
    pub spec_draft_tokens: u64,
    pub spec_accepted_tokens: u64,
}

/// How one request went through a worker, for its histograms and counters.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestOutcome {
    pub queue_s: f64,
    pub time_to_first_token_s: f64,
    pub e2e_s: f64,
    pub prompt_tokens: u64,
}

/// A worker's metrics, labelled with the model it serves. The per-token ones are resolved
/// once here (a registry lookup each), not on every token; create it after [`install`].
#[derive(Debug, Clone)]
pub struct WorkerMetrics {
    model: String,
    generation_tokens: Counter,
    inter_token_latency: Histogram,
}

impl WorkerMetrics {
    pub fn new(model: &str) -> Self {
        let label = [("model_name", model.to_owned())];
        Self {
            model: model.to_owned(),
            generation_tokens: counter!(GENERATION_TOKENS, &label),
            inter_token_latency: histogram!(INTER_TOKEN_LATENCY, &label),
        }
    }

    fn label(&self) -> [(&'static str, String); 1] {
        [("model_name", self.model.clone())]
    }

    pub fn set_load(&self, l: &Load) {
        let label = self.label();
        gauge!(NUM_REQUESTS_RUNNING, &label).set(l.running as f64);
        gauge!(NUM_REQUESTS_WAITING, &label).set(l.waiting as f64);
        gauge!(KV_CACHE_BLOCKS, &label).set(l.kv_blocks_total as f64);
        let usage = if l.kv_blocks_total == 0 {
            0.0
        } else {
            l.kv_blocks_used as f64 / l.kv_blocks_total as f64
        };
        gauge!(KV_CACHE_USAGE_PERC, &label).set(usage);
        counter!(NUM_PREEMPTIONS, &label).absolute(l.preemptions);
        counter!(PREFIX_CACHE_QUERIES, &label).absolute(l.prefix_cache_queries);
        counter!(PREFIX_CACHE_HITS, &label).absolute(l.prefix_cache_hits);
        counter!(SPEC_DECODE_DRAFT_TOKENS, &label).absolute(l.spec_draft_tokens);
        counter!(SPEC_DECODE_ACCEPTED_TOKENS, &label).absolute(l.spec_accepted_tokens);
    }

    /// Publishes the KV cache's configuration ([`names::CACHE_CONFIG_INFO`]).
    pub fn set_cache_config(&self, block_size: usize, num_blocks: usize, prefix_caching: bool) {
        gauge!(CACHE_CONFIG_INFO,
            "model_name" => self.model.clone(),
            "block_size" => block_size.to_string(),
            "num_gpu_blocks" => num_blocks.to_string(),
            "enable_prefix_caching" => if prefix_caching { "True" } else { "False" })
        .set(1.0);
    }

    /// One token left the worker `gap_s` after the previous one of the same request.
    pub fn token(&self, gap_s: Option<f64>) {
        self.generation_tokens.increment(1);
        if let Some(g) = gap_s {
            self.inter_token_latency.record(g);
        }
    }

    /// A request finished (`reason`: stop, length, abort).
    pub fn finished(&self, reason: &'static str, o: &RequestOutcome) {
        let label = self.label();
        histogram!(REQUEST_QUEUE_TIME, &label).record(o.queue_s);
        histogram!(TIME_TO_FIRST_TOKEN, &label).record(o.time_to_first_token_s);
        histogram!(E2E_REQUEST_LATENCY, &label).record(o.e2e_s);
        counter!(PROMPT_TOKENS, &label).increment(o.prompt_tokens);
        counter!(REQUEST_SUCCESS, "model_name" => self.model.clone(), "finish_reason" => reason)
            .increment(1);
    }
}

/// The gateway's metrics for one request; labelled with its model and API (`grpc`, `http`).
/// The per-delta ones are resolved once per request, not on every delta.
#[derive(Debug)]
pub struct GatewayRequestMetrics {
    model: String,
    api: &'static str,
    finished: bool,
    in_flight: Gauge,
    generation_tokens: Counter,
    inter_token_latency: Histogram,
}

impl GatewayRequestMetrics {
    /// A request entered the gateway (counted in flight until [`Self::finish`] or drop).
    pub fn start(model: &str, api: &'static str) -> Self {
        let label = [("model_name", model.to_owned())];
        let in_flight = gauge!(GATEWAY_REQUESTS_IN_FLIGHT, &label);
        in_flight.increment(1.0);
        Self {
            model: model.to_owned(),
            api,
            finished: false,
            in_flight,
            generation_tokens: counter!(GATEWAY_GENERATION_TOKENS, &label),
            inter_token_latency: histogram!(GATEWAY_INTER_TOKEN_LATENCY, &label),
        }
    }

    pub fn first_token(&self, seconds: f64) {
        histogram!(GATEWAY_TIME_TO_FIRST_TOKEN, "model_name" => self.model.clone()).record(seconds);
    }

    /// `tokens` reached the client `gap_s` after the previous delta.
    pub fn delta(&self, tokens: u64, gap_s: Option<f64>) {
        self.generation_tokens.increment(tokens);
        if let Some(g) = gap_s {
            self.inter_token_latency.record(g);
        }
    }

    /// The request ended with `code` (`ok`, or the error kind) after `e2e_s`.
    pub fn finish(mut self, code: &'static str, e2e_s: f64, prompt_tokens: u64) {
        self.finished = true;
        self.end(code);
        histogram!(GATEWAY_E2E_REQUEST_LATENCY, "model_name" => self.model.clone()).record(e2e_s);
        counter!(GATEWAY_PROMPT_TOKENS, "model_name" => self.model.clone())
            .increment(prompt_tokens);
    }

    /// The request failed with `code` (the error kind) before or while streaming.
    pub fn fail(mut self, code: &'static str) {
        self.finished = true;
        self.end(code);
    }

    fn end(&self, code: &'static str) {
        self.in_flight.decrement(1.0);
        counter!(GATEWAY_REQUESTS, "model_name" => self.model.clone(), "api" => self.api, "code" => code)
            .increment(1);
    }
}

impl Drop for GatewayRequestMetrics {
    fn drop(&mut self) {
        if !self.finished {
            // The client went away (or the stream failed) before the end.
            self.end("cancelled");
        }
    }
}
