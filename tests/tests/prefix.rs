//! Prefix caching and KV-aware routing across pools: a real etcd, two `ferrite worker` pools and
//! `ferrite gateway` processes.
//!
//! After every prefix was sent once (warming), requests for each of 4 long prefixes go through
//! two `--routing kv` gateways to the pool that holds it (hit rate ≥ 0.9, from the usage's
//! cached tokens), while a `--routing p2c` gateway sends them to either pool; a restarted kv
//! gateway rebuilds its index from the pools' snapshots and hits at once; killing the pool
//! that holds a prefix sends its requests to the other pool with no error, which then holds
//! it. A repeated prompt gives the same tokens cold and cached, and the OpenAI API reports the
//! cached tokens in `usage.prompt_tokens_details`.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use ferrite_cluster_tests::cluster::{DISCOVERY_TIMEOUT, channel};
use ferrite_cluster_tests::grpc::{self, greedy_ids};
use ferrite_cluster_tests::{Cluster, GatewayProc, WorkerOptions, WorkerProc, http, serial, wait};
use ferrite_proto::prefix::{self, BlockHash};
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::worker::v1::WatchKvCacheRequest;
use serde_json::json;

/// Tokens of each shared prefix: 20 blocks of 16.
const PREFIX_TOKENS: usize = 320;
const PREFIXES: u64 = 4;
/// Measured requests per prefix in each phase.
const ROUNDS: u64 = 3;

/// Pseudo-random token ids (xorshift), away from the special tokens at the vocabulary's ends.
fn tokens(seed: u64, n: usize) -> Vec<u32> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            100 + (x % 48_000) as u32
        })
        .collect()
}

/// `prefix` and a distinct 8-token ending.
fn with_suffix(prefix: &[u32], seed: u64) -> Vec<u32> {
    let mut p = prefix.to_vec();
    p.extend(tokens(seed, 8));
    p
}

#[derive(Debug)]
struct Outcome {
    prompt_tokens: u32,
    cached_tokens: u32,
    token_ids: Vec<u32>,
}

/// One greedy 4-token request through the gateway at `addr`; it must succeed.
async fn ask(addr: SocketAddr, ids: Vec<u32>) -> Result<Outcome> {
    let mut client = InferenceClient::new(channel(addr).await?);
    let c = grpc::generate(&mut client, greedy_ids(ids, 4))
        .await
        .with_context(|| format!("a request through the gateway at {addr}"))?;
    let usage = c.finish.and_then(|f| f.usage).context("no usage")?;
    Ok(Outcome {
        prompt_tokens: usage.prompt_tokens,
        cached_tokens: usage.prompt_tokens_details.map_or(0, |d| d.cached_tokens),
        token_ids: c.token_ids,
    })
}

fn hit_rate(outs: &[Outcome]) -> f64 {
    let cached: u32 = outs.iter().map(|o| o.cached_tokens).sum();
    let prompt: u32 = outs.iter().map(|o| o.prompt_tokens).sum();
    f64::from(cached) / f64::from(prompt.max(1))
}

/// Blocks the gateway's index holds for each pool, from its `/metrics`.
async fn index_blocks(gateway: &GatewayProc) -> Result<Vec<(String, f64)>> {
    let body = http::get(gateway.http, "/metrics").await?.body;
    Ok(body
        .lines()
        .filter_map(|l| l.strip_prefix("ferrite_gateway_kv_index_blocks{pool=\""))
        .filter_map(|l| {
            let (pool, rest) = l.split_once("\"}")?;
            Some((pool.to_owned(), rest.trim().parse().ok()?))
        })
        .collect())
}

/// Waits until `gateway`'s index holds at least `blocks` blocks in all (over every pool).
async fn wait_for_index(gateway: &GatewayProc, blocks: f64) -> Result<()> {
    let what = format!("the gateway's KV index to hold {blocks} blocks");
    wait::until(&what, Duration::from_secs(15), || async {
        match index_blocks(gateway).await {
            Ok(v) if v.iter().map(|(_, b)| b).sum::<f64>() >= blocks => Ok(()),
            Ok(v) => Err(format!("{v:?}")),
            Err(e) => Err(format!("{e:#}")),
        }
    })
    .await
    .map(|_| ())
}

