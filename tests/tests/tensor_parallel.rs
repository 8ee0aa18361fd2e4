//! Tensor-parallel pools as real processes: `ferrite worker --rank R --tp 3` ranks of the
//! default model (9 heads, 3 KV heads: the only split besides 1) forming through a real etcd,
//! behind a real gateway; and `ferrite serve --tp 3`, which starts its ranks itself.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use ferrite_cluster_tests::cluster::{
    DISCOVERY_TIMEOUT, WORKER_READY_TIMEOUT, addr_after, channel,
};
use ferrite_cluster_tests::grpc::{self, greedy_ids, greedy_text};
use ferrite_cluster_tests::{
    Cluster, GatewayProc, MODEL, Proc, TpPool, WorkerOptions, WorkerProc, ferrite_bin, http,
    reference, serial, wait, workspace_root,
};
use ferrite_placement::testing::EtcdServer;
use ferrite_placement::{CommRecord, PoolState};
use ferrite_proto::worker::v1::Token;
use serde_json::json;
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const LEASE_TTL: Duration = Duration::from_secs(3);

fn options() -> WorkerOptions {
    WorkerOptions {
        lease_ttl_s: LEASE_TTL.as_secs(),
        ..WorkerOptions::default()
    }
}

/// etcd, a gateway and a pool of 3 rank processes, as a [`Cluster`] whose one worker is rank 0.
async fn tp_cluster(pool: &str) -> Result<(Cluster, Vec<ferrite_cluster_tests::RankProc>)> {
    tp_cluster_with(pool, options()).await
}

async fn tp_cluster_with(
    pool: &str,
    opts: WorkerOptions,
) -> Result<(Cluster, Vec<ferrite_cluster_tests::RankProc>)> {
    let etcd = tokio::task::spawn_blocking(EtcdServer::start)
        .await
        .context("starting etcd")?;
    let endpoint = etcd.endpoint();
    let gateway = GatewayProc::spawn(&endpoint)?;
    let (tp, gateway) = tokio::try_join!(
        TpPool::start(&endpoint, pool, 3, &opts),
        GatewayProc::ready(gateway)
    )?;
    let cluster = Cluster {
        gateway,
        workers: vec![tp.leader],
        options: opts,
        etcd,
    };
    cluster.wait_for_ready_pools(1, DISCOVERY_TIMEOUT).await?;
    Ok((cluster, tp.ranks))
}

/// A golden prompt (transformers on the same GGUF): its name, token ids and first 16 greedy
/// tokens.
type Golden = (String, Vec<u32>, Vec<u32>);

