//! Installing the process's tracing subscriber: log lines to stderr, and (when an endpoint is
//! configured) spans exported over OTLP gRPC.
//!
//! Configuration follows the OpenTelemetry SDK environment variables, so a process is pointed
//! at a collector the way every other OpenTelemetry service is:
//!
//! - `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (or `--otlp-endpoint`):
//!   where spans go. Neither set, or `OTEL_TRACES_EXPORTER=none`: no OpenTelemetry layer is
//!   installed at all, so spans cost what a disabled `tracing` span costs.
//! - `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`: the resource (the SDK reads them); without
//!   a service name the command's own (`ferrite-serve`, `ferrite-worker`, ...) is used.
//! - `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`: read by the SDK.
//!
//! `FERRITE_LOG` (an `EnvFilter`, default `warn`) filters the log lines only: spans are exported
//! at `info` whatever the log level. `FERRITE_LOG_FORMAT=json` writes them as JSON lines (one
//! object per event: `timestamp`, `level`, `target`, `fields`), as log collectors want; the
//! process's own notices ([`notice`]) follow the same format.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::phases::PhaseLayer;

/// Whether log lines are JSON (`FERRITE_LOG_FORMAT=json`).
pub fn json_logs() -> bool {
    std::env::var("FERRITE_LOG_FORMAT").is_ok_and(|v| v.eq_ignore_ascii_case("json"))
}

/// A notice the process always shows on stderr, whatever `FERRITE_LOG` says (the device
/// chosen, a model being pulled, draining, a fatal error): `ferrite: {message}` as text, or one
/// JSON object in the log lines' shape with `FERRITE_LOG_FORMAT=json`.
pub fn notice(level: &str, message: &str) {
    if json_logs() {
        let line = serde_json::json!({
            "timestamp": humantime_now(),
            "level": level.to_ascii_uppercase(),
            "target": "ferrite",
            "fields": { "message": message },
        });
        eprintln!("{line}");
    } else {
        eprintln!("{message}");
    }
}

/// Now, as the JSON log lines print their timestamps (the subscriber's own clock).
fn humantime_now() -> String {
    use tracing_subscriber::fmt::time::FormatTime;
    let mut out = String::new();
    let _ = tracing_subscriber::fmt::time::SystemTime
        .format_time(&mut tracing_subscriber::fmt::format::Writer::new(&mut out));
    out
}

/// How a process wants its telemetry.
#[derive(Debug, Clone, Default)]
pub struct TelemetryConfig {
    /// `service.name` when neither `OTEL_SERVICE_NAME` nor `OTEL_RESOURCE_ATTRIBUTES` sets one.
    pub default_service_name: String,
    /// An explicit OTLP gRPC endpoint (the `--otlp-endpoint` flag); overrides the environment.
    pub otlp_endpoint: Option<String>,
    /// Install the Prometheus recorder (processes that serve `/metrics`).
    pub metrics: bool,
}

/// Why telemetry could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("cannot start the telemetry export thread: {0}")]
    Runtime(std::io::Error),
    #[error("cannot build the OTLP span exporter for {endpoint}: {message}")]
    Exporter { endpoint: String, message: String },
    #[error("cannot install the Prometheus recorder: {0}")]
    Metrics(String),
}

/// The installed telemetry. Keep it alive for the life of the process; [`Telemetry::shutdown`]
/// (or dropping it) flushes the spans still buffered.
#[derive(Debug)]
pub struct Telemetry {
    export: Option<Export>,
    /// Where spans go, when exported (handed on to the processes this one starts).
    endpoint: Option<String>,
}

/// The OTLP side: the SDK provider and the runtime its gRPC client runs on.
///
/// The exporter gets a runtime of its own (one thread) so that flushing at shutdown works from
/// anywhere, including after the application's runtime is gone.
#[derive(Debug)]
struct Export {
    provider: SdkTracerProvider,
    runtime: Option<tokio::runtime::Runtime>,
    endpoint: String,
}

