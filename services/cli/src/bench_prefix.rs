//! `ferrite bench prefix`: prefix caching and KV-aware routing, end to end.
//!
//! The workload of chat, agents and RAG: `--prefixes` long shared prefixes (system prompts of
//! `--prefix-tokens`) each followed by a short distinct suffix, `--requests` requests from
//! `--concurrency` closed-loop clients, sent in turn to `--gateways` gateways in front of
//! `--pools` pools. Everything runs in this process over the in-process placement store (each
//! pool's engine on its own thread, as in `ferrite serve`), on fresh pools for each run:
//!
//! - `p2c`: prefix caching on, the gateways route by power of two choices;
//! - `kv`: prefix caching on, KV-aware routing (from the pools' KV events);
//! - `off`: prefix caching off (`--no-prefix-caching`), power of two choices.
//!
//! Each run first sends every prefix once (warming, not measured), then the measured requests,
//! the same sequence in every run. Each pool's KV cache holds `--cache-prefixes` prefixes
//! (default: prefixes / pools + 1), so the pools together hold every prefix and one alone does
//! not: routing decides the hit rate. (On a GPU the cache is sized by
//! `--gpu-memory-utilization` instead.) Hit rate is cached prompt tokens / prompt tokens, from
//! each response's usage; time to first token is measured by the client.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_collective::Solo;
use ferrite_engine::kv_cache::KvCache;
use ferrite_gateway::{Gateway, Routing};
use ferrite_placement::{KeySchema, Store};
use ferrite_proto::v1 as api;
use ferrite_worker::{RunningWorker, TpConfig, WorkerConfig};
use serde_json::json;
use tonic::transport::Channel;

use crate::loading::ModelArgs;
use crate::table::{Table, percentile};

const MODEL: &str = "bench";
const BLOCK_SIZE: usize = 16;

#[derive(Debug, Args)]
pub struct PrefixBenchArgs {
    /// The model and engine flags (the KV cache is sized by --cache-prefixes, not
    /// --kv-cache-mib; the context by the prompts).
    #[command(flatten)]
    model: ModelArgs,
    #[arg(long, default_value_t = 2)]
    pools: usize,
    #[arg(long, default_value_t = 2)]
    gateways: usize,
    /// Distinct shared prefixes.
    #[arg(long, default_value_t = 4)]
    prefixes: usize,
    #[arg(long, default_value_t = 2000)]
    prefix_tokens: usize,
    /// Distinct tokens after the prefix, per request.
    #[arg(long, default_value_t = 16)]
    suffix_tokens: usize,
    /// Measured requests per run.
    #[arg(long, default_value_t = 24)]
    requests: usize,
    #[arg(long, default_value_t = 2)]
    concurrency: usize,
    /// New tokens per request.
    #[arg(long, default_value_t = 4)]
    max_tokens: u32,
    /// Prefixes each pool's KV cache holds (default: prefixes / pools, rounded up, + 1).
    #[arg(long)]
    cache_prefixes: Option<usize>,
    /// Runs, in order: p2c, kv, off.
    #[arg(long, default_value = "p2c,kv,off", value_delimiter = ',')]
    runs: Vec<RunKind>,
    /// Seeds the prompts and the order of prefixes.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum RunKind {
    P2c,
    Kv,
    Off,
}

impl RunKind {
    fn name(self) -> &'static str {
        match self {
            RunKind::P2c => "p2c",
            RunKind::Kv => "kv",
            RunKind::Off => "off",
        }
    }

    fn routing(self) -> Routing {
        match self {
            RunKind::Kv => Routing::Kv,
            RunKind::P2c | RunKind::Off => Routing::P2c,
        }
    }

    fn caching(self) -> bool {
        self != RunKind::Off
    }
}

/// xorshift64*: reproducible prompts without a dependency.
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

/// The prompts of one run: the same in every run.
struct Workload {
    prefixes: Vec<Vec<u32>>,
    /// Measured requests: (prefix index, whole prompt).
    requests: Vec<(usize, Vec<u32>)>,
}