fn golden() -> Result<Vec<Golden>> {
    let path = workspace_root().join("tests/fixtures/golden/smollm2_q4_1.json");
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)?;
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_u64())
                    .map(|x| x as u32)
                    .collect()
            })
            .unwrap_or_default()
    };
    let cases = v["cases"].as_array().context("cases")?;
    Ok(cases
        .iter()
        .map(|c| {
            let greedy = ids(&c["greedy_token_ids"]);
            (
                c["name"].as_str().unwrap_or("?").to_owned(),
                ids(&c["prompt_token_ids"]),
                greedy[..16.min(greedy.len())].to_vec(),
            )
        })
        .collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_rank_processes_form_through_etcd_and_generate_the_golden_tokens() -> Result<()> {
    let _turn = serial().await;
    let (cluster, ranks) = tp_cluster("tp").await?;
    let store = cluster.store().await?;
    let schema = cluster.schema();
    let record = cluster
        .pool_record(&store, "tp")
        .await?
        .context("no pool record")?;
    ensure!(
        record.tp == 3 && record.state == PoolState::Ready,
        "{record:?}"
    );
    let keys = cluster.pool_keys(&store, "tp").await?;
    for rank in 0..3 {
        ensure!(
            keys.contains(&schema.rank("tp", rank)),
            "rank {rank}: {keys:?}"
        );
    }
    let nccl = store.get_prefix(&schema.nccl("tp")).await?;
    let (_, value) = nccl.first().context("no pools/tp/nccl")?;
    let comm: CommRecord = serde_json::from_slice(value)?;
    ensure!(comm.world == 3 && comm.backend == "tcp", "{comm:?}");
    for r in &ranks {
        let mut health = HealthClient::new(channel(r.health).await?);
        let status = health
            .check(HealthCheckRequest::default())
            .await?
            .into_inner();
        ensure!(
            status.status() == ServingStatus::Serving,
            "rank {}: {status:?}",
            r.rank
        );
    }
    // Every golden prompt at once through the gateway: one batch of chunked prefills and
    // decodes, every step planned by rank 0 and run by all three.
    let client = cluster.inference().await?;
    let cases = golden()?;
    let answers = futures::future::join_all(cases.iter().map(|(_, prompt, _)| {
        let mut client = client.clone();
        let req = greedy_ids(prompt.clone(), 16);
        async move { grpc::generate(&mut client, req).await }
    }))
    .await;
    for ((name, _, want), got) in cases.iter().zip(answers) {
        let got = got.with_context(|| name.clone())?;
        ensure!(
            &got.token_ids == want,
            "{name}: {:?} != {want:?}",
            got.token_ids
        );
    }
    Ok(())
}

/// The top-20 logprobs of 8 greedy tokens of `model` from a pool of `tp` rank processes
/// (through rank 0's worker API, token ids in), then the pool stopped by SIGTERM to rank 0.
async fn pool_logprobs(etcd: &str, pool: &str, model: &Path, tp: u32) -> Result<Vec<Token>> {
    let opts = WorkerOptions {
        model_file: Some(model.to_owned()),
        kv_cache_mib: 64,
        max_model_len: Some(256),
        ..options()
    };
    let mut p = TpPool::start(etcd, pool, tp, &opts).await?;
    let mut client = p.leader.client().await?;
    let prompt = vec![1, 17, 42, 99, 5, 230, 7, 64, 128, 3];
    let tokens = grpc::worker_tokens(&mut client, prompt, 8, Some(20)).await?;
    let exit = p.leader.proc.terminate(Duration::from_secs(30)).await?;
    ensure!(exit.success(), "{pool} rank 0: {exit:?}");
    for r in &mut p.ranks {
        let exit = r.proc.wait_exit(Duration::from_secs(30)).await?;
        ensure!(exit.success(), "{pool} rank {}: {exit:?}", r.rank);
    }
    Ok(tokens)
}

/// `got` (a pool of several ranks) against `want` (one rank): the same greedy tokens, and
/// every top logprob within 1e-3 relative (fp32 on both sides: only the order of the sums
/// differs, within and across ranks). A token may leave the top 20 only by a tie with its
/// last entry.
fn same_logprobs(what: &str, got: &[Token], want: &[Token]) -> Result<()> {
    let ids = |t: &[Token]| t.iter().map(|t| t.id).collect::<Vec<_>>();
    ensure!(
        ids(got) == ids(want),
        "{what}: {:?} != {:?}",
        ids(got),
        ids(want)
    );
    let close = |a: f32, b: f32| (a - b).abs() <= 1e-3 * b.abs().max(1.0);
    for (step, (g, w)) in got.iter().zip(want).enumerate() {
        ensure!(
            g.top.len() == 20 && w.top.len() == 20,
            "{what}: no top logprobs"
        );
        ensure!(
            close(g.logprob, w.logprob),
            "{what}, step {step}: {g:?} vs {w:?}"
        );
        let last = g.top.last().map_or(f32::MIN, |t| t.logprob);
        for b in &w.top {
            let ok = match g.top.iter().find(|a| a.token_id == b.token_id) {
                Some(a) => close(a.logprob, b.logprob),
                None => close(last, b.logprob),
            };
            ensure!(
                ok,
                "{what}, step {step}: token {} at {} vs {:?}",
                b.token_id,
                b.logprob,
                g.top
            );
        }
    }
    Ok(())
}

/// Every tiny architecture (safetensors f32, GGUF f16, GGUF Q4_K/Q6_K, a GPTQ checkpoint
/// `ferrite quantize` writes, mixtures of experts, gpt-oss's MXFP4) on 2 rank processes, and on 4 where its shapes allow, gives the
/// greedy tokens and logprobs of one rank. Real processes over the CPU backend, through etcd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tiny_models_on_rank_processes_give_the_logprobs_of_one_rank() -> Result<()> {
    let _turn = serial().await;
    let etcd = tokio::task::spawn_blocking(EtcdServer::start).await?;
    let models = workspace_root().join("tests/fixtures/models");
    let gptq = std::env::temp_dir().join(format!("ferrite-tp-gptq-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&gptq);
    let quantize = [
        "quantize",
        "--method",
        "rtn",
        "--bits",
        "4",
        "--group-size",
        "32",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .chain([
        models.join("llama31").display().to_string(),
        gptq.display().to_string(),
    ])
    .collect::<Vec<_>>();
    Proc::output(
        "ferrite quantize",
        &ferrite_bin()?,
        &quantize,
        Duration::from_secs(120),
    )
    .await?;
    let cases: [(&str, std::path::PathBuf, &[u32]); 13] = [
        ("llama31", models.join("llama31"), &[2, 4]),
        ("qwen2", models.join("qwen2"), &[2, 4]),
        ("qwen3", models.join("qwen3"), &[2, 4]),
        ("mistral", models.join("mistral"), &[2]),
        ("gemma2", models.join("gemma2"), &[2, 4]),
        (
            "llama2-gguf-f16",
            models.join("llama2_tied/model.gguf"),
            &[2],
        ),
        ("qwen2-gguf-f32", models.join("qwen2/model.gguf"), &[2]),
        ("llama-kquant", models.join("llama_kquant/model.gguf"), &[2]),
        ("llama31-gptq-w4g32", gptq.clone(), &[2]),
        ("mixtral-gguf-f32", models.join("mixtral/model.gguf"), &[2]),
        ("qwen3-moe", models.join("qwen3_moe"), &[2, 4]),
        (
            "qwen2-moe-gguf-f32",
            models.join("qwen2_moe/model.gguf"),
            &[2],
        ),
        // Served by token ids: no tokenizer, so no default reasoning parser.
        ("gpt-oss-mxfp4", models.join("gpt_oss_mxfp4"), &[2]),
    ];
    let endpoint = etcd.endpoint();
    for (name, path, sizes) in &cases {
        let one = pool_logprobs(&endpoint, &format!("{name}-1"), path, 1).await?;
        for &tp in *sizes {
            let got = pool_logprobs(&endpoint, &format!("{name}-{tp}"), path, tp).await?;
            same_logprobs(&format!("{name} on {tp} ranks"), &got, &one)?;
        }
    }
    let _ = std::fs::remove_dir_all(&gptq);
    Ok(())
}

/// A 3-rank pool and a 1-rank pool behind the gateway; the official `openai` client streams a
/// long completion from the 3-rank pool; kill -9 of rank 2 mid-stream: the client's stream
/// ends within 2 s with a server error (`unavailable`) naming rank 2 and the last step every
/// rank finished, ranks 0 and 1 exit, the pool's keys are gone within the lease TTL, and the
/// gateway sends the next requests to the other pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rank_killed_mid_stream_fails_its_pool_fast_and_the_gateway_moves_on() -> Result<()> {
    let _turn = serial().await;
    let (mut cluster, mut ranks) = tp_cluster("tp").await?;
    let base_url = format!("http://{}/v1", cluster.gateway.http);
    let script = workspace_root().join("tests/clients/openai_stream.py");
    let python = std::env::var("FERRITE_PYTHON").unwrap_or_else(|_| "python3".into());
    let args = [
        script.display().to_string(),
        "--base-url".into(),
        base_url,
        "--prompt".into(),
        "Write a very long essay about the sea.".into(),
    ];
    let mut client = Proc::spawn("openai stream", std::path::Path::new(&python), &args)?;
    client.wait_ready(Duration::from_secs(60)).await?;
    // A second pool, ready only now, so the stream above surely runs on the tensor-parallel one.
    let solo = WorkerProc::start(&cluster.etcd.endpoint(), "solo", &options()).await?;
    cluster.workers.push(solo);
    cluster.wait_for_ready_pools(2, DISCOVERY_TIMEOUT).await?;

    let victim = ranks.iter_mut().find(|r| r.rank == 2).context("rank 2")?;
    let killed_at = std::time::SystemTime::now();
    victim.proc.kill_hard().await?;
    client.wait_exit(Duration::from_secs(30)).await?;
    let report: serde_json::Value = client
        .stdout()
        .last()
        .and_then(|l| serde_json::from_str(l).ok())
        .with_context(|| format!("no report from the client: {:?}", client.stdout()))?;
    let error = &report["error"];
    ensure!(
        error["code"] == "unavailable" && error["type"] == "server_error",
        "{report}"
    );
    let msg = error["message"].as_str().unwrap_or_default();
    ensure!(
        msg.contains("rank 2") && msg.contains("every rank finished step"),
        "{msg}"
    );
    let killed = killed_at
        .duration_since(std::time::UNIX_EPOCH)?
        .as_secs_f64();
    let took = error["at_unix_s"].as_f64().unwrap_or(f64::MAX) - killed;
    ensure!(
        took < 2.0,
        "the client's stream failed {took:.2} s after the kill"
    );
    ensure!(report["chunks"].as_u64() > Some(1), "{report}");

    let leader = &mut cluster.workers[0].proc;
    let exit = leader.wait_exit(Duration::from_secs(10)).await?;
    ensure!(!exit.success(), "rank 0 exited {exit:?}");
    ensure!(
        leader.stderr().contains("lost rank 2"),
        "{}",
        leader.stderr()
    );
    let rank1 = ranks.iter_mut().find(|r| r.rank == 1).context("rank 1")?;
    let exit = rank1.proc.wait_exit(Duration::from_secs(10)).await?;
    ensure!(!exit.success(), "rank 1 exited {exit:?}");

    let store = cluster.store().await?;
    // Rank 2's key lives as long as its lease: TTL after its last keep-alive (before the kill,
    // so before now), plus etcd's expiry check (every 500 ms) and the revoke's raft round,
    // which a loaded machine stretches.
    let expiry_slack = Duration::from_secs(2);
    wait::until(
        "the pool's keys to go",
        LEASE_TTL + expiry_slack,
        || async {
            match cluster.pool_keys(&store, "tp").await {
                Ok(k) if k.is_empty() => Ok(()),
                Ok(k) => Err(format!("still there: {k:?}")),
                Err(e) => Err(format!("{e:#}")),
            }
        },
    )
    .await?;
    cluster.wait_for_ready_pools(1, DISCOVERY_TIMEOUT).await?;
    let mut grpc_client = cluster.inference().await?;
    for i in 0..3 {
        let c = grpc::generate(&mut grpc_client, greedy_text("The sky is", 4))
            .await
            .with_context(|| format!("request {i} after the pool was lost"))?;
        ensure!(c.token_ids.len() == 4, "{c:?}");
    }
    Ok(())
}

/// A rank that stops answering (SIGSTOP: alive, silent) fails its pool once a collective has
/// waited the collective timeout for it, naming it: nothing hangs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_rank_fails_its_pool_after_the_collective_timeout() -> Result<()> {
    let _turn = serial().await;
    let opts = WorkerOptions {
        extra_args: vec!["--collective-timeout-s".into(), "2".into()],
        ..options()
    };
    let (cluster, mut ranks) = tp_cluster_with("tp", opts).await?;
    let mut client = cluster.inference().await?;
    let mut stream = client
        .generate(greedy_text("Write a very long essay about the sea.", 1500))
        .await?
        .into_inner();
    stream.message().await?.context("no first message")?;
    let silent = ranks.iter_mut().find(|r| r.rank == 1).context("rank 1")?;
    let pid = silent.proc.pid().to_string();
    let stopped = Instant::now();
    let ok = std::process::Command::new("kill")
        .args(["-STOP", &pid])
        .status()?;
    ensure!(ok.success(), "kill -STOP {pid}");
    let status = loop {
        match tokio::time::timeout(Duration::from_secs(10), stream.message()).await {
            Ok(Ok(Some(_))) => continue,
            Ok(Ok(None)) => anyhow::bail!("the stream ended cleanly while a rank was silent"),
            Ok(Err(status)) => break status,
            Err(_) => anyhow::bail!("still waiting 10 s after rank 1 went silent"),
        }
    };
    let took = stopped.elapsed();
    let _ = std::process::Command::new("kill")
        .args(["-CONT", &pid])
        .status();
    ensure!(status.code() == Code::Unavailable, "{status:?}");
    ensure!(status.message().contains("rank 1"), "{status:?}");
    ensure!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(5),
        "failed {took:?} after rank 1 went silent (collective timeout 2 s)"
    );
    Ok(())
}

