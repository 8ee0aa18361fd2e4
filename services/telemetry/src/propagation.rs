//! W3C trace context (`traceparent`, `tracestate`) across process boundaries: from a client's
//! gRPC metadata or HTTP headers into the gateway's span, from the gateway's span into the
//! worker call's metadata, and from the `TRACEPARENT` environment variable into a process's
//! `startup` span (so a launcher can put every rank of a pool into one trace).
//!
//! Without an exporter installed these are no-ops: the global propagator is the no-op one and
//! spans carry no OpenTelemetry context.

use opentelemetry::propagation::{Extractor, Injector};
use tracing_opentelemetry::OpenTelemetrySpanExt;

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct MetadataExtractor<'a>(&'a tonic::metadata::MetadataMap);

impl Extractor for MetadataExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0
            .keys()
            .filter_map(|k| match k {
                tonic::metadata::KeyRef::Ascii(k) => Some(k.as_str()),
                tonic::metadata::KeyRef::Binary(_) => None,
            })
            .collect()
    }
}

struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            value.parse(),
        ) {
            self.0.insert(k, v);
        }
    }
}

struct EnvExtractor(Vec<(String, String)>);

impl Extractor for EnvExtractor {
    fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(key))
            .map(|(_, v)| v.as_str())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(k, _)| k.as_str()).collect()
    }
}

/// Makes the context in `headers` (if any) the parent of `span`. Call before the span is
/// entered: OpenTelemetry fixes a span's parent when it starts.
pub fn set_parent_from_headers(span: &tracing::Span, headers: &http::HeaderMap) {
    set_parent(span, &HeaderExtractor(headers));
}

/// The same, from gRPC metadata.
pub fn set_parent_from_metadata(span: &tracing::Span, metadata: &tonic::metadata::MetadataMap) {
    set_parent(span, &MetadataExtractor(metadata));
}

/// The same, from `TRACEPARENT`/`TRACESTATE` in the environment.
pub fn set_parent_from_env(span: &tracing::Span) {
    let vars = ["traceparent", "tracestate"]
        .iter()
        .filter_map(|k| {
            std::env::var(k.to_ascii_uppercase())
                .ok()
                .map(|v| ((*k).to_owned(), v))
        })
        .collect();
    set_parent(span, &EnvExtractor(vars));
}

fn set_parent(span: &tracing::Span, carrier: &dyn Extractor) {
    let cx = opentelemetry::global::get_text_map_propagator(|p| p.extract(carrier));
    // Fails only when the span is disabled or already started: then it has no parent to take.
    let _ = span.set_parent(cx);
}

/// Writes `span`'s context into outgoing gRPC metadata.
pub fn inject_into_metadata(span: &tracing::Span, metadata: &mut tonic::metadata::MetadataMap) {
    let cx = span.context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut MetadataInjector(metadata));
    });
}

struct EnvInjector(Vec<(String, String)>);

impl Injector for EnvInjector {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_ascii_uppercase(), value));
    }
}

/// `span`'s context as environment variables (`TRACEPARENT`, `TRACESTATE`) for a child
/// process, whose [`set_parent_from_env`] then makes its spans children of `span`.
pub fn env_for_child(span: &tracing::Span) -> Vec<(String, String)> {
    let cx = span.context();
    let mut env = EnvInjector(Vec::new());
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut env));
    env.0
}
