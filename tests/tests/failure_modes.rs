//! How pools fail, through real processes: a model that computes NaN is refused at start, a
//! panicking engine takes its pool out of placement (and its followers exit non-zero), a
//! stopped worker stalls its requests only as long as the gateway's bounds say, no ready pool
//! is UNAVAILABLE (never "no such model"), a drain ends at its deadline, ranks that finish
//! loading far apart still form a pool, a full queue sends the request to another pool, and
//! bad limits are refused at start.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use ferrite_cluster_tests::cluster::{DISCOVERY_TIMEOUT, PREFIX, WORKER_READY_TIMEOUT};
use ferrite_cluster_tests::grpc::{self, greedy_text};
use ferrite_cluster_tests::{
    Cluster, GatewayProc, MODEL, Proc, RankProc, WorkerOptions, WorkerProc, ferrite_bin, http,
    serial, wait,
};
use ferrite_placement::testing::EtcdServer;
use ferrite_placement::{KeySchema, Store};
use ferrite_proto::v1::GenerateRequest;
use ferrite_proto::v1::inference_client::InferenceClient;
use tonic::Code;
use tonic::transport::Channel;

const LEASE_TTL: Duration = Duration::from_secs(3);

fn options() -> WorkerOptions {
    WorkerOptions {
        lease_ttl_s: LEASE_TTL.as_secs(),
        ..WorkerOptions::default()
    }
}

fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A pool of two ranks of the tiny test model (the default model's 9 heads do not split 2
/// ways).
fn tiny_tp_options() -> WorkerOptions {
    let tiny =
        ferrite_cluster_tests::workspace_root().join("tests/fixtures/models/qwen2/model.gguf");
    WorkerOptions {
        model_file: Some(tiny),
        kv_cache_mib: 64,
        max_model_len: Some(256),
        ..options()
    }
}

/// The default model's GGUF file.
async fn default_gguf() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FERRITE_TEST_GGUF") {
        return Ok(PathBuf::from(p));
    }
    let args = ["model".to_owned(), "path".to_owned(), MODEL.to_owned()];
    let out = Proc::output("model path", &ferrite_bin()?, &args, WORKER_READY_TIMEOUT).await?;
    Ok(PathBuf::from(out.trim()))
}

/// Every key under `pools/{pool}` in `etcd`.
async fn keys_of(etcd: &str, pool: &str) -> Result<Vec<String>> {
    let store = Store::connect(&[etcd.to_owned()], PREFIX).await?;
    let prefix = KeySchema::new(PREFIX).pool(pool);
    Ok(store
        .get_prefix(&prefix)
        .await?
        .into_iter()
        .map(|(k, _)| k)
        .collect())
}

