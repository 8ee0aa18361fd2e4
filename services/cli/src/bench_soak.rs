//! `ferrite bench soak`: a fresh `ferrite serve` under many concurrent gRPC streams for a
//! while, with client cancellations, deadlines and bad requests mixed in. Prints the outcomes
//! by class (those a soak intends, and any other, which fails the command), the server's RSS
//! and open file descriptors at the start and the end, and the KV blocks still in use once the
//! clients are gone (which must be 0).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_kernels::device::DeviceRequest;
use ferrite_proto::v1 as api;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::Channel;

use crate::serve_child::ServeChild;
use crate::table::Table;

#[derive(Debug, Args)]
pub struct SoakArgs {
    /// How long the clients run.
    #[arg(long, default_value_t = 1.0)]
    minutes: f64,
    /// Clients, each with one request at a time.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// The model `ferrite serve` runs.
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
    /// The server's `--device` (cpu, cuda, cuda:N, auto). The CPU by default, where
    /// `--kv-cache-mib` keeps the cache small enough for a busy soak to preempt.
    #[arg(long, default_value = "cpu")]
    device: DeviceRequest,
    /// KV cache of the server on the CPU (small, so that a busy soak also preempts).
    #[arg(long, default_value_t = 256)]
    kv_cache_mib: usize,
    /// The server's `--gpu-memory-utilization` on a GPU, which sizes its KV cache there (a
    /// small fraction makes a GPU soak preempt too).
    #[arg(long, default_value_t = 0.9, value_parser = crate::loading::fraction)]
    gpu_memory_utilization: f64,
    #[arg(long, default_value_t = 2048)]
    max_model_len: usize,
    /// Seed of the clients' choices (the same seed, the same mix).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    json: bool,
}

/// What one request of the mix is.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Runs to its end.
    Complete,
    /// The client drops the stream after a few tokens.
    Cancel,
    /// A deadline shorter than the request needs.
    Deadline,
    /// Refused: out-of-range sampling, an unknown model, an empty prompt, a prompt past the
    /// context, a token id outside the vocabulary.
    Bad,
}

/// Outcomes a soak intends: anything else is a defect.
const INTENDED: [&str; 7] = [
    "ok",
    "cancelled_by_client",
    "InvalidArgument",
    "NotFound",
    "DeadlineExceeded",
    "Cancelled_timeout_expired",
    "ResourceExhausted",
];

/// The class of a failed request. tonic answers a deadline that its own timer (the client's,
/// or the server's grpc-timeout) reaches first as CANCELLED "Timeout expired": a class of its
/// own, intended only for requests that set a deadline.
fn class_of(status: &tonic::Status, kind: Kind) -> String {
    let timer = status.code() == tonic::Code::Cancelled && status.message() == "Timeout expired";
    if timer && matches!(kind, Kind::Deadline) {
        return "Cancelled_timeout_expired".into();
    }
    format!("{:?}", status.code())
}

/// xorshift64*: the clients' choices, reproducible from the seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

const PROMPTS: [&str; 4] = [
    "The history of the printing press",
    "Write a haiku about the sea.",
    "List three prime numbers:",
    "Once upon a time",
];

fn kind_of(rng: &mut Rng) -> Kind {
    match rng.below(100) {
        0..55 => Kind::Complete,
        55..72 => Kind::Cancel,
        72..84 => Kind::Deadline,
        _ => Kind::Bad,
    }
}

/// The request of `kind`, with its deadline if any.
fn request(kind: Kind, model: &str, rng: &mut Rng) -> (api::GenerateRequest, Option<Duration>) {
    let prompt = PROMPTS[rng.below(PROMPTS.len() as u64) as usize];
    let mut req = api::GenerateRequest {
        model: model.to_owned(),
        prompt: Some(api::generate_request::Prompt::Text(prompt.into())),
        sampling: Some(api::SamplingParams {
            max_tokens: Some(1 + rng.below(48) as u32),
            temperature: Some(if rng.below(2) == 0 { 0.0 } else { 0.8 }),
            seed: Some(rng.next()),
            ..api::SamplingParams::default()
        }),
        ..Default::default()
    };
    let sampling = req.sampling.get_or_insert_with(Default::default);
    match kind {
        Kind::Complete | Kind::Cancel => (req, None),
        Kind::Deadline => {
            sampling.max_tokens = Some(200);
            sampling.ignore_eos = true;
            (req, Some(Duration::from_millis(50 + rng.below(250))))
        }
        Kind::Bad => {
            match rng.below(5) {
                0 => sampling.temperature = Some(-1.0),
                1 => req.model = "no-such-model".into(),
                2 => req.prompt = Some(api::generate_request::Prompt::Text(String::new())),
                3 => sampling.max_tokens = Some(1 << 20),
                _ => {
                    let ids = api::TokenIds {
                        ids: vec![1, u32::MAX],
                    };
                    req.prompt = Some(api::generate_request::Prompt::TokenIds(ids));
                }
            }
            (req, None)
        }
    }
}

