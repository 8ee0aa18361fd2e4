//! ferrite's observability: what every process installs first.
//!
//! # Layout
//!
//! - [`setup`]: the `tracing` subscriber (log lines, OTLP gRPC export driven by the `OTEL_*`
//!   variables) and the [`Telemetry`] guard that flushes spans at shutdown.
//! - [`phases`]: start-up phase spans and the layer that turns them into metrics.
//! - [`propagation`]: W3C `traceparent` in and out of gRPC metadata, HTTP headers and the
//!   environment.
//! - [`metrics`]: every Prometheus metric name, and the recorders that update them.
//! - [`genai`]: OpenTelemetry GenAI semantic-convention attribute names for request spans.
//! - [`spans`]: spans recorded after the fact, with times taken elsewhere (the engine thread).
//! - `receiver` (feature `receiver`): an OTLP gRPC trace receiver, for tests and
//!   `ferrite bench startup`.

pub mod genai;
pub mod metrics;
pub mod phases;
pub mod propagation;
#[cfg(feature = "receiver")]
pub mod receiver;
pub mod setup;
pub mod spans;

pub use opentelemetry::KeyValue;
pub use setup::{Telemetry, TelemetryConfig, TelemetryError, json_logs, notice};
pub use tracing_opentelemetry::OpenTelemetrySpanExt;