/// The OTLP endpoint the environment asks for, if export is on.
fn endpoint_from_env() -> Option<String> {
    let get = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    if get("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"))
        || get("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
    {
        return None;
    }
    get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| get("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

fn service_name_from_env() -> bool {
    std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| {
            v.split(',')
                .any(|kv| kv.trim().starts_with("service.name="))
        })
}

/// Which spans go to the collector: ferrite's own at `info` and above, none of the transport
/// crates' (h2, hyper, tonic) internals.
fn export_filter() -> EnvFilter {
    EnvFilter::new("info,h2=off,hyper=off,hyper_util=off,tonic=off,tower=off,opentelemetry=off")
}

impl Telemetry {
    /// Installs the global subscriber (and, with `cfg.metrics`, the Prometheus recorder).
    /// Call once, first thing in `main`.
    pub fn init(cfg: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let log_filter = EnvFilter::try_from_env("FERRITE_LOG").unwrap_or_else(|_| "warn".into());
        let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
        let fmt = if json_logs() {
            fmt.json().boxed()
        } else {
            fmt.boxed()
        }
        .with_filter(log_filter);
        let endpoint = cfg.otlp_endpoint.clone().or_else(endpoint_from_env);
        let export = endpoint
            .clone()
            .map(|e| Export::start(e, cfg))
            .transpose()?;
        let otel = export.as_ref().map(|x| {
            tracing_opentelemetry::layer()
                .with_tracer(x.provider.tracer("ferrite"))
                .with_filter(export_filter())
        });
        if let Some(x) = &export {
            // For spans built with the OpenTelemetry API directly (`spans::record_interval`).
            opentelemetry::global::set_tracer_provider(x.provider.clone());
            opentelemetry::global::set_text_map_propagator(
                opentelemetry_sdk::propagation::TraceContextPropagator::new(),
            );
        }
        if cfg.metrics {
            crate::metrics::install().map_err(TelemetryError::Metrics)?;
        }
        // `try_init` fails only if a subscriber is already set (tests that init twice): keep it.
        let _ = tracing_subscriber::registry()
            .with(fmt)
            .with(otel)
            .with(PhaseLayer::new().with_filter(crate::phases::filter()))
            .try_init();
        Ok(Self { export, endpoint })
    }

    /// Whether spans are being exported.
    pub fn exporting(&self) -> bool {
        self.export.is_some()
    }

    /// The OTLP endpoint spans are exported to, if they are.
    pub fn endpoint(&self) -> Option<&str> {
        self.endpoint.as_deref()
    }

    /// Sends the spans buffered so far now (e.g. once start-up is done, so its trace shows at
    /// once rather than at the next batch). Blocks the calling thread until the collector
    /// answered or the export timed out.
    pub fn flush(&self) {
        if let Some(x) = &self.export
            && let Err(e) = x.provider.force_flush()
        {
            tracing::warn!(endpoint = %x.endpoint, "flushing spans: {e}");
        }
    }

    /// Flushes and stops the exporter.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(mut x) = self.export.take() {
            if let Err(e) = x.provider.shutdown_with_timeout(Duration::from_secs(5)) {
                notice(
                    "warn",
                    &format!("ferrite: exporting the last spans to {}: {e}", x.endpoint),
                );
            }
            if let Some(rt) = x.runtime.take() {
                rt.shutdown_background();
            }
        }
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Export {
    fn start(endpoint: String, cfg: &TelemetryConfig) -> Result<Self, TelemetryError> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("ferrite-otlp")
            .enable_all()
            .build()
            .map_err(TelemetryError::Runtime)?;
        // The tonic channel spawns its connection task on the runtime it is built in.
        let exporter = runtime
            .block_on(async {
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .with_endpoint(endpoint.clone())
                    .with_timeout(Duration::from_secs(5))
                    .build()
            })
            .map_err(|e| TelemetryError::Exporter {
                endpoint: endpoint.clone(),
                message: e.to_string(),
            })?;
        let mut resource = Resource::builder();
        if !service_name_from_env() {
            resource = resource.with_service_name(cfg.default_service_name.clone());
        }
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource.build())
            .build();
        Ok(Self {
            provider,
            runtime: Some(runtime),
            endpoint,
        })
    }
}