/// Runs one request and names its outcome.
async fn one(
    client: &mut api::inference_client::InferenceClient<Channel>,
    kind: Kind,
    rng: &mut Rng,
    model: &str,
) -> String {
    let (req, deadline) = request(kind, model, rng);
    let mut req = tonic::Request::new(req);
    if let Some(d) = deadline {
        req.set_timeout(d);
    }
    let mut stream = match client.generate(req).await {
        Ok(s) => s.into_inner(),
        Err(status) => return class_of(&status, kind),
    };
    let cancel_after = matches!(kind, Kind::Cancel).then(|| 1 + rng.below(8));
    let mut seen = 0;
    loop {
        match stream.message().await {
            Ok(Some(_)) => {
                seen += 1;
                if cancel_after.is_some_and(|n| seen >= n) {
                    return "cancelled_by_client".into();
                }
            }
            Ok(None) => return "ok".into(),
            Err(status) => return class_of(&status, kind),
        }
    }
}

/// One client's loop until `until`: its outcome counts.
async fn client(
    grpc: String,
    model: String,
    seed: u64,
    until: Instant,
) -> Result<BTreeMap<String, u64>> {
    let mut c = api::inference_client::InferenceClient::connect(format!("http://{grpc}"))
        .await
        .context("connecting to ferrite serve")?;
    let mut rng = Rng(seed | 1);
    let mut counts = BTreeMap::new();
    while Instant::now() < until {
        let kind = kind_of(&mut rng);
        *counts
            .entry(one(&mut c, kind, &mut rng, &model).await)
            .or_default() += 1;
    }
    Ok(counts)
}

/// The server process's resident set (KiB) and open file descriptors.
fn process_figures(pid: u32) -> Result<(u64, usize)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .context("no VmRSS")?;
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd"))?.count();
    Ok((rss_kib, fds))
}

