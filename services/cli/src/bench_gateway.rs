//! `ferrite bench gateway`: what the gateway adds to a request.
//!
//! A synthetic worker (fixed-rate tokens, no model) and a gateway run in this process over the
//! in-process placement store. The same load is sent twice: straight to the worker (token ids,
//! the worker API) and through the gateway (text, the public API: tokenize, route,
//! detokenize). Added latency = gateway percentile − direct percentile of whole-stream latency.
//!
//! Clients are closed loops whose first requests are spread evenly over one stream's duration:
//! with fixed-length streams, clients that all started at once would stay in lockstep and hit
//! the gateway with every request of a round in the same instant, which measures that burst
//! rather than the steady state of `c` streams in flight.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_engine::engine::EngineConfig;
use ferrite_gateway::Gateway;
use ferrite_placement::{KeySchema, Store};
use ferrite_proto::v1 as api;
use ferrite_proto::worker::v1 as pb;
use ferrite_worker::{RunningWorker, WorkerConfig};
use serde_json::json;
use tonic::transport::Channel;

use crate::table::Table;

#[derive(Debug, Args)]
pub struct GatewayBenchArgs {
    /// Concurrent streams, comma-separated.
    #[arg(long, default_value = "1,64,1024", value_delimiter = ',')]
    concurrency: Vec<usize>,
    /// Tokens per stream.
    #[arg(long, default_value_t = 16)]
    tokens: u32,
    /// The synthetic worker's rate per stream (a fast decode; 64 streams then keep a 2-core
    /// machine below saturation, so the table shows the gateway's cost, not CPU queueing).
    #[arg(long, default_value_t = 100.0)]
    tokens_per_s: f64,
    /// Requests per concurrency level and path (default: max(50, 4 × concurrency)).
    #[arg(long)]
    requests: Option<usize>,
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy)]
enum Path {
    Direct,
    Gateway,
}

struct Figures {
    p50_ms: f64,
    p99_ms: f64,
    streams_per_s: f64,
}

pub fn run(args: GatewayBenchArgs) -> Result<()> {
    if args.concurrency.is_empty() || args.tokens == 0 {
        bail!("--concurrency and --tokens must be positive");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench(args))
}

