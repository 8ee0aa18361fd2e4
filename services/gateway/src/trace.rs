//! The gateway's request span (OpenTelemetry GenAI conventions) and per-request metrics.
//!
//! One span per request, named `{gen_ai.operation.name} {gen_ai.request.model}`, kind server,
//! parented to the client's `traceparent` when it sent one. Its children: `validate`
//! (rendering, tokenization, checks) and one `upstream` per pool tried (kind client), whose
//! context goes to the worker in the call's metadata; the worker's spans hang below it.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use ferrite_telemetry::metrics::GatewayRequestMetrics;
use ferrite_telemetry::{OpenTelemetrySpanExt, genai};

use crate::error::GatewayError;
use crate::validate::{Prompt, ValidatedRequest};

/// Which public API a request came through (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    Grpc,
    Http,
}

impl Api {
    fn as_str(self) -> &'static str {
        match self {
            Api::Grpc => "grpc",
            Api::Http => "http",
        }
    }
}

fn operation(prompt: &Prompt) -> &'static str {
    match prompt {
        Prompt::Chat(_) => genai::OP_CHAT,
        _ => genai::OP_TEXT_COMPLETION,
    }
}

/// A new request's span; set its parent (the client's context) before using it.
pub fn request_span(model: &str, prompt: &Prompt) -> tracing::Span {
    let op = operation(prompt);
    let span = tracing::info_span!("gen_ai.request", otel.name = %format!("{op} {model}"),
        otel.kind = "server", otel.status_code = tracing::field::Empty);
    span.set_attribute(genai::OPERATION_NAME, op);
    span.set_attribute(genai::PROVIDER_NAME, genai::PROVIDER);
    span.set_attribute(genai::REQUEST_MODEL, model.to_owned());
    span
}

/// One request's span and metrics, from the gateway's point of view. A request with several
/// choices (OpenAI's `n`) has one trace, cloned into each choice's stream: the first delta of
/// any choice is the request's first token, the deltas of all count, and it finishes when the
/// last choice does.
#[derive(Debug, Clone)]
pub struct RequestTrace {
    span: tracing::Span,
    started: Instant,
    /// This choice's last delta (the gap between deltas is per choice).
    last_delta: Option<Instant>,
    shared: Arc<Mutex<Shared>>,
}

/// What the choices of one request count together.
#[derive(Debug)]
struct Shared {
    metrics: Option<GatewayRequestMetrics>,
    /// Seconds from arrival to the first delta, once it went out.
    time_to_first_token: Option<f64>,
    prompt_tokens: u64,
    choices: usize,
    finish_reasons: Vec<&'static str>,
    output_tokens: u32,
}

impl RequestTrace {
    pub fn new(span: tracing::Span, model: &str, api: Api, started: Instant) -> Self {
        let shared = Shared {
            metrics: Some(GatewayRequestMetrics::start(model, api.as_str())),
            time_to_first_token: None,
            prompt_tokens: 0,
            choices: 1,
            finish_reasons: Vec::new(),
            output_tokens: 0,
        };
        Self {
            span,
            started,
            last_delta: None,
            shared: Arc::new(Mutex::new(shared)),
        }
    }

    /// The trace of a request for `n` choices (before it is cloned into their streams).
    pub fn with_choices(self, n: usize) -> Self {
        if n != 1 {
            self.span
                .set_attribute(genai::REQUEST_CHOICE_COUNT, n as i64);
        }
        self.lock().choices = n.max(1);
        self
    }

    fn lock(&self) -> MutexGuard<'_, Shared> {
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The request passed validation.
    pub fn validated(&mut self, req: &ValidatedRequest) {
        let prompt_tokens = req.prompt_ids().len() as u64;
        self.lock().prompt_tokens = prompt_tokens;
        let s = req.sampling();
        let span = &self.span;
        span.set_attribute(genai::USAGE_INPUT_TOKENS, prompt_tokens as i64);
        span.set_attribute(genai::REQUEST_MAX_TOKENS, i64::from(s.max_tokens));
        span.set_attribute(genai::REQUEST_TEMPERATURE, f64::from(s.temperature));
        span.set_attribute(genai::REQUEST_TOP_P, f64::from(s.top_p));
        if s.top_k > 0 {
            span.set_attribute(genai::REQUEST_TOP_K, i64::from(s.top_k));
        }
        if let Some(seed) = s.seed {
            span.set_attribute(genai::REQUEST_SEED, seed as i64);
        }
    }

    /// A delta of `tokens` tokens is going to the client. Returns the request's time to first
    /// token, in seconds.
    pub fn delta(&mut self, tokens: usize) -> f64 {
        let now = Instant::now();
        let gap = self.last_delta.map(|p| now.duration_since(p).as_secs_f64());
        self.last_delta = Some(now);
        let mut shared = self.lock();
        let ttft = match shared.time_to_first_token {
            Some(t) => t,
            None => {
                let t = now.duration_since(self.started).as_secs_f64();
                shared.time_to_first_token = Some(t);
                self.span.set_attribute(genai::TIME_TO_FIRST_TOKEN, t);
                if let Some(m) = &shared.metrics {
                    m.first_token(t);
                }
                t
            }
        };
        if let Some(m) = &shared.metrics {
            m.delta(tokens as u64, gap);
        }
        ttft
    }

    /// This choice finished normally; the request does with its last choice.
    pub fn finished(&mut self, finish_reason: &'static str, output_tokens: u32) {
        let mut shared = self.lock();
        shared.finish_reasons.push(finish_reason);
        shared.output_tokens = shared.output_tokens.saturating_add(output_tokens);
        if shared.finish_reasons.len() < shared.choices {
            return;
        }
        let span = &self.span;
        span.set_attribute(genai::USAGE_OUTPUT_TOKENS, i64::from(shared.output_tokens));
        let reasons = genai::string_array(&shared.finish_reasons);
        span.set_attribute(genai::RESPONSE_FINISH_REASONS, reasons);
        let prompt_tokens = shared.prompt_tokens;
        if let Some(m) = shared.metrics.take() {
            m.finish("ok", self.started.elapsed().as_secs_f64(), prompt_tokens);
        }
    }

    /// The request failed (before or while streaming), in this choice or another.
    pub fn failed(&mut self, e: &GatewayError) {
        self.span.set_attribute(genai::ERROR_TYPE, e.kind());
        self.span.record("otel.status_code", "ERROR");
        if let Some(m) = self.lock().metrics.take() {
            m.fail(e.kind());
        }
    }
}