/// Whether `worker`'s prefix cache (its stream's snapshot) holds the first block of `prompt`.
async fn holds(worker: &WorkerProc, prompt: &[u32]) -> Result<bool> {
    let mut client = worker.client().await?;
    let mut stream = client
        .watch_kv_cache(WatchKvCacheRequest {})
        .await?
        .into_inner();
    let first = stream.message().await?.context("no snapshot")?;
    anyhow::ensure!(first.reset, "the stream starts with a snapshot");
    let seed = BlockHash::from_bytes(&first.hash_seed).context("a seed")?;
    let chain = prefix::chain(seed, first.block_size as usize, prompt);
    let want = chain.first().context("a full block")?.to_bytes();
    Ok(first.stored.iter().any(|h| h[..] == want[..]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_routing_sends_each_prefix_to_the_pool_that_holds_it() -> Result<()> {
    let _turn = serial().await;
    // The cluster's own gateway routes by KV (the default); a second one too, and a third by
    // power of two choices.
    let mut cluster = Cluster::start(&["a", "b"], WorkerOptions::default()).await?;
    let endpoint = cluster.etcd.endpoint();
    let p2c_env = [("FERRITE_ROUTING".to_owned(), "p2c".to_owned())];
    let p2c = GatewayProc::ready(GatewayProc::spawn_with_env(&endpoint, &p2c_env)?).await?;
    let kv2 = GatewayProc::ready(GatewayProc::spawn(&endpoint)?).await?;
    for gateway in [&p2c, &kv2] {
        gateway.wait_for_ready_pools(2, DISCOVERY_TIMEOUT).await?;
    }
    let blocks_per_prefix = (PREFIX_TOKENS / 16) as f64;

    // p2c: warm each prefix once, then send it again with distinct endings.
    let p2c_prefixes: Vec<Vec<u32>> = (0..PREFIXES)
        .map(|k| tokens(100 + k, PREFIX_TOKENS))
        .collect();
    for p in &p2c_prefixes {
        ask(p2c.grpc, with_suffix(p, 1)).await?;
    }
    let mut p2c_outs = Vec::new();
    for round in 0..ROUNDS {
        for (k, p) in p2c_prefixes.iter().enumerate() {
            p2c_outs.push(ask(p2c.grpc, with_suffix(p, 10 + round * 10 + k as u64)).await?);
        }
    }

    // kv: new prefixes, warmed through the first kv gateway; once both kv gateways' indexes
    // hold them (from the pools' events), the requests alternate between the two.
    let kv_prefixes: Vec<Vec<u32>> = (0..PREFIXES)
        .map(|k| tokens(200 + k, PREFIX_TOKENS))
        .collect();
    let mut warm = Vec::new();
    for p in &kv_prefixes {
        warm.push(ask(cluster.gateway.grpc, with_suffix(p, 2)).await?);
    }
    assert!(
        warm.iter().all(|o| o.cached_tokens == 0),
        "fresh prefixes: {warm:?}"
    );
    let all_blocks = blocks_per_prefix * (2 * PREFIXES) as f64;
    wait_for_index(&cluster.gateway, all_blocks).await?;
    wait_for_index(&kv2, all_blocks).await?;
    let mut kv_outs = Vec::new();
    for round in 0..ROUNDS {
        for (k, p) in kv_prefixes.iter().enumerate() {
            let gw = if k % 2 == 0 { &cluster.gateway } else { &kv2 };
            kv_outs.push(ask(gw.grpc, with_suffix(p, 20 + round * 10 + k as u64)).await?);
        }
    }
    let (kv_rate, p2c_rate) = (hit_rate(&kv_outs), hit_rate(&p2c_outs));
    eprintln!("hit rate after warming: kv {kv_rate:.3}, p2c {p2c_rate:.3}");
    for o in &kv_outs {
        assert!(
            o.cached_tokens as usize >= PREFIX_TOKENS,
            "every kv request hits: {o:?}"
        );
    }
    assert!(kv_rate >= 0.9, "kv hit rate {kv_rate}");
    assert!(kv_rate > p2c_rate, "kv {kv_rate} against p2c {p2c_rate}");

    // The same prompt again: a full hit gives the tokens the cold request gave.
    let again = ask(kv2.grpc, with_suffix(&kv_prefixes[0], 2)).await?;
    assert_eq!(again.token_ids, warm[0].token_ids);
    assert!(again.cached_tokens as usize >= PREFIX_TOKENS);

    // OpenAI: the cached tokens in the usage.
    let body = json!({ "model": ferrite_cluster_tests::MODEL, "max_tokens": 2,
        "prompt": with_suffix(&kv_prefixes[1], 3), "temperature": 0 });
    let usage = http::post_json(kv2.http, "/v1/completions", &body)
        .await?
        .json()?["usage"]
        .clone();
    let cached = usage["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or(0);
    assert!(cached as usize >= PREFIX_TOKENS, "{usage}");

    // A restarted gateway rebuilds its index from the pools' snapshots and hits at once.
    cluster.gateway.proc.kill_hard().await?;
    let restarted = GatewayProc::ready(GatewayProc::spawn(&endpoint)?).await?;
    restarted.wait_for_ready_pools(2, DISCOVERY_TIMEOUT).await?;
    wait_for_index(&restarted, all_blocks).await?;
    for (k, p) in kv_prefixes.iter().enumerate() {
        let o = ask(restarted.grpc, with_suffix(p, 70 + k as u64)).await?;
        assert!(
            o.cached_tokens as usize >= PREFIX_TOKENS,
            "after a restart: {o:?}"
        );
    }

    // Kill the pool holding the first kv prefix: requests for every prefix still succeed (the
    // gateway retries before the first token), and the other pool takes over the victim's
    // prefixes (its second round hits there).
    let mut victim = None;
    for w in &cluster.workers {
        if holds(w, &kv_prefixes[0]).await? {
            victim = Some(w.pool.clone());
        }
    }
    let Some(victim) = victim else {
        bail!("no pool holds the first prefix");
    };
    let survivor = if victim == "a" { "b" } else { "a" };
    let moved: Vec<usize> = {
        let mut v = Vec::new();
        for (k, p) in kv_prefixes.iter().enumerate() {
            if !holds(cluster.worker(survivor), p).await? {
                v.push(k);
            }
        }
        v
    };
    cluster.worker_mut(&victim).proc.kill_hard().await?;
    for round in 0..2u64 {
        for (k, p) in kv_prefixes.iter().enumerate() {
            let gw = if k % 2 == 0 { &restarted } else { &kv2 };
            let o = ask(gw.grpc, with_suffix(p, 90 + round * 10 + k as u64)).await?;
            if round == 1 {
                assert!(
                    o.cached_tokens as usize >= PREFIX_TOKENS,
                    "prefix {k} (moved from {victim}: {}) is held by {survivor} now: {o:?}",
                    moved.contains(&k)
                );
            }
        }
    }
    assert!(
        moved.contains(&0),
        "the victim's prefix was not on {survivor}"
    );
    Ok(())
}
