//! Faults: a worker killed mid-stream, an etcd outage, a crowd of clients that cancel
//! mid-stream, clients that give up while their request is being queued, and a model whose
//! pool comes back with another tokenizer.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use ferrite_cluster_tests::cluster::DISCOVERY_TIMEOUT;
use ferrite_cluster_tests::grpc::{self, greedy_text};
use ferrite_cluster_tests::{Cluster, MODEL, WorkerOptions, WorkerProc, serial, wait};
use ferrite_placement::PoolState;
use ferrite_proto::v1::generate_response::Event;
use tokio::sync::{Barrier, watch};
use tonic::Code;

/// The lease TTL of the fault tests' workers (etcd's minimum is 2 s).
const LEASE_TTL: Duration = Duration::from_secs(3);

fn options() -> WorkerOptions {
    WorkerOptions {
        lease_ttl_s: LEASE_TTL.as_secs(),
        ..WorkerOptions::default()
    }
}

/// A short request that must succeed.
async fn short_request(cluster: &Cluster, what: &str) -> Result<()> {
    let mut client = cluster.inference().await?;
    let c = grpc::generate(&mut client, greedy_text("The sky is", 4))
        .await
        .with_context(|| what.to_owned())?;
    anyhow::ensure!(c.token_ids.len() == 4, "{what}: {c:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_worker_fails_its_stream_and_leaves_etcd_within_the_lease() -> Result<()> {
    let _turn = serial().await;
    let mut cluster = Cluster::start(&["a", "b"], options()).await?;
    let mut client = cluster.inference().await?;
    let mut stream = client
        .generate(greedy_text("Write a very long essay about the sea.", 1500))
        .await?
        .into_inner();
    stream.message().await?.context("no first message")?;

    let victim = cluster
        .pool_running_a_request(Duration::from_secs(5))
        .await?;
    let survivor = if victim == "a" { "b" } else { "a" };
    let store = cluster.store().await?;
    for w in &cluster.workers {
        let record = cluster
            .pool_record(&store, &w.pool)
            .await?
            .with_context(|| format!("no record of pool {}", w.pool))?;
        assert_eq!(record.model, MODEL, "{record:?}");
        assert_eq!(record.state, PoolState::Ready, "{record:?}");
        assert_eq!(record.tp, 1, "{record:?}");
        assert_eq!(
            record.leader_addr,
            format!("http://{}", w.addr),
            "{record:?}"
        );
        let keys = cluster.pool_keys(&store, &w.pool).await?;
        let rank = cluster.schema().rank(&w.pool, 0);
        assert!(keys.contains(&rank), "{rank} missing: {keys:?}");
    }

    let killed = Instant::now();
    cluster.worker_mut(&victim).proc.kill_hard().await?;

    let failed = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => {}
                Ok(None) => return Err("the stream ended without an error".to_owned()),
                Err(status) => return Ok(status),
            }
        }
    })
    .await
    .map_err(|_| anyhow::anyhow!("no error on the stream 2 s after the kill of {victim}"))?
    .map_err(anyhow::Error::msg)?;
    assert_eq!(failed.code(), Code::Unavailable, "{failed:?}");
    let failed_after = killed.elapsed();
    assert!(
        failed_after < Duration::from_secs(2),
        "UNAVAILABLE after {failed_after:?}"
    );

    // Meanwhile: the victim's keys expire with its lease, and new requests succeed (on the
    // survivor; the gateway may still list the victim until its lease ends).
    let keys_gone = wait::until(
        "the killed worker's keys to expire",
        LEASE_TTL + Duration::from_secs(1),
        || async {
            match cluster.pool_keys(&store, &victim).await {
                Ok(left) if left.is_empty() => Ok(()),
                Ok(left) => Err(format!("still there: {left:?}")),
                Err(e) => Err(format!("etcd: {e:#}")),
            }
        },
    );
    let requests = async {
        for i in 0..5 {
            short_request(&cluster, &format!("request {i} after the kill")).await?;
        }
        Ok::<_, anyhow::Error>(())
    };
    let ((_, gone), ()) = tokio::try_join!(keys_gone, requests)?;
    let gone_after = killed.elapsed();
    assert!(
        gone_after <= LEASE_TTL + Duration::from_secs(1),
        "keys gone only {gone_after:?} after the kill ({gone:?})"
    );

    eprintln!(
        "killed pool {victim}: UNAVAILABLE after {failed_after:?}, keys gone after {gone_after:?}"
    );
    let survivor = cluster.pool_record(&store, survivor).await?;
    assert_eq!(
        survivor.map(|r| r.state),
        Some(PoolState::Ready),
        "the survivor's record"
    );
    cluster.wait_for_ready_pools(1, DISCOVERY_TIMEOUT).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_outage_keeps_serving_and_a_pool_started_during_it_is_found_after() -> Result<()> {
    const OUTAGE: Duration = Duration::from_secs(10);
    let _turn = serial().await;
    let mut cluster = Cluster::start(&["a", "b"], options()).await?;

    tokio::task::block_in_place(|| cluster.etcd.stop());
    let outage = Instant::now();
    let c_proc = WorkerProc::spawn(&cluster.etcd.endpoint(), "c", &cluster.options)?;
    let mut served = 0;
    while outage.elapsed() < OUTAGE {
        short_request(
            &cluster,
            &format!("request {served} during the etcd outage"),
        )
        .await?;
        served += 1;
    }
    assert!(served >= 5, "only {served} requests in {OUTAGE:?}");

    tokio::task::block_in_place(|| cluster.etcd.restart());
    let back = Instant::now();
    let c = WorkerProc::ready("c", c_proc).await?;
    cluster.workers.push(c);
    let found = cluster.wait_for_ready_pools(3, DISCOVERY_TIMEOUT).await?;
    let found_after = back.elapsed();
    eprintln!(
        "{served} requests served during the {OUTAGE:?} outage; pool c listed {found_after:?} after etcd returned"
    );
    assert!(
        found_after < Duration::from_secs(10),
        "3 pools listed {found_after:?} after etcd returned ({found:?} of waiting)"
    );

    // Drain a and b (SIGTERM: exit 0, keys revoked at once): the requests can only land on c.
    let store = cluster.store().await?;
    for pool in ["a", "b"] {
        let status = cluster
            .worker_mut(pool)
            .proc
            .terminate(Duration::from_secs(20))
            .await?;
        assert!(
            status.success(),
            "worker {pool} exited with {status} after SIGTERM"
        );
        let left = cluster.pool_keys(&store, pool).await?;
        assert!(
            left.is_empty(),
            "pool {pool} drained and exited but left {left:?} in etcd"
        );
    }
    cluster
        .wait_for_ready_pools(1, Duration::from_secs(5))
        .await?;
    for i in 0..3 {
        short_request(&cluster, &format!("request {i} with only pool c left")).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_cancelled_streams_free_every_kv_block() -> Result<()> {
    const CLIENTS: usize = 100;
    let _turn = serial().await;
    let options = WorkerOptions {
        max_num_seqs: Some(128),
        kv_cache_mib: 512,
        ..options()
    };
    let cluster = Cluster::start(&["a", "b"], options).await?;
    let started = Instant::now();

    // Each client reads its first token, reports at the barrier, and drops its stream on `release`.
    let barrier = Arc::new(Barrier::new(CLIENTS + 1));
    let (release, released) = watch::channel(false);
    let mut connections = Vec::new();
    for _ in 0..4 {
        connections.push(cluster.inference().await?);
    }
    let mut clients = Vec::new();
    for i in 0..CLIENTS {
        let mut client = connections[i % connections.len()].clone();
        let barrier = barrier.clone();
        let mut released = released.clone();
        clients.push(tokio::spawn(async move {
            let first = async {
                let mut stream = client
                    .generate(greedy_text(&format!("Count to {i}:"), 1000))
                    .await?
                    .into_inner();
                match stream.message().await?.and_then(|m| m.event) {
                    Some(Event::Delta(_)) => Ok(stream),
                    other => bail!("client {i}: first message {other:?}"),
                }
            };
            let result = first.await;
            barrier.wait().await;
            let stream = result?;
            let _ = released.wait_for(|r| *r).await;
            drop(stream);
            Ok::<_, anyhow::Error>(())
        }));
    }
    tokio::time::timeout(Duration::from_secs(120), barrier.wait())
        .await
        .context("100 clients did not all get a first token within 120 s")?;
    let all_streaming = started.elapsed();

    let mut used = 0;
    let mut running = 0;
    for w in &cluster.workers {
        let l = w.load().await?;
        used += l.kv_blocks_used;
        // A sequence preempted for KV space waits again: count it too.
        running += l.running + l.waiting;
    }
    assert!(used > 0, "no KV blocks in use with {CLIENTS} open streams");
    assert_eq!(
        running as usize, CLIENTS,
        "running or waiting sequences with {CLIENTS} open streams"
    );

    release.send_replace(true);
    for c in clients {
        c.await??;
    }
    let (_, took) = wait::until(
        "every KV block to be free",
        Duration::from_secs(5),
        || async {
            let mut loads = Vec::new();
            for w in &cluster.workers {
                match w.load().await {
                    Ok(l) => loads.push(l),
                    Err(e) => return Err(format!("GetLoad: {e:#}")),
                }
            }
            if loads
                .iter()
                .all(|l| l.kv_blocks_used == 0 && l.running == 0 && l.waiting == 0)
            {
                Ok(())
            } else {
                Err(format!("{loads:?}"))
            }
        },
    )
    .await?;
    eprintln!(
        "{CLIENTS} streams open after {all_streaming:?} ({used} KV blocks); all freed {took:?} after the cancel"
    );
    Ok(())
}

/// Clients that give up while their request is being queued (a pool busy with one long
/// request, one sequence at a time): every such request must leave the worker's queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_cancelled_while_queued_leave_the_queue() -> Result<()> {
    const CLIENTS: u64 = 12;
    let _turn = serial().await;
    let options = WorkerOptions {
        max_num_seqs: Some(1),
        max_waiting: Some(64),
        ..options()
    };
    let cluster = Cluster::start(&["q"], options).await?;
    let worker = cluster.worker("q");
    let mut client = cluster.inference().await?;
    let mut running = client
        .generate(greedy_text("Tell me a long story.", 1500))
        .await?
        .into_inner();
    running.message().await?.context("no first message")?;

    // Give up after 2, 4, … ms: some while the gateway forwards, some while the worker admits
    // the request into its queue, some after it waits there.
    for i in 0..CLIENTS {
        let mut c = client.clone();
        let give_up = Duration::from_millis(2 * (i + 1));
        let call = c.generate(greedy_text(&format!("Queued {i}."), 4));
        let outcome = tokio::time::timeout(give_up, call).await;
        anyhow::ensure!(
            outcome.is_err(),
            "request {i} was answered within {give_up:?}: {outcome:?}"
        );
    }
    let (_, took) = wait::until(
        "the cancelled requests to leave the queue",
        Duration::from_secs(3),
        || async {
            match worker.load().await {
                Ok(l) if l.running == 1 && l.waiting == 0 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    eprintln!("{CLIENTS} cancelled queued requests gone {took:?} after the last cancel");
    drop(running);
    Ok(())
}

/// The ids the gateway tokenizes `text` into for [`MODEL`].
async fn gateway_ids(cluster: &Cluster, text: &str) -> Result<Vec<u32>> {
    use ferrite_proto::v1::TokenizeRequest;
    use ferrite_proto::v1::tokenize_request::Input;
    let mut client = cluster.inference().await?;
    let req = TokenizeRequest {
        model: MODEL.into(),
        input: Some(Input::Text(text.into())),
        add_special_tokens: Some(false),
    };
    Ok(client.tokenize(req).await?.into_inner().token_ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_back_with_another_tokenizer_is_tokenized_anew() -> Result<()> {
    let _turn = serial().await;
    let mut cluster = Cluster::start(&["a"], options()).await?;
    let text = "Hello world";
    let before = gateway_ids(&cluster, text).await?;
    short_request(&cluster, "the first pool").await?;
    cluster.worker_mut("a").proc.kill_hard().await?;
    wait::until("the gateway to drop pool a", LEASE_TTL * 4, || async {
        match cluster.model_entry().await {
            Ok(None) => Ok(()),
            other => Err(format!("still listed: {other:?}")),
        }
    })
    .await?;
    // The same model name, now served by a model with a byte-level tokenizer of 256 ids.
    let byte_level =
        ferrite_cluster_tests::workspace_root().join("tests/fixtures/models/qwen2/model.gguf");
    let opts = WorkerOptions {
        model_file: Some(byte_level),
        ..options()
    };
    let b = WorkerProc::start(&cluster.etcd.endpoint(), "b", &opts).await?;
    cluster.workers.push(b);
    cluster.wait_for_ready_pools(1, DISCOVERY_TIMEOUT).await?;
    let after = gateway_ids(&cluster, text).await?;
    assert_eq!(
        after,
        text.bytes().map(u32::from).collect::<Vec<_>>(),
        "before: {before:?}"
    );
    // Tokenized under the old tokenizer, this would name ids outside the new vocabulary.
    short_request(&cluster, "the pool with the new tokenizer").await
}