/// A pool whose rank 2 never comes fails to start within its start-up timeout, naming rank 2;
/// a split the model's shapes do not allow is refused before anything loads, naming the sizes
/// that work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_that_cannot_form_says_which_rank_or_size() -> Result<()> {
    let _turn = serial().await;
    let etcd = tokio::task::spawn_blocking(EtcdServer::start).await?;
    let endpoint = etcd.endpoint();
    let opts = WorkerOptions {
        extra_args: vec!["--tp-start-timeout-s".into(), "4".into()],
        ..options()
    };
    let mut rank1 = ferrite_cluster_tests::RankProc::spawn(&endpoint, "short", 1, 3, &opts)?;
    let mut rank0 = WorkerProc::spawn_rank(&endpoint, "short", 0, 3, &opts)?;
    let exit = rank0.wait_exit(WORKER_READY_TIMEOUT).await?;
    ensure!(!exit.success(), "{exit:?}");
    let err = rank0.stderr();
    ensure!(err.contains("ranks [2] of 3 did not join"), "{err}");
    let exit = rank1.wait_exit(Duration::from_secs(30)).await?;
    ensure!(!exit.success(), "rank 1 exited {exit:?}");

    // `serve --tp 3` whose ranks cannot start (a variable only `worker` reads, malformed):
    // serve says which rank exited, at once rather than after its start-up timeout.
    let args = [
        "serve",
        "--tp",
        "3",
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
    ]
    .map(String::from)
    .into_iter()
    .chain(["127.0.0.1:0".into()])
    .collect::<Vec<_>>();
    let env = [("FERRITE_TP_START_TIMEOUT_S".to_owned(), "soon".to_owned())];
    let mut serve = Proc::spawn_with_env("serve --tp 3", &ferrite_bin()?, &args, &env)?;
    let started = Instant::now();
    let exit = serve.wait_exit(WORKER_READY_TIMEOUT).await?;
    ensure!(!exit.success(), "{exit:?}");
    let err = serve.stderr();
    ensure!(
        err.contains("exited") && err.contains("before the pool formed"),
        "{err}"
    );
    ensure!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );

    let mut two = WorkerProc::spawn_rank(&endpoint, "two", 0, 2, &opts)?;
    let exit = two.wait_exit(WORKER_READY_TIMEOUT).await?;
    ensure!(!exit.success(), "{exit:?}");
    let err = two.stderr();
    ensure!(
        err.contains("9 attention heads do not divide by 2")
            && err.contains("sizes that work: [1, 3]"),
        "{err}"
    );
    Ok(())
}

