//! Start-up phases: spans under one `startup` root per process, whose durations also become the
//! `ferrite_startup_phase_seconds` gauge.
//!
//! Code that runs a phase opens a span with target [`TARGET`] named after the phase (the names
//! of [`PHASES`]), as a child of the `startup` span:
//!
//! ```ignore
//! let _p = tracing::info_span!(target: "ferrite::startup", "load_weights", bytes = n).entered();
//! ```
//!
//! Integer fields are written as `i64`: tracing-opentelemetry exports unsigned fields as
//! strings.
//!
//! Crates below this one (the engine) write the target as a literal; it must equal [`TARGET`].
//! The [`PhaseLayer`] times every span of that target from creation to close, so the gauge and
//! the exported span measure the same interval.

use std::time::Instant;

use tracing::Subscriber;
use tracing::span::{Attributes, Id};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// The `tracing` target of start-up spans.
pub const TARGET: &str = "ferrite::startup";

/// The root span's name.
pub const ROOT: &str = "startup";

/// Every phase a process may report, in the order they run (DESIGN.md). A phase that does not
/// apply (no GPU: `kernel_compile`, `kv_cache_profiling`, `graph_capturing`; one rank:
/// `comm_init`) has no span. A rank of a tensor-parallel pool builds its shard (`model_init`)
/// before it reads the shard's pages (`load_weights`), then forms the pool (`comm_init`).
pub const PHASES: &[&str] = &[
    "config",
    "tokenizer_init",
    "device_init",
    "kernel_compile",
    "load_weights",
    "model_init",
    "comm_init",
    "kv_cache_profiling",
    "kv_cache_init",
    "graph_capturing",
    "warmup",
    "register",
];

/// The filter that lets start-up spans (and only them) reach the [`PhaseLayer`].
pub fn filter() -> Targets {
    Targets::new().with_target(TARGET, tracing::Level::INFO)
}

/// Records each start-up span's duration in `ferrite_startup_phase_seconds{phase}`; the root
/// `startup` span is recorded as `phase="total_time"`.
#[derive(Debug, Default)]
pub struct PhaseLayer;

impl PhaseLayer {
    pub fn new() -> Self {
        Self
    }
}

struct Opened(Instant);

impl<S> tracing_subscriber::Layer<S> for PhaseLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, _attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(Opened(Instant::now()));
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else { return };
        let Some(opened) = span.extensions().get::<Opened>().map(|o| o.0) else {
            return;
        };
        let name = span.name();
        let phase = if name == ROOT { "total_time" } else { name };
        crate::metrics::startup_phase(phase, opened.elapsed().as_secs_f64());
    }
}
