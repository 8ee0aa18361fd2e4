//! Spans whose times are known only afterwards: the worker learns when a request was queued,
//! prefilled and decoded from the engine thread's timestamps once it finished, and records
//! those intervals as child spans with their real start and end times.

use std::time::{Instant, SystemTime};

use opentelemetry::KeyValue;
use opentelemetry::trace::{Span as _, Tracer as _};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// Converts the engine's monotonic instants to wall-clock times, all against one anchor.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    instant: Instant,
    system: SystemTime,
}

impl Clock {
    pub fn now() -> Self {
        Self {
            instant: Instant::now(),
            system: SystemTime::now(),
        }
    }

    pub fn system_time(&self, t: Instant) -> SystemTime {
        if t <= self.instant {
            self.system - (self.instant - t)
        } else {
            self.system + (t - self.instant)
        }
    }
}

/// Records a finished child of `parent` named `name` from `start` to `end`. Without an
/// exporter this does nothing (the global tracer is the no-op one).
pub fn record_interval(
    parent: &tracing::Span,
    name: &'static str,
    start: SystemTime,
    end: SystemTime,
    attributes: Vec<KeyValue>,
) {
    let tracer = opentelemetry::global::tracer("ferrite");
    let mut span = tracer
        .span_builder(name)
        .with_start_time(start)
        .with_attributes(attributes)
        .start_with_context(&tracer, &parent.context());
    span.end_with_timestamp(end);
}