/// Streams `req` and returns how it ended: the tokens it got and the final status.
async fn stream_until_end(
    client: &mut InferenceClient<Channel>,
    req: GenerateRequest,
    within: Duration,
) -> Result<(usize, Result<(), tonic::Status>)> {
    let mut stream = client.generate(req).await?.into_inner();
    let mut tokens = 0;
    let ended = tokio::time::timeout(within, async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => tokens += 1,
                Ok(None) => return Ok(()),
                Err(s) => return Err(s),
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("the stream neither ended nor failed within {within:?}"))?;
    Ok((tokens, ended))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_model_that_computes_nan_is_refused_at_start_instead_of_serving() -> Result<()> {
    let _turn = serial().await;
    let dir = std::env::temp_dir().join(format!("ferrite-nan-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let poisoned = dir.join("poisoned.gguf");
    // The default model with 8 MiB of its weights overwritten by 0xFF bytes (NaN in every
    // float format): a file of the right size and layout whose arithmetic gives NaN.
    let mut bytes = std::fs::read(default_gguf().await?)?;
    bytes[60 << 20..68 << 20].fill(0xFF);
    std::fs::write(&poisoned, &bytes)?;
    drop(bytes);
    let etcd = tokio::task::spawn_blocking(EtcdServer::start).await?;
    let opts = WorkerOptions {
        model_file: Some(poisoned),
        ..options()
    };
    let mut proc = WorkerProc::spawn(&etcd.endpoint(), "nan", &opts)?;
    let status = proc.wait_exit(WORKER_READY_TIMEOUT).await?;
    let stderr = proc.stderr();
    let _ = std::fs::remove_dir_all(&dir);
    ensure!(
        !status.success(),
        "the worker served NaN: {status}\n{stderr}"
    );
    ensure!(
        stderr.contains("not a distribution") && stderr.contains("NaN"),
        "{stderr}"
    );
    ensure!(
        !proc.stdout().iter().any(|l| l.trim() == "ready"),
        "it said ready"
    );
    let left = keys_of(&etcd.endpoint(), "nan").await?;
    ensure!(left.is_empty(), "keys left behind: {left:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_engine_takes_its_pool_out_at_once_and_requests_go_elsewhere() -> Result<()> {
    let _turn = serial().await;
    let mut cluster = Cluster::start(&["healthy"], options()).await?;
    let endpoint = cluster.etcd.endpoint();
    // The warm-up takes the first two steps; the engine panics at the third, the first
    // step of the first request.
    let doomed_opts = WorkerOptions {
        env: env(&[("FERRITE_FAILPOINTS", "engine.step.panic=3")]),
        ..options()
    };
    let doomed = WorkerProc::start(&endpoint, "doomed", &doomed_opts).await?;
    cluster.workers.push(doomed);
    cluster.wait_for_ready_pools(2, DISCOVERY_TIMEOUT).await?;
    // Straight to the doomed pool: the request fails as a server fault, never the client's.
    let mut worker = cluster.worker("doomed").client().await?;
    let failed = grpc::worker_greedy(&mut worker, vec![1, 2, 3], 4).await;
    let status = failed.expect_err("the engine panicked");
    ensure!(
        status.code() == Code::Unavailable,
        "{status:?}: a server fault is UNAVAILABLE"
    );
    let panicked = Instant::now();
    let doomed = cluster.worker_mut("doomed");
    let exit = doomed.proc.wait_exit(Duration::from_secs(5)).await?;
    ensure!(!exit.success(), "a failed pool exits non-zero: {exit}");
    ensure!(
        doomed.proc.stderr().contains("engine thread panicked"),
        "{}",
        doomed.proc.stderr()
    );
    // Its keys went at once, not at the end of its lease.
    let left = keys_of(&endpoint, "doomed").await?;
    ensure!(left.is_empty(), "keys left: {left:?}");
    ensure!(panicked.elapsed() < LEASE_TTL, "{:?}", panicked.elapsed());
    // Every request is served by the pool that is left.
    for i in 0..6 {
        let mut client = cluster.inference().await?;
        grpc::generate(&mut client, greedy_text("The sky is", 4))
            .await
            .with_context(|| format!("request {i}"))?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_followers_of_a_leader_that_panicked_exit_non_zero() -> Result<()> {
    let _turn = serial().await;
    let etcd = tokio::task::spawn_blocking(EtcdServer::start).await?;
    let endpoint = etcd.endpoint();
    let opts = tiny_tp_options();
    let follower = RankProc::spawn(&endpoint, "tp", 1, 2, &opts)?;
    let leader_opts = WorkerOptions {
        env: env(&[("FERRITE_FAILPOINTS", "engine.step.panic=3")]),
        ..opts.clone()
    };
    let leader = WorkerProc::spawn_rank(&endpoint, "tp", 0, 2, &leader_opts)?;
    let (mut follower, mut leader) = tokio::try_join!(
        RankProc::ready(1, follower),
        WorkerProc::ready("tp", leader)
    )?;
    let mut client = leader.client().await?;
    let status = grpc::worker_greedy(&mut client, vec![1, 2, 3], 4)
        .await
        .expect_err("the leader's engine panicked");
    ensure!(status.code() == Code::Unavailable, "{status:?}");
    let exit = leader.proc.wait_exit(Duration::from_secs(10)).await?;
    ensure!(!exit.success(), "rank 0: {exit}");
    let exit = follower.proc.wait_exit(Duration::from_secs(10)).await?;
    ensure!(
        !exit.success(),
        "rank 1 exited as if the pool had ended well: {exit}"
    );
    ensure!(
        follower.proc.stderr().contains("rank 0"),
        "{}",
        follower.proc.stderr()
    );
    Ok(())
}

/// The gateway's bounds, short for the test: keep-alive long enough not to decide first.
fn bounded_gateway() -> Vec<(String, String)> {
    env(&[
        ("FERRITE_WORKER_KEEPALIVE_S", "60"),
        ("FERRITE_FIRST_TOKEN_TIMEOUT_S", "3"),
        ("FERRITE_TOKEN_IDLE_TIMEOUT_S", "2"),
    ])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_worker_fails_its_streams_within_the_idle_bound_and_new_requests_go_on()
-> Result<()> {
    let _turn = serial().await;
    let mut cluster = Cluster::start_with(&["a", "b"], options(), &bounded_gateway()).await?;
    let mut client = cluster.inference().await?;
    let long = greedy_text("Write a very long essay about the sea.", 1500);
    let mut stream = client.generate(long).await?.into_inner();
    stream.message().await?.context("no first token")?;
    let victim = cluster
        .pool_running_a_request(Duration::from_secs(10))
        .await?;
    cluster.worker_mut(&victim).proc.signal("STOP")?;
    let stopped = Instant::now();
    let failed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return Err("the stream ended without an error".to_owned()),
                Err(s) => return Ok(s),
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("the stream hung on the stopped pool"))?
    .map_err(anyhow::Error::msg)?;
    let waited = stopped.elapsed();
    ensure!(failed.code() == Code::Unavailable, "{failed:?}");
    ensure!(failed.message().contains("sent no token"), "{failed:?}");
    ensure!(waited < Duration::from_secs(4), "failed after {waited:?}");
    // New requests while it stays stopped: none waits past the first-token bound, and all
    // are served (by the other pool, after one try at most on the stopped one).
    for i in 0..4 {
        let started = Instant::now();
        let mut client = cluster.inference().await?;
        grpc::generate(&mut client, greedy_text("The sky is", 4))
            .await
            .with_context(|| format!("request {i} while {victim} is stopped"))?;
        ensure!(
            started.elapsed() < Duration::from_secs(5),
            "request {i} took {:?}",
            started.elapsed()
        );
    }
    cluster.worker_mut(&victim).proc.signal("CONT")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_cuts_a_stopped_worker_even_without_the_idle_bound() -> Result<()> {
    let _turn = serial().await;
    let gateway = env(&[
        ("FERRITE_WORKER_KEEPALIVE_S", "1"),
        ("FERRITE_TOKEN_IDLE_TIMEOUT_S", "600"),
    ]);
    let mut cluster = Cluster::start_with(&["a"], options(), &gateway).await?;
    let mut client = cluster.inference().await?;
    let long = greedy_text("Write a very long essay about the sea.", 1500);
    let mut stream = client.generate(long).await?.into_inner();
    stream.message().await?.context("no first token")?;
    cluster.worker_mut("a").proc.signal("STOP")?;
    let stopped = Instant::now();
    let failed = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Err(s) = stream.message().await {
                return s;
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("no keep-alive: the stream hung"))?;
    ensure!(failed.code() == Code::Unavailable, "{failed:?}");
    ensure!(
        stopped.elapsed() < Duration::from_secs(5),
        "{:?}",
        stopped.elapsed()
    );
    cluster.worker_mut("a").proc.signal("CONT")?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_ready_pool_is_unavailable_with_retry_after_not_model_not_found() -> Result<()> {
    let _turn = serial().await;
    // A gateway that starts while etcd is down is not ready, and says UNAVAILABLE.
    let mut etcd = tokio::task::spawn_blocking(EtcdServer::start).await?;
    tokio::task::block_in_place(|| etcd.stop());
    let gateway = GatewayProc::ready(GatewayProc::spawn(&etcd.endpoint())?).await?;
    let health = http::get(gateway.http, "/health").await?;
    ensure!(health.status == 503, "{health:?}");
    let chat = serde_json::json!({"model": MODEL, "max_tokens": 4,
        "messages": [{"role": "user", "content": "Hi"}]});
    let r = http::post_json(gateway.http, "/v1/chat/completions", &chat).await?;
    ensure!(r.status == 503, "before placement answered: {r:?}");
    ensure!(
        r.headers
            .iter()
            .any(|(k, v)| k == "retry-after" && v == "1"),
        "{r:?}"
    );
    tokio::task::block_in_place(|| etcd.restart());
    wait::until(
        "the gateway to become ready",
        Duration::from_secs(30),
        || async {
            match http::get(gateway.http, "/health").await {
                Ok(h) if h.status == 200 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    // A model never served here is NOT_FOUND ...
    let r = http::post_json(gateway.http, "/v1/chat/completions", &chat).await?;
    ensure!(r.status == 404, "{r:?}");
    // ... and one whose only pool drains (or just left) is UNAVAILABLE: clients retry.
    let mut worker = WorkerProc::start(&etcd.endpoint(), "only", &options()).await?;
    let served = wait::until("the pool to serve", DISCOVERY_TIMEOUT, || async {
        match http::post_json(gateway.http, "/v1/chat/completions", &chat).await {
            Ok(r) if r.status == 200 => Ok(()),
            other => Err(format!("{other:?}")),
        }
    });
    served.await?;
    worker.proc.terminate(Duration::from_secs(60)).await?;
    for _ in 0..3 {
        let r = http::post_json(gateway.http, "/v1/chat/completions", &chat).await?;
        ensure!(r.status == 503, "after the drain: {r:?}");
        ensure!(r.body.contains("try again"), "{r:?}");
    }
    let mut client =
        InferenceClient::new(ferrite_cluster_tests::cluster::channel(gateway.grpc).await?);
    let status = grpc::generate(&mut client, greedy_text("Hi", 2))
        .await
        .expect_err("no pool");
    ensure!(status.code() == Code::Unavailable, "{status:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_ends_at_its_deadline_failing_what_is_left_as_unavailable() -> Result<()> {
    let _turn = serial().await;
    let opts = WorkerOptions {
        extra_args: vec!["--drain-timeout-s".into(), "2".into()],
        ..options()
    };
    let mut cluster = Cluster::start(&["a"], opts).await?;
    let mut client = cluster.inference().await?;
    let long = greedy_text("Write a very long essay about the sea.", 1500);
    let streaming =
        tokio::spawn(
            async move { stream_until_end(&mut client, long, Duration::from_secs(120)).await },
        );
    cluster
        .pool_running_a_request(Duration::from_secs(10))
        .await?;
    let started = Instant::now();
    let exit = cluster
        .worker_mut("a")
        .proc
        .terminate(Duration::from_secs(30))
        .await?;
    let took = started.elapsed();
    ensure!(exit.success(), "{exit}");
    ensure!(took < Duration::from_secs(5), "the drain took {took:?}");
    let (tokens, ended) = streaming.await??;
    let status = ended.err().context("the stream finished 1500 tokens")?;
    ensure!(status.code() == Code::Unavailable, "{status:?}");
    ensure!(status.message().contains("drain timeout"), "{status:?}");
    ensure!(tokens > 0, "tokens before the deadline");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ranks_that_finish_loading_far_apart_still_form_a_pool() -> Result<()> {
    let _turn = serial().await;
    let etcd = tokio::task::spawn_blocking(EtcdServer::start).await?;
    let endpoint = etcd.endpoint();
    let opts = WorkerOptions {
        extra_args: vec!["--collective-timeout-s".into(), "2".into()],
        ..tiny_tp_options()
    };
    let mut leader = WorkerProc::spawn_rank(&endpoint, "late", 0, 2, &opts)?;
    // Rank 0 publishes where to join before it loads: stop it there, as if its loading were
    // slow, while rank 1 loads and joins.
    let store = Store::connect(std::slice::from_ref(&endpoint), PREFIX).await?;
    let nccl = KeySchema::new(PREFIX).nccl("late");
    wait::until("rank 0's record", Duration::from_secs(30), || async {
        match store.get_prefix(&nccl).await {
            Ok(kv) if !kv.is_empty() => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await?;
    leader.signal("STOP")?;
    let follower = RankProc::spawn(&endpoint, "late", 1, 2, &opts)?;
    // Three collective timeouts pass with rank 1 loaded and waiting.
    tokio::time::sleep(Duration::from_secs(6)).await;
    leader.signal("CONT")?;
    let (_follower, leader) = tokio::try_join!(
        RankProc::ready(1, follower),
        WorkerProc::ready("late", leader)
    )?;
    let mut client = leader.client().await?;
    grpc::worker_greedy(&mut client, vec![1, 2, 3], 4).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_0_that_cannot_load_takes_back_where_to_join_at_once() -> Result<()> {
    let _turn = serial().await;
    let etcd = tokio::task::spawn_blocking(EtcdServer::start).await?;
    // The default model's 9 attention heads do not split 2 ways: rank 0 publishes its record,
    // then finds it cannot load its shard.
    let opts = WorkerOptions {
        lease_ttl_s: 60,
        ..options()
    };
    let mut leader = WorkerProc::spawn_rank(&etcd.endpoint(), "broken", 0, 2, &opts)?;
    let exit = leader.wait_exit(WORKER_READY_TIMEOUT).await?;
    ensure!(!exit.success(), "{exit}");
    ensure!(
        leader.stderr().contains("do not divide"),
        "{}",
        leader.stderr()
    );
    let left = keys_of(&etcd.endpoint(), "broken").await?;
    ensure!(left.is_empty(), "left for its 60 s lease: {left:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_sends_the_request_to_another_pool() -> Result<()> {
    let _turn = serial().await;
    let opts = WorkerOptions {
        max_num_seqs: Some(1),
        max_waiting: Some(2),
        ..options()
    };
    let cluster = Cluster::start(&["a", "b"], opts).await?;
    // One prompt prefix for all: KV-aware routing sends every request to the pool that holds
    // it, whose queue takes two.
    let shared = "Tell me a story about a lighthouse keeper. ".repeat(40);
    let mut client = cluster.inference().await?;
    grpc::generate(&mut client, greedy_text(&shared, 2)).await?;
    let cluster = &cluster;
    let requests = (0..4).map(|i| {
        let prompt = format!("{shared} Part {i}.");
        async move {
            let mut client = cluster.inference().await?;
            grpc::generate(&mut client, greedy_text(&prompt, 48))
                .await
                .with_context(|| format!("request {i}"))
        }
    });
    let done = futures::future::join_all(requests).await;
    let failed: Vec<String> = done
        .into_iter()
        .filter_map(|r| r.err().map(|e| format!("{e:#}")))
        .collect();
    if !failed.is_empty() {
        bail!("refused while a pool had room: {failed:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_of_zero_are_refused_at_start() -> Result<()> {
    for flag in [
        "--rate-limit-requests-per-min",
        "--rate-limit-tokens-per-min",
        "--first-token-timeout-s",
    ] {
        let args: Vec<String> = ["gateway", flag, "0", "--etcd", "http://127.0.0.1:9"]
            .map(String::from)
            .into();
        let mut proc = Proc::spawn(flag, &ferrite_bin()?, &args)?;
        let exit = proc.wait_exit(Duration::from_secs(10)).await?;
        ensure!(!exit.success(), "{flag} 0 was taken");
        let stderr = proc.stderr();
        ensure!(stderr.contains(flag) && stderr.contains('0'), "{stderr}");
    }
    Ok(())
}

/// The status the gateway at `http_addr` answers `body` with, and how long it took.
async fn timed_chat(
    http_addr: std::net::SocketAddr,
    body: &serde_json::Value,
) -> Result<(u16, Duration)> {
    let started = Instant::now();
    let r = http::post_json(http_addr, "/v1/chat/completions", body).await?;
    Ok((r.status, started.elapsed()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_over_its_limit_costs_no_tokenization_and_big_prompts_stall_no_stream()
-> Result<()> {
    let _turn = serial().await;
    let cluster = Cluster::start(&["a"], options()).await?;
    // A second gateway, limiting every caller to 2 requests a minute.
    let limits = env(&[("FERRITE_RATE_LIMIT_REQUESTS_PER_MIN", "2")]);
    let limited = GatewayProc::spawn_with_env(&cluster.etcd.endpoint(), &limits)?;
    let limited = GatewayProc::ready(limited).await?;
    // A prompt of almost 2 MiB: far past the context, so tokenizing it is all it costs (and a
    // refused request takes nothing from the limit).
    let big = serde_json::json!({"model": MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": "the quick brown fox ".repeat(95_000)}]});
    let small = serde_json::json!({"model": MODEL, "max_tokens": 2,
        "messages": [{"role": "user", "content": "Hi"}]});
    let served = wait::until(
        "the limited gateway to see the pool",
        DISCOVERY_TIMEOUT,
        || async {
            match timed_chat(limited.http, &big).await {
                Ok((400, took)) => Ok(took),
                other => Err(format!("{other:?}")),
            }
        },
    );
    let (tokenized, _) = served.await?;
    for _ in 0..2 {
        let (status, _) = timed_chat(limited.http, &small).await?;
        ensure!(status == 200, "{status}");
    }
    let (status, refused) = timed_chat(limited.http, &big).await?;
    ensure!(status == 429, "over the limit: {status}");
    ensure!(
        refused * 4 < tokenized,
        "refused in {refused:?}, as long as a tokenization ({tokenized:?})"
    );
    // Big prompts tokenized meanwhile hold up no stream: a request streaming through the same
    // gateway keeps its pace.
    let mut client = cluster.inference().await?;
    let long = greedy_text("Write a very long essay about the sea.", 400);
    let mut stream = client.generate(long).await?.into_inner();
    stream.message().await?.context("no first token")?;
    let flood = futures::future::join_all((0..4).map(|_| timed_chat(cluster.gateway.http, &big)));
    let pace = async {
        let mut gap = Duration::ZERO;
        let mut last = Instant::now();
        for _ in 0..150 {
            if stream.message().await?.is_none() {
                break;
            }
            gap = gap.max(last.elapsed());
            last = Instant::now();
        }
        anyhow::Ok(gap)
    };
    let (flooded, gap) = tokio::join!(flood, pace);
    for f in flooded {
        ensure!(f?.0 == 400, "past the context");
    }
    let gap = gap?;
    ensure!(
        gap < tokenized,
        "a stream stalled {gap:?} while prompts were tokenized ({tokenized:?} each)"
    );
    Ok(())
}

/// How many KV blocks `pool`'s prefix cache holds.
async fn cached_blocks(cluster: &Cluster, pool: &str) -> Result<u32> {
    Ok(cluster.worker(pool).load().await?.kv_blocks_cached)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_of_different_contexts_each_get_the_requests_they_hold() -> Result<()> {
    let _turn = serial().await;
    let etcd_cluster = Cluster::start(
        &["short"],
        WorkerOptions {
            max_model_len: Some(256),
            ..options()
        },
    )
    .await?;
    let mut cluster = etcd_cluster;
    let long_opts = WorkerOptions {
        max_model_len: Some(1024),
        ..options()
    };
    let long = WorkerProc::start(&cluster.etcd.endpoint(), "long", &long_opts).await?;
    cluster.workers.push(long);
    cluster.wait_for_ready_pools(2, DISCOVERY_TIMEOUT).await?;
    let entry = cluster.model_entry().await?.context("listed")?;
    ensure!(entry.max_model_len == 1024, "{entry:?}");
    // Short requests go to both pools.
    for i in 0..16 {
        let mut client = cluster.inference().await?;
        let prompt = format!(
            "Request number {i}: {}",
            "tell me about the weather today. ".repeat(6)
        );
        grpc::generate(&mut client, greedy_text(&prompt, 2)).await?;
    }
    for pool in ["short", "long"] {
        let blocks = cached_blocks(&cluster, pool).await?;
        ensure!(blocks > 0, "pool {pool} got no request");
    }
    // A request past the short pool's context goes to the long one.
    let mut client = cluster.inference().await?;
    let prompt = "Once upon a time, in a land far away, ".repeat(40);
    let done = grpc::generate(&mut client, greedy_text(&prompt, 8)).await?;
    ensure!(done.token_ids.len() == 8, "{done:?}");
    Ok(())
}