/// `ferrite serve --tp 3`: one command starts the gateway and a pool of three rank processes;
/// its answers equal the single-process engine's; SIGTERM drains and stops every rank.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serve_with_three_ranks_answers_like_one() -> Result<()> {
    let _turn = serial().await;
    let args = [
        "serve",
        "--model",
        MODEL,
        "--tp",
        "3",
        "--grpc-listen",
        "127.0.0.1:0",
        "--http-listen",
        "127.0.0.1:0",
        "--kv-cache-mib",
        "200",
        "--cpu-activations",
        "f32",
    ]
    .map(String::from);
    let mut serve = Proc::spawn("serve --tp 3", &ferrite_bin()?, &args)?;
    let lines = serve.wait_ready(WORKER_READY_TIMEOUT).await?;
    let grpc_addr = addr_after(&lines, "gRPC")?;
    let http_addr = addr_after(&lines, "HTTP")?;
    let want = reference::text("The capital of France is", 12).await?;
    let mut client =
        ferrite_proto::v1::inference_client::InferenceClient::new(channel(grpc_addr).await?);
    let got = grpc::generate(&mut client, greedy_text("The capital of France is", 12)).await?;
    ensure!(got.token_ids == want.token_ids, "{got:?} != {want:?}");
    let body = json!({
        "model": MODEL,
        "prompt": "The capital of France is",
        "max_tokens": 12,
        "temperature": 0,
        "ignore_eos": true,
    });
    let r = http::post_json(http_addr, "/v1/completions", &body).await?;
    ensure!(r.status == 200, "{r:?}");
    let v = r.json()?;
    ensure!(
        v["choices"][0]["text"] == want.text.as_str(),
        "{v} != {:?}",
        want.text
    );
    let pids: Vec<u32> = lines
        .iter()
        .find_map(|l| l.split_once("rank pids:"))
        .map(|(_, p)| {
            p.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    ensure!(
        pids.len() == 2,
        "serve printed no pids of ranks 1 and 2: {lines:?}"
    );
    let exit = serve.terminate(Duration::from_secs(30)).await?;
    ensure!(exit.success(), "{exit:?}");
    for pid in pids {
        let alive = std::path::Path::new(&format!("/proc/{pid}")).exists();
        ensure!(!alive, "rank process {pid} outlived serve");
    }
    Ok(())
}
