//! The gateway's request span (OpenTelemetry GenAI conventions) and per-request metrics.
//!
//! One span per request, named `{gen_ai.operation.name} {gen_ai.request.model}`, kind server,
//! parented to the client's `traceparent` when it sent one. Its children: `validate`
//! (rendering, tokenization, checks) and one `upstream` per pool tried (kind client), whose
//! context goes to the worker in the call's metadata; the worker's spans hang below it.

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

/// One request's span and metrics, from the gateway's point of view.
#[derive(Debug)]
pub struct RequestTrace {
    span: tracing::Span,
    metrics: Option<GatewayRequestMetrics>,
    started: Instant,
    /// Seconds from arrival to the first delta, once it went out.
    time_to_first_token: Option<f64>,
    last_delta: Option<Instant>,
    prompt_tokens: u64,
}

impl RequestTrace {
    pub fn new(span: tracing::Span, model: &str, api: Api, started: Instant) -> Self {
        Self {
            span,
            metrics: Some(GatewayRequestMetrics::start(model, api.as_str())),
            started,
            time_to_first_token: None,
            last_delta: None,
            prompt_tokens: 0,
        }
    }

    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The request passed validation.
    pub fn validated(&mut self, req: &ValidatedRequest) {
        self.prompt_tokens = req.prompt_ids().len() as u64;
        let s = req.sampling();
        let span = &self.span;
        span.set_attribute(genai::USAGE_INPUT_TOKENS, self.prompt_tokens as i64);
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
        let ttft = match self.time_to_first_token {
            Some(t) => t,
            None => {
                let t = now.duration_since(self.started).as_secs_f64();
                self.time_to_first_token = Some(t);
                self.span.set_attribute(genai::TIME_TO_FIRST_TOKEN, t);
                if let Some(m) = &self.metrics {
                    m.first_token(t);
                }
                t
            }
        };
        if let Some(m) = &self.metrics {
            m.delta(
                tokens as u64,
                self.last_delta.map(|p| now.duration_since(p).as_secs_f64()),
            );
        }
        self.last_delta = Some(now);
        ttft
    }

    /// The request finished normally.
    pub fn finished(&mut self, finish_reason: &'static str, output_tokens: u32) {
        self.span
            .set_attribute(genai::USAGE_OUTPUT_TOKENS, i64::from(output_tokens));
        self.span
            .set_attribute(genai::RESPONSE_FINISH_REASONS, finish_reason);
        if let Some(m) = self.metrics.take() {
            m.finish(
                "ok",
                self.started.elapsed().as_secs_f64(),
                self.prompt_tokens,
            );
        }
    }

    /// The request failed (before or while streaming).
    pub fn failed(&mut self, e: &GatewayError) {
        self.span.set_attribute(genai::ERROR_TYPE, e.kind());
        self.span.record("otel.status_code", "ERROR");
        if let Some(m) = self.metrics.take() {
            m.fail(e.kind());
        }
    }
}
