//! An OTLP gRPC trace receiver: the `opentelemetry.proto.collector.trace.v1.TraceService`
//! server generated from the official protocol definitions (the `opentelemetry-proto` crate),
//! keeping every span it is sent in memory.
//!
//! `ferrite bench startup` points the processes it starts at one to read their phase spans, and
//! the integration tests assert on what ferrite exported through it. It is what a collector
//! sees, decoded; nothing here knows how ferrite made the spans.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use tokio::net::TcpListener;
use tokio::sync::{Notify, oneshot};

/// An attribute value as received.
#[derive(Debug, Clone, PartialEq)]
pub enum AttrValue {
    Str(String),
    Int(i64),
    Double(f64),
    Bool(bool),
    /// Arrays and the rest, printed.
    Other(String),
}

impl AttrValue {
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            AttrValue::Int(i) => Some(*i as f64),
            AttrValue::Double(d) => Some(*d),
            _ => None,
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match self {
            AttrValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

impl std::fmt::Display for AttrValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AttrValue::Str(s) | AttrValue::Other(s) => f.write_str(s),
            AttrValue::Int(i) => write!(f, "{i}"),
            AttrValue::Double(d) => write!(f, "{d}"),
            AttrValue::Bool(b) => write!(f, "{b}"),
        }
    }
}

/// One received span, flattened with its resource's `service.name`.
#[derive(Debug, Clone)]
pub struct ReceivedSpan {
    pub service_name: Option<String>,
    /// 32 hex digits.
    pub trace_id: String,
    /// 16 hex digits.
    pub span_id: String,
    /// `None` for a root span.
    pub parent_span_id: Option<String>,
    pub name: String,
    /// The OTLP `SpanKind` number (1 internal, 2 server, 3 client).
    pub kind: i32,
    pub start_unix_nanos: u64,
    pub end_unix_nanos: u64,
    pub attributes: BTreeMap<String, AttrValue>,
    /// The OTLP status code (0 unset, 1 ok, 2 error).
    pub status_code: i32,
}

impl ReceivedSpan {
    pub fn seconds(&self) -> f64 {
        self.end_unix_nanos.saturating_sub(self.start_unix_nanos) as f64 / 1e9
    }
    pub fn attr(&self, key: &str) -> Option<&AttrValue> {
        self.attributes.get(key)
    }
}

fn value(v: Option<&AnyValue>) -> AttrValue {
    match v.and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => AttrValue::Str(s.clone()),
        Some(any_value::Value::IntValue(i)) => AttrValue::Int(*i),
        Some(any_value::Value::DoubleValue(d)) => AttrValue::Double(*d),
        Some(any_value::Value::BoolValue(b)) => AttrValue::Bool(*b),
        Some(other) => AttrValue::Other(format!("{other:?}")),
        None => AttrValue::Other(String::new()),
    }
}

fn attributes(kvs: &[KeyValue]) -> BTreeMap<String, AttrValue> {
    kvs.iter()
        .map(|kv| (kv.key.clone(), value(kv.value.as_ref())))
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[derive(Debug, Default)]
struct Collected {
    spans: Mutex<Vec<ReceivedSpan>>,
    arrived: Notify,
}

#[derive(Debug, Clone)]
struct Service(Arc<Collected>);

#[tonic::async_trait]
impl TraceService for Service {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut received = Vec::new();
        for rs in request.into_inner().resource_spans {
            let service_name = rs.resource.as_ref().and_then(|r| {
                attributes(&r.attributes)
                    .get("service.name")
                    .and_then(|v| v.as_str().map(str::to_owned))
            });
            for ss in rs.scope_spans {
                for s in ss.spans {
                    received.push(ReceivedSpan {
                        service_name: service_name.clone(),
                        trace_id: hex(&s.trace_id),
                        span_id: hex(&s.span_id),
                        parent_span_id: (!s.parent_span_id.is_empty())
                            .then(|| hex(&s.parent_span_id)),
                        name: s.name,
                        kind: s.kind,
                        start_unix_nanos: s.start_time_unix_nano,
                        end_unix_nanos: s.end_time_unix_nano,
                        attributes: attributes(&s.attributes),
                        status_code: s.status.map_or(0, |st| st.code),
                    });
                }
            }
        }
        self.0
            .spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(received);
        self.0.arrived.notify_waiters();
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

/// A running receiver on a loopback port. Stops when dropped.
#[derive(Debug)]
pub struct OtlpReceiver {
    addr: SocketAddr,
    collected: Arc<Collected>,
    _stop: oneshot::Sender<()>,
}

impl OtlpReceiver {
    /// Serves on a free loopback port (call inside a tokio runtime).
    pub async fn start() -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let collected = Arc::new(Collected::default());
        let (stop, stopped) = oneshot::channel::<()>();
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(Service(collected.clone())))
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            );
        tokio::spawn(server);
        Ok(Self {
            addr,
            collected,
            _stop: stop,
        })
    }

    /// The value for `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every span received so far.
    pub fn spans(&self) -> Vec<ReceivedSpan> {
        self.collected
            .spans
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Waits until `done` holds for the spans received (returning them), or `timeout` passed
    /// (returning what arrived, as the error).
    pub async fn wait_for(
        &self,
        timeout: Duration,
        mut done: impl FnMut(&[ReceivedSpan]) -> bool,
    ) -> Result<Vec<ReceivedSpan>, Vec<ReceivedSpan>> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let arrived = self.collected.arrived.notified();
            let spans = self.spans();
            if done(&spans) {
                return Ok(spans);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                let spans = self.spans();
                return if done(&spans) { Ok(spans) } else { Err(spans) };
            }
        }
    }
}
