//! The clients of a chaos run: streaming gRPC requests through the gateway, each with a
//! deadline, each outcome recorded under the phase it started in. A request that neither
//! finishes nor fails within its deadline and [`HUNG_MARGIN`] is *hung*: the one outcome the
//! run must never see. A client backs off a little after a failure, as real ones do.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferrite_proto::v1 as api;
use tonic::transport::{Channel, Endpoint};

/// Past its deadline by this much, a request counts as hung.
pub const HUNG_MARGIN: Duration = Duration::from_secs(5);
/// How long a client waits after a failed request before its next one.
const BACKOFF: Duration = Duration::from_millis(100);

const PROMPTS: [&str; 5] = [
    "Write a short poem about the sea.",
    "What is the capital of France?",
    "List three uses of copper.",
    "Tell me a story about a lighthouse keeper.",
    "Explain what a CPU cache does.",
];

/// How one request ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Ok,
    /// Dropped by its client on purpose (the mass-disconnect fault).
    Disconnected,
    /// Failed with this gRPC code.
    Failed(tonic::Code),
    /// The connection broke under the stream without a status (the gateway was killed):
    /// tonic reports it as UNKNOWN with the transport error beneath, grpc-core as UNAVAILABLE;
    /// either way the client retries.
    Cut,
    Hung,
}

/// The outcome of a request that ended with `status`.
fn failed(status: &tonic::Status) -> Outcome {
    use std::error::Error;
    if status.code() == tonic::Code::Unknown && status.source().is_some() {
        return Outcome::Cut;
    }
    Outcome::Failed(status.code())
}

/// One finished request.
#[derive(Debug, Clone)]
pub struct Record {
    pub phase: usize,
    pub started: Instant,
    pub outcome: Outcome,
}

/// What a request asks for.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub max_tokens: u32,
    /// Dropped by the client after its first token.
    pub disconnect: bool,
}

#[derive(Debug)]
struct Shared {
    channel: Channel,
    model: String,
    deadline: Duration,
    paused: AtomicBool,
    stopped: AtomicBool,
    in_flight: AtomicUsize,
    phase: AtomicUsize,
    records: Mutex<Vec<Record>>,
}

/// The steady load, and the bursts the faults add.
#[derive(Debug)]
pub struct Load {
    shared: Arc<Shared>,
    clients: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// `clients` loops of requests to the gateway at `gateway` (reconnecting as needed: the
    /// gateway may come back on the same address).
    pub fn start(gateway: SocketAddr, model: &str, clients: usize, deadline: Duration) -> Self {
        let channel = Endpoint::from_shared(format!("http://{gateway}"))
            .map(|e| {
                e.connect_timeout(Duration::from_secs(2))
                    .tcp_nodelay(true)
                    .connect_lazy()
            })
            .unwrap_or_else(|_| Endpoint::from_static("http://127.0.0.1:1").connect_lazy());
        let shared = Arc::new(Shared {
            channel,
            model: model.to_owned(),
            deadline,
            paused: AtomicBool::new(false),
            stopped: AtomicBool::new(false),
            in_flight: AtomicUsize::new(0),
            phase: AtomicUsize::new(0),
            records: Mutex::default(),
        });
        let clients = (0..clients)
            .map(|i| tokio::spawn(client_loop(shared.clone(), i as u64 + 1)))
            .collect();
        Self { shared, clients }
    }

    /// Requests started from now on count for phase `i`.
    pub fn set_phase(&self, i: usize) {
        self.shared.phase.store(i, Ordering::SeqCst);
    }

    /// Stops starting requests and waits for those in flight to end.
    pub async fn pause(&self) {
        self.shared.paused.store(true, Ordering::SeqCst);
        let limit = Instant::now() + self.shared.deadline + HUNG_MARGIN * 2;
        while self.shared.in_flight.load(Ordering::SeqCst) > 0 && Instant::now() < limit {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn resume(&self) {
        self.shared.paused.store(false, Ordering::SeqCst);
    }

    /// `n` requests of `shape` at once, counted for the current phase; returns when all ended.
    pub async fn burst(&self, n: usize, shape: Shape) {
        let tasks: Vec<_> = (0..n)
            .map(|i| {
                let shared = self.shared.clone();
                tokio::spawn(async move { shared.run(shape, 1000 + i as u64).await })
            })
            .collect();
        for t in tasks {
            let _ = t.await;
        }
    }

    /// The outcomes recorded for phase `i`.
    pub fn records(&self, i: usize) -> Vec<Record> {
        let all = self
            .shared
            .records
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        all.iter().filter(|r| r.phase == i).cloned().collect()
    }

    pub async fn stop(self) {
        self.shared.stopped.store(true, Ordering::SeqCst);
        for c in self.clients {
            let _ = c.await;
        }
    }
}

async fn client_loop(shared: Arc<Shared>, seed: u64) {
    let mut n = seed;
    while !shared.stopped.load(Ordering::SeqCst) {
        if shared.paused.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        n = n.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
        let shape = Shape {
            max_tokens: 16 + (n >> 33) as u32 % 48,
            disconnect: false,
        };
        if shared.run(shape, n).await != Outcome::Ok {
            tokio::time::sleep(BACKOFF).await;
        }
    }
}

impl Shared {
    /// Runs one request and records its outcome.
    async fn run(&self, shape: Shape, n: u64) -> Outcome {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        let phase = self.phase.load(Ordering::SeqCst);
        let started = Instant::now();
        let limit = self.deadline + HUNG_MARGIN;
        let outcome = tokio::time::timeout(limit, self.request(shape, n))
            .await
            .unwrap_or(Outcome::Hung);
        self.records
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Record {
                phase,
                started,
                outcome: outcome.clone(),
            });
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        outcome
    }

    async fn request(&self, shape: Shape, n: u64) -> Outcome {
        let mut client = api::inference_client::InferenceClient::new(self.channel.clone());
        let prompt = PROMPTS[(n % PROMPTS.len() as u64) as usize];
        let mut req = tonic::Request::new(api::GenerateRequest {
            model: self.model.clone(),
            prompt: Some(api::generate_request::Prompt::Text(prompt.into())),
            sampling: Some(api::SamplingParams {
                max_tokens: Some(shape.max_tokens),
                temperature: Some(0.7),
                seed: Some(n),
                ignore_eos: true,
                ..api::SamplingParams::default()
            }),
            ..Default::default()
        });
        req.set_timeout(self.deadline);
        let mut stream = match client.generate(req).await {
            Ok(s) => s.into_inner(),
            Err(s) => return failed(&s),
        };
        loop {
            match stream.message().await {
                Ok(Some(_)) if shape.disconnect => return Outcome::Disconnected,
                Ok(Some(_)) => {}
                Ok(None) => return Outcome::Ok,
                Err(s) => return failed(&s),
            }
        }
    }
}