impl Workload {
    fn new(args: &PrefixBenchArgs, vocab: u32) -> Self {
        let mut rng = Rng(args.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        // Ids away from the ends of the vocabulary, where special tokens tend to sit.
        let span = u64::from(vocab.saturating_sub(200).max(1));
        let token = |rng: &mut Rng| 100 + rng.below(span) as u32;
        let prefixes: Vec<Vec<u32>> = (0..args.prefixes)
            .map(|_| (0..args.prefix_tokens).map(|_| token(&mut rng)).collect())
            .collect();
        let requests = (0..args.requests)
            .map(|_| {
                let k = rng.below(args.prefixes as u64) as usize;
                let mut prompt = prefixes[k].clone();
                prompt.extend((0..args.suffix_tokens).map(|_| token(&mut rng)));
                (k, prompt)
            })
            .collect();
        Self { prefixes, requests }
    }
}

/// How one request went.
#[derive(Debug, Clone, Copy)]
struct Record {
    ttft_s: f64,
    prompt_tokens: u32,
    cached_tokens: u32,
    completion_tokens: u32,
}

/// One run's figures.
struct Figures {
    hit_rate: f64,
    hit_requests: usize,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    hit_ttft_p50_ms: Option<f64>,
    miss_ttft_p50_ms: Option<f64>,
    requests_per_s: f64,
    prompt_tokens_per_s: f64,
    output_tokens_per_s: f64,
}

fn figures(records: &[Record], wall_s: f64) -> Figures {
    let ms = |r: &Record| r.ttft_s * 1e3;
    let sorted = |f: &dyn Fn(&Record) -> bool| {
        let mut v: Vec<f64> = records.iter().filter(|r| f(r)).map(ms).collect();
        v.sort_by(f64::total_cmp);
        v
    };
    let all = sorted(&|_| true);
    let prompt: u64 = records.iter().map(|r| u64::from(r.prompt_tokens)).sum();
    let cached: u64 = records.iter().map(|r| u64::from(r.cached_tokens)).sum();
    let output: u64 = records.iter().map(|r| u64::from(r.completion_tokens)).sum();
    Figures {
        hit_rate: cached as f64 / prompt.max(1) as f64,
        hit_requests: records.iter().filter(|r| r.cached_tokens > 0).count(),
        ttft_p50_ms: percentile(&all, 0.5).unwrap_or(f64::NAN),
        ttft_p99_ms: percentile(&all, 0.99).unwrap_or(f64::NAN),
        hit_ttft_p50_ms: percentile(&sorted(&|r| r.cached_tokens > 0), 0.5),
        miss_ttft_p50_ms: percentile(&sorted(&|r| r.cached_tokens == 0), 0.5),
        requests_per_s: records.len() as f64 / wall_s,
        prompt_tokens_per_s: prompt as f64 / wall_s,
        output_tokens_per_s: output as f64 / wall_s,
    }
}

pub fn run(args: PrefixBenchArgs) -> Result<()> {
    if args.pools == 0 || args.gateways == 0 || args.prefixes == 0 || args.concurrency == 0 {
        bail!("--pools, --gateways, --prefixes and --concurrency must be at least 1");
    }
    if args.prefix_tokens == 0 || args.max_tokens == 0 || args.runs.is_empty() {
        bail!("--prefix-tokens, --max-tokens and --runs must not be empty");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(bench(args))
}

async fn bench(args: PrefixBenchArgs) -> Result<()> {
    let store = Store::embedded();
    let mut table = Table::new(&[
        "run",
        "routing",
        "prefix caching",
        "requests",
        "hit rate",
        "hit requests",
        "TTFT p50 ms",
        "TTFT p99 ms",
        "TTFT p50 hit ms",
        "TTFT p50 miss ms",
        "req/s",
        "prompt tok/s",
        "output tok/s",
    ]);
    let mut rows = Vec::new();
    let mut workload = None;
    let mut cold_ttft_ms = None;
    for &kind in &args.runs {
        let pools = start_pools(&args, kind, &store).await?;
        let vocab = pools.vocab;
        let work = workload.get_or_insert_with(|| Workload::new(&args, vocab));
        let (records, wall_s) = run_one(&args, kind, &store, work).await?;
        for w in pools.workers {
            w.drain().await?;
        }
        let f = figures(&records, wall_s);
        if kind == RunKind::Off {
            cold_ttft_ms = Some(f.ttft_p50_ms);
        }
        let opt = |v: Option<f64>| v.map_or_else(|| "--".to_owned(), |v| format!("{v:.0}"));
        table.row(vec![
            kind.name().into(),
            kind.routing().to_string(),
            if kind.caching() { "on" } else { "off" }.into(),
            records.len().to_string(),
            format!("{:.3}", f.hit_rate),
            format!("{}/{}", f.hit_requests, records.len()),
            format!("{:.0}", f.ttft_p50_ms),
            format!("{:.0}", f.ttft_p99_ms),
            opt(f.hit_ttft_p50_ms),
            opt(f.miss_ttft_p50_ms),
            format!("{:.3}", f.requests_per_s),
            format!("{:.0}", f.prompt_tokens_per_s),
            format!("{:.1}", f.output_tokens_per_s),
        ]);
        rows.push(json!({
            "run": kind.name(), "routing": kind.routing().as_str(), "prefix_caching": kind.caching(),
            "requests": records.len(), "hit_rate": f.hit_rate, "hit_requests": f.hit_requests,
            "ttft_p50_ms": f.ttft_p50_ms, "ttft_p99_ms": f.ttft_p99_ms,
            "hit_ttft_p50_ms": f.hit_ttft_p50_ms, "miss_ttft_p50_ms": f.miss_ttft_p50_ms,
            "requests_per_s": f.requests_per_s, "prompt_tokens_per_s": f.prompt_tokens_per_s,
            "output_tokens_per_s": f.output_tokens_per_s,
        }));
    }
    let hash_us = hashing_cost_us(args.prefix_tokens + args.suffix_tokens);
    if args.json {
        println!(
            "{}",
            json!({ "runs": rows, "hash_us_per_prompt": hash_us, "config": {
                "pools": args.pools, "gateways": args.gateways, "prefixes": args.prefixes,
                "prefix_tokens": args.prefix_tokens, "suffix_tokens": args.suffix_tokens,
                "requests": args.requests, "concurrency": args.concurrency,
                "max_tokens": args.max_tokens, "cache_prefixes": cache_prefixes(&args) } })
        );
        return Ok(());
    }
    println!(
        "{} pools, {} gateways; {} prefixes of {} tokens + {} distinct, {} new tokens; {} requests \
         from {} clients per run; each pool's KV cache holds {} prefixes; {} CPU threads",
        args.pools,
        args.gateways,
        args.prefixes,
        args.prefix_tokens,
        args.suffix_tokens,
        args.max_tokens,
        args.requests,
        args.concurrency,
        cache_prefixes(&args),
        rayon::current_num_threads()
    );
    print!("{}", table.render());
    let share = cold_ttft_ms.map_or_else(String::new, |c| {
        format!(" = {:.6}% of a cold prompt's TTFT", hash_us / 10.0 / c)
    });
    println!(
        "hashing a {}-token prompt's blocks: {hash_us:.1} µs{share}",
        args.prefix_tokens + args.suffix_tokens
    );
    Ok(())
}

fn cache_prefixes(args: &PrefixBenchArgs) -> usize {
    args.cache_prefixes
        .unwrap_or(args.prefixes.div_ceil(args.pools) + 1)
}

/// Mean time to name every block of a `tokens`-token prompt (what prefix caching adds to
/// each request whether it hits or not).
fn hashing_cost_us(tokens: usize) -> f64 {
    let prompt: Vec<u32> = (0..tokens as u32).collect();
    let seed = ferrite_proto::prefix::seed("bench");
    let runs = 200;
    let start = Instant::now();
    let mut blocks = 0;
    for _ in 0..runs {
        blocks +=
            std::hint::black_box(ferrite_proto::prefix::chain(seed, BLOCK_SIZE, &prompt)).len();
    }
    std::hint::black_box(blocks);
    start.elapsed().as_secs_f64() * 1e6 / f64::from(runs)
}

struct Pools {
    workers: Vec<RunningWorker>,
    vocab: u32,
}

/// `--pools` fresh pools for `kind`, registered under its own key prefix.
async fn start_pools(args: &PrefixBenchArgs, kind: RunKind, store: &Store) -> Result<Pools> {
    let schema = KeySchema::new(format!("/bench-prefix/{}", kind.name()));
    let prompt_tokens = args.prefix_tokens + args.suffix_tokens + args.max_tokens as usize;
    let slot_tokens = prompt_tokens.div_ceil(BLOCK_SIZE) * BLOCK_SIZE + BLOCK_SIZE;
    let mut workers = Vec::new();
    let mut vocab = 0;
    for i in 0..args.pools {
        let (model, tokenizer, _) = args.model.load_for_engine()?;
        let c = model.config().clone();
        vocab = u32::try_from(c.vocab_size).unwrap_or(u32::MAX);
        let mut engine = args.model.engine_config(&model)?;
        let dtype = engine.kv_cache_dtype;
        let per_token = KvCache::bytes_per_token(c.num_layers, c.num_kv_heads, c.head_dim, dtype);
        engine.max_model_len = Some(slot_tokens);
        engine.block_size = BLOCK_SIZE;
        engine.kv_cache_bytes = cache_prefixes(args) * slot_tokens * per_token;
        engine.prefix_caching = kind.caching();
        let cfg = WorkerConfig {
            model_name: MODEL.into(),
            pool: format!("{}-{i}", kind.name()),
            tp: TpConfig::solo(),
            listen: "127.0.0.1:0".parse()?,
            advertise_host: None,
            engine,
            max_waiting: 4096,
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
        let worker = RunningWorker::start(
            model,
            tokenizer,
            cfg,
            store.clone(),
            schema.clone(),
            Box::new(Solo),
            None,
        )
        .await
        .with_context(|| format!("starting pool {i} of the {} run", kind.name()))?;
        workers.push(worker);
    }
    Ok(Pools { workers, vocab })
}

/// The gateways of one run, warmed, then the measured requests: every record and the
/// measured wall time.
async fn run_one(
    args: &PrefixBenchArgs,
    kind: RunKind,
    store: &Store,
    work: &Workload,
) -> Result<(Vec<Record>, f64)> {
    let schema = KeySchema::new(format!("/bench-prefix/{}", kind.name()));
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let mut channels = Vec::new();
    for _ in 0..args.gateways {
        let gw = Gateway::new(store.clone(), schema.clone()).with_routing(kind.routing());
        let mut stopped = stopped.clone();
        let (addrs, _task) = ferrite_gateway::serve(
            gw.clone(),
            "127.0.0.1:0".parse()?,
            "127.0.0.1:0".parse()?,
            async move {
                let _ = stopped.wait_for(|s| *s).await;
            },
        )
        .await?;
        wait_for_pools(&gw, args.pools).await?;
        channels.push(
            Channel::from_shared(format!("http://{}", addrs.grpc))?
                .tcp_nodelay(true)
                .connect()
                .await
                .context("connecting to the gateway")?,
        );
    }
    // Warming: every prefix once, one after another, through the first gateway.
    for p in &work.prefixes {
        let mut prompt = p.clone();
        prompt.push(1);
        one(channels[0].clone(), prompt, 1).await?;
    }
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    let requests = Arc::new(work.requests.clone());
    for _ in 0..args.concurrency {
        let (next, requests, channels) = (next.clone(), requests.clone(), channels.clone());
        let max_tokens = args.max_tokens;
        tasks.push(tokio::spawn(async move {
            let mut records = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some((_, prompt)) = requests.get(i) else {
                    break;
                };
                let gateway = channels[i % channels.len()].clone();
                records.push(one(gateway, prompt.clone(), max_tokens).await?);
            }
            anyhow::Ok(records)
        }));
    }
    let mut records = Vec::new();
    for t in tasks {
        records.extend(t.await??);
    }
    let wall = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    Ok((records, wall))
}

/// Waits until `gw` sees `n` ready pools and has heard from each one's prefix-cache stream.
async fn wait_for_pools(gw: &Gateway, n: usize) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let ready = gw.pools().ready(MODEL);
        let names: Vec<&str> = ready.iter().map(|p| p.name.as_str()).collect();
        let heard = gw.pools().kv().lookup(&names, &[1, 2], None);
        if ready.len() == n && heard.iter().all(|p| p.load.is_some()) {
            return Ok(());
        }
        if Instant::now() > deadline {
            bail!("the gateway saw {} of {n} pools within 60 s", ready.len());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// One request through a gateway: its time to first token and usage.
async fn one(channel: Channel, prompt: Vec<u32>, max_tokens: u32) -> Result<Record> {
    let mut client = api::inference_client::InferenceClient::new(channel);
    let req = api::GenerateRequest {
        model: MODEL.into(),
        prompt: Some(api::generate_request::Prompt::TokenIds(api::TokenIds {
            ids: prompt,
        })),
        sampling: Some(api::SamplingParams {
            max_tokens: Some(max_tokens),
            temperature: Some(0.0),
            ignore_eos: true,
            ..api::SamplingParams::default()
        }),
        ..Default::default()
    };
    let t0 = Instant::now();
    let mut stream = client.generate(req).await?.into_inner();
    let mut ttft = None;
    while let Some(msg) = stream.message().await? {
        match msg.event {
            Some(api::generate_response::Event::Delta(_)) => {
                ttft.get_or_insert(t0.elapsed().as_secs_f64());
            }
            Some(api::generate_response::Event::Finish(f)) => {
                let usage = f.usage.unwrap_or_default();
                return Ok(Record {
                    ttft_s: ttft.unwrap_or(t0.elapsed().as_secs_f64()),
                    prompt_tokens: usage.prompt_tokens,
                    cached_tokens: usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
                    completion_tokens: usage.completion_tokens,
                });
            }
            Some(api::generate_response::Event::PromptLogprobs(_)) | None => {}
        }
    }
    bail!("the stream ended without a finish")
}