async fn bench(args: GatewayBenchArgs) -> Result<()> {
    let store = Store::embedded();
    let schema = KeySchema::new("/ferrite/v1");
    let cfg = WorkerConfig {
        model_name: "synthetic".into(),
        pool: "bench".into(),
        tp: ferrite_worker::TpConfig::solo(),
        listen: "127.0.0.1:0".parse()?,
        advertise_host: None,
        engine: EngineConfig::default(),
        max_waiting: usize::MAX,
        lease_ttl: Duration::from_secs(10),
        drain_timeout: Duration::from_secs(5),
        node: "bench".into(),
        metrics_listen: None,
        tls: None,
        sampling_defaults: None,
        pooling: Default::default(),
        score_template: None,
        reasoning_parser: None,
        default_chat_template_kwargs: None,
    };
    let worker =
        RunningWorker::start_synthetic(args.tokens_per_s, cfg, store.clone(), schema.clone())
            .await?;
    let gw = Gateway::new(store, schema);
    let (addrs, _server) = ferrite_gateway::serve(
        gw.clone(),
        "127.0.0.1:0".parse()?,
        "127.0.0.1:0".parse()?,
        std::future::pending(),
    )
    .await?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while gw.pools().ready("synthetic").is_empty() {
        anyhow::ensure!(
            Instant::now() < deadline,
            "the gateway never saw the synthetic pool"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut table = Table::new(&[
        "concurrency",
        "requests",
        "tokens",
        "direct p50 ms",
        "direct p99 ms",
        "gateway p50 ms",
        "gateway p99 ms",
        "added p50 ms",
        "added p99 ms",
        "direct streams/s",
        "gateway streams/s",
    ]);
    let mut rows = Vec::new();
    for &c in &args.concurrency {
        let n = args.requests.unwrap_or((4 * c).max(50));
        let stream_time = Duration::from_secs_f64(f64::from(args.tokens) / args.tokens_per_s);
        let spec = |path, target| Load {
            path,
            target,
            c,
            n,
            tokens: args.tokens,
            stream_time,
        };
        let direct = load(spec(Path::Direct, worker.addr)).await?;
        let via = load(spec(Path::Gateway, addrs.grpc)).await?;
        let (a50, a99) = (via.p50_ms - direct.p50_ms, via.p99_ms - direct.p99_ms);
        table.row(
            [c as f64, n as f64, f64::from(args.tokens)]
                .iter()
                .map(|v| format!("{v}"))
                .chain(
                    [
                        direct.p50_ms,
                        direct.p99_ms,
                        via.p50_ms,
                        via.p99_ms,
                        a50,
                        a99,
                        direct.streams_per_s,
                        via.streams_per_s,
                    ]
                    .iter()
                    .map(|v| format!("{v:.3}")),
                )
                .collect(),
        );
        rows.push(json!({
            "concurrency": c, "requests": n, "tokens": args.tokens, "tokens_per_s": args.tokens_per_s,
            "direct": { "p50_ms": direct.p50_ms, "p99_ms": direct.p99_ms, "streams_per_s": direct.streams_per_s },
            "gateway": { "p50_ms": via.p50_ms, "p99_ms": via.p99_ms, "streams_per_s": via.streams_per_s },
            "added_p50_ms": a50, "added_p99_ms": a99,
        }));
    }
    if args.json {
        println!("{}", serde_json::Value::Array(rows));
    } else {
        println!(
            "synthetic worker: {} tokens per stream at {} tokens/s",
            args.tokens, args.tokens_per_s
        );
        print!("{}", table.render());
    }
    worker.drain().await?;
    Ok(())
}

/// One measured load: `n` streams of `tokens` tokens over `c` concurrent clients.
struct Load {
    path: Path,
    target: SocketAddr,
    c: usize,
    n: usize,
    tokens: u32,
    /// How long one stream lasts at the synthetic rate (first requests are spread over it).
    stream_time: Duration,
}

/// Whole-stream latencies and throughput of one load.
async fn load(spec: Load) -> Result<Figures> {
    let Load {
        path,
        target,
        c,
        n,
        tokens,
        stream_time,
    } = spec;
    // A few connections, as a fleet of clients would have; streams multiplex over each.
    let conns = c.clamp(1, 8);
    let mut channels = Vec::new();
    for _ in 0..conns {
        channels.push(
            Channel::from_shared(format!("http://{target}"))?
                .tcp_nodelay(true)
                .connect()
                .await
                .context("connecting the benchmark client")?,
        );
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..c {
        let channel = channels[i % conns].clone();
        let next = next.clone();
        let stagger = stream_time.mul_f64(i as f64 / c as f64);
        tasks.push(tokio::spawn(async move {
            tokio::time::sleep(stagger).await;
            let mut lat = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < n {
                let t0 = Instant::now();
                match path {
                    Path::Direct => one_direct(channel.clone(), tokens).await?,
                    Path::Gateway => one_gateway(channel.clone(), tokens).await?,
                }
                lat.push(t0.elapsed().as_secs_f64() * 1e3);
            }
            anyhow::Ok(lat)
        }));
    }
    let mut all = Vec::with_capacity(n);
    for t in tasks {
        all.extend(t.await??);
    }
    let wall = started.elapsed().as_secs_f64();
    all.sort_by(f64::total_cmp);
    let pct = |p: f64| all[((all.len() as f64 - 1.0) * p).round() as usize];
    Ok(Figures {
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        streams_per_s: all.len() as f64 / wall,
    })
}

async fn one_direct(channel: Channel, tokens: u32) -> Result<()> {
    let mut client = pb::worker_client::WorkerClient::new(channel);
    let req = pb::GenerateRequest {
        prompt_token_ids: vec![u32::from(b'a'); 8],
        sampling: Some(pb::SamplingParams {
            max_tokens: tokens,
            ..pb::SamplingParams::default()
        }),
        ..pb::GenerateRequest::default()
    };
    let mut stream = client.generate(req).await?.into_inner();
    while stream.message().await?.is_some() {}
    Ok(())
}

async fn one_gateway(channel: Channel, tokens: u32) -> Result<()> {
    let mut client = api::inference_client::InferenceClient::new(channel);
    let req = api::GenerateRequest {
        model: "synthetic".into(),
        prompt: Some(api::generate_request::Prompt::Text("aaaaaaaa".into())),
        sampling: Some(api::SamplingParams {
            max_tokens: Some(tokens),
            temperature: Some(0.0),
            ..api::SamplingParams::default()
        }),
        ..Default::default()
    };
    let mut stream = client.generate(req).await?.into_inner();
    while stream.message().await?.is_some() {}
    Ok(())
}