/// One gauge's value from the server's `/metrics` (summed over its label sets).
async fn gauge(http: &str, name: &str) -> Result<f64> {
    let mut s = tokio::net::TcpStream::connect(http).await?;
    let req = format!("GET /metrics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut body = String::new();
    s.read_to_string(&mut body).await?;
    let values: Vec<f64> = body
        .lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    anyhow::ensure!(!values.is_empty(), "/metrics has no {name}");
    Ok(values.iter().sum())
}

/// The arguments of the soaked `ferrite serve`.
fn serve_args(args: &SoakArgs) -> Vec<String> {
    [
        ("--model", args.model.clone()),
        ("--device", args.device.to_string()),
        ("--kv-cache-mib", args.kv_cache_mib.to_string()),
        (
            "--gpu-memory-utilization",
            args.gpu_memory_utilization.to_string(),
        ),
        ("--max-model-len", args.max_model_len.to_string()),
        ("--listen", "127.0.0.1:0".into()),
        ("--http-listen", "127.0.0.1:0".into()),
    ]
    .into_iter()
    .flat_map(|(flag, value)| [flag.to_owned(), value])
    .collect()
}

pub fn run(args: SoakArgs) -> Result<()> {
    if args.minutes <= 0.0 || args.concurrency == 0 {
        bail!("--minutes > 0 and --concurrency ≥ 1 are needed");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(soak(args))
}

async fn soak(args: SoakArgs) -> Result<()> {
    let serve = ServeChild::start(
        |cmd| {
            cmd.args(serve_args(&args));
        },
        Duration::from_secs(300),
    )
    .await?;
    let (rss_start, fds_start) = process_figures(serve.pid())?;
    let started = Instant::now();
    let until = started + Duration::from_secs_f64(args.minutes * 60.0);
    let clients: Vec<_> = (0..args.concurrency)
        .map(|i| {
            let seed = args
                .seed
                .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                .wrapping_add(i as u64);
            tokio::spawn(client(serve.grpc.clone(), serve.model.clone(), seed, until))
        })
        .collect();
    let mut outcomes: BTreeMap<String, u64> = BTreeMap::new();
    for c in clients {
        for (k, n) in c.await?? {
            *outcomes.entry(k).or_default() += n;
        }
    }
    let ran_s = started.elapsed().as_secs_f64();
    // The engine frees an aborted request's blocks at its next step: give it a moment.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let kv_used = gauge(&serve.http, "ferrite_kv_cache_usage_perc").await?
        * gauge(&serve.http, "ferrite_kv_cache_blocks").await?;
    let running = gauge(&serve.http, "ferrite_num_requests_running").await?;
    let (rss_end, fds_end) = process_figures(serve.pid())?;
    let report = Report {
        outcomes,
        ran_s,
        rss_kib: (rss_start, rss_end),
        fds: (fds_start, fds_end),
        kv_blocks_in_use: kv_used.round() as u64,
        running: running as u64,
    };
    report.print(&args)?;
    report.check()
}

struct Report {
    outcomes: BTreeMap<String, u64>,
    ran_s: f64,
    rss_kib: (u64, u64),
    fds: (usize, usize),
    kv_blocks_in_use: u64,
    running: u64,
}

impl Report {
    fn print(&self, args: &SoakArgs) -> Result<()> {
        let total: u64 = self.outcomes.values().sum();
        if args.json {
            let j = json!({ "device": args.device.to_string(), "minutes": self.ran_s / 60.0,
                "concurrency": args.concurrency, "requests": total,
                "outcomes": self.outcomes, "rss_kib": [self.rss_kib.0, self.rss_kib.1],
                "fds": [self.fds.0, self.fds.1], "kv_blocks_in_use": self.kv_blocks_in_use,
                "requests_running": self.running });
            println!("{}", serde_json::to_string_pretty(&j)?);
            return Ok(());
        }
        println!(
            "soak (--device {}): {:.1} min, {} clients, {total} requests ({:.1}/s)",
            args.device,
            self.ran_s / 60.0,
            args.concurrency,
            total as f64 / self.ran_s
        );
        let mut t = Table::new(&["outcome", "intended", "requests", "share"]);
        for (k, n) in &self.outcomes {
            let intended = if INTENDED.contains(&k.as_str()) {
                "yes"
            } else {
                "NO"
            };
            t.row(vec![
                k.clone(),
                intended.into(),
                n.to_string(),
                format!("{:.1}%", 100.0 * *n as f64 / total.max(1) as f64),
            ]);
        }
        println!("{}", t.render());
        let mut t = Table::new(&["figure", "start", "end"]);
        t.row(vec![
            "RSS MiB".into(),
            format!("{:.1}", self.rss_kib.0 as f64 / 1024.0),
            format!("{:.1}", self.rss_kib.1 as f64 / 1024.0),
        ]);
        t.row(vec![
            "open fds".into(),
            self.fds.0.to_string(),
            self.fds.1.to_string(),
        ]);
        t.row(vec![
            "KV blocks in use".into(),
            "0".into(),
            self.kv_blocks_in_use.to_string(),
        ]);
        t.row(vec![
            "requests running".into(),
            "0".into(),
            self.running.to_string(),
        ]);
        println!("{}", t.render());
        Ok(())
    }

    /// Fails on an unintended outcome or anything left held.
    fn check(&self) -> Result<()> {
        let bad: Vec<&String> = self
            .outcomes
            .keys()
            .filter(|k| !INTENDED.contains(&k.as_str()))
            .collect();
        if !bad.is_empty() {
            bail!("unintended outcomes: {bad:?}");
        }
        if self.kv_blocks_in_use != 0 || self.running != 0 {
            bail!(
                "left held after the clients went: {} KV blocks, {} running requests",
                self.kv_blocks_in_use,
                self.running
            );
        }
        Ok(())
    }
}
