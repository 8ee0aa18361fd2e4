//! The `multinode` overlay rehearsed: its LeaderWorkerSet expanded into the pods the LWS
//! controller would make (`lws.rs`), every rank a `ferrite worker` process started from its
//! pod's rendered env (the GPU mapped to the CPU: FERRITE_DEVICE=cpu), against the three etcd
//! members. Then:
//!
//! - every pod turns Ready on its declared probes (rank 0 on `ferrite.worker.v1.Worker`, the
//!   other ranks on the server's health), every declared port listens, the PodMonitors scrape;
//! - each group formed one pool named `<set>-<group index>` whose size is the group's, its
//!   rank 0 reached at the leader pod's IP, its collective listener published at the leader
//!   pod's `comm` port, every rank registered from its own pod's IP;
//! - the official `openai` client gets answers through the gateway Service from those
//!   3-rank pools;
//! - a rank pod killed (SIGKILL, as a crash or a lost node would end it) fails its pool: the
//!   group's other ranks exit non-zero, the pool leaves etcd within its lease TTL, the gateways
//!   drop it and the other group serves what comes next; then the group recreated (what LWS
//!   does with `restartPolicy: RecreateGroupOnPodRestart` once the failed ranks' containers
//!   restart) forms the pool again, with a new epoch, and serves;
//! - deleting everything ends every process with exit 0 within its grace period (rank 0
//!   drains and stops its ranks; the ranks wait for that).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use ferrite_cluster_tests::grpc::{self};
use ferrite_cluster_tests::serial;
use ferrite_placement::keys::decode;
use ferrite_placement::{CommRecord, KeySchema, PoolRecord, PoolState, RankRecord, Store};
use ferrite_proto::v1::inference_client::InferenceClient;
use serde_json::Value;

use crate::manifest::{PodPlan, str_at};
use crate::{
    PREFIX, READY_TIMEOUT, Rehearsal, delete_everything, lws, no_probe_problems, openai_answers,
    ports_and_scrapes, print_timings, rehearse, wait_for_ready_pools,
};

const SET: &str = "ferrite-multinode";

/// A container's env value as written (before expansion), for the manifest's own numbers.
fn env_of(pod: &PodPlan, name: &str) -> Option<String> {
    pod.containers().iter().find_map(|c| {
        crate::manifest::array(c, "env")
            .iter()
            .find(|e| str_at(e, "/name") == name)
            .and_then(|e| e.get("value").and_then(Value::as_str).map(str::to_owned))
    })
}

/// What the pool of group `pool` (its leader pod `leader`) left in etcd: the pool record, the
/// collective record, and the rank records by rank.
async fn pool_in_etcd(
    store: &Store,
    pool: &str,
) -> Result<(
    Option<PoolRecord>,
    Option<CommRecord>,
    Vec<(u32, RankRecord)>,
)> {
    let schema = KeySchema::new(PREFIX);
    let mut record = None;
    let mut comm = None;
    let mut ranks = Vec::new();
    for (key, value) in store.get_prefix(&schema.pool(pool)).await? {
        if key == schema.pool(pool) {
            record = Some(decode::<PoolRecord>(&key, &value)?);
        } else if key == schema.nccl(pool) {
            comm = Some(decode::<CommRecord>(&key, &value)?);
        } else if let Some(r) = key
            .strip_prefix(&schema.pool_children_prefix(pool))
            .and_then(|k| k.strip_prefix("ranks/"))
        {
            ranks.push((r.parse()?, decode::<RankRecord>(&key, &value)?));
        }
    }
    ranks.sort_by_key(|(r, _)| *r);
    Ok((record, comm, ranks))
}

/// [`check_pools`], given a few seconds: rank 0 reports SERVING as its registration starts,
/// and the write may land a moment after its pod turned Ready.
async fn pools_formed(store: &Store, groups: &[Vec<PodPlan>]) -> Result<Vec<u64>> {
    let (epochs, _) = ferrite_cluster_tests::wait::until(
        "every group's pool in etcd",
        Duration::from_secs(10),
        || async {
            check_pools(store, groups)
                .await
                .map_err(|e| format!("{e:#}"))
        },
    )
    .await?;
    Ok(epochs)
}

/// Each group's pool is in etcd as the manifests and LWS make it; returns each pool's epoch.
async fn check_pools(store: &Store, groups: &[Vec<PodPlan>]) -> Result<Vec<u64>> {
    let mut epochs = Vec::new();
    for members in groups {
        let leader = &members[0];
        let pool = &leader.name;
        let size = members.len() as u32;
        let (record, comm, ranks) = pool_in_etcd(store, pool).await?;
        let record = record.with_context(|| format!("no pool {pool} in etcd"))?;
        ensure!(
            record.tp == size && record.state == PoolState::Ready,
            "pool {pool}: {record:?}, expected {size} ranks, Ready"
        );
        ensure!(
            record.leader_addr == format!("http://{}:50061", leader.ip),
            "pool {pool}: rank 0 registered at {}, not at its pod IP {}",
            record.leader_addr,
            leader.ip
        );
        let comm = comm.with_context(|| format!("no collective record for {pool}"))?;
        let comm_port = leader
            .containers()
            .iter()
            .find_map(|c| PodPlan::resolve_port(c, &"comm".into()).ok())
            .context("the leader declares no comm port")?;
        ensure!(
            comm.world == size && comm.address == format!("{}:{comm_port}", leader.ip),
            "pool {pool}: collective record {comm:?}, expected {size} ranks at {}:{comm_port}",
            leader.ip
        );
        let registered: Vec<u32> = ranks.iter().map(|(r, _)| *r).collect();
        ensure!(
            registered == (0..size).collect::<Vec<_>>(),
            "pool {pool}: ranks {registered:?} registered"
        );
        for (rank, r) in &ranks {
            let pod = &members[*rank as usize];
            ensure!(
                r.addr.starts_with(&format!("http://{}:", pod.ip)),
                "pool {pool} rank {rank} registered at {}, not at its pod {}'s IP {}",
                r.addr,
                pod.name,
                pod.ip
            );
        }
        epochs.push(comm.epoch);
    }
    Ok(epochs)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn multinode_overlay_rehearsed() -> Result<()> {
    let _turn = serial().await;
    let Rehearsal {
        mut cluster,
        receiver: _receiver,
    } = rehearse("overlays/multinode").await?;
    let owner = format!("LeaderWorkerSet/{SET}");
    let members = cluster.plan.pods_of(&owner);
    ensure!(!members.is_empty(), "no pods of {owner}");
    let group_count = members
        .iter()
        .filter(|p| p.labels.get(lws::WORKER_INDEX).map(String::as_str) == Some("0"))
        .count() as u64;
    let groups: Vec<Vec<PodPlan>> = (0..group_count)
        .map(|g| {
            lws::group_of(&cluster.plan.pods, SET, g)
                .into_iter()
                .cloned()
                .collect()
        })
        .collect();
    let size = groups[0].len();
    ensure!(
        group_count >= 2 && size >= 2,
        "{owner}: {group_count} groups of {size}: the rehearsal needs 2 pools of 2 ranks or more"
    );
    let lease_ttl = Duration::from_secs(
        env_of(&groups[0][0], "FERRITE_LEASE_TTL_S")
            .context("the leader sets no FERRITE_LEASE_TTL_S")?
            .parse()?,
    );

    let etcd = cluster.service_addr("ferrite-etcd", 2379)?;
    let store = Store::connect(&[format!("http://{etcd}")], PREFIX).await?;
    let epochs = pools_formed(&store, &groups).await?;
    eprintln!(
        "{group_count} pools of {size} ranks formed through etcd: {}",
        groups
            .iter()
            .map(|g| g[0].name.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    let gateway_grpc = cluster.service_addr("ferrite-gateway", 50051)?;
    let gateway_http = cluster.service_addr("ferrite-gateway", 80)?;
    wait_for_ready_pools(gateway_grpc, group_count as u32, Duration::from_secs(30)).await?;
    ports_and_scrapes(&cluster).await?;
    openai_answers(gateway_http).await?;

    // A rank of group 0 dies.
    let victim = groups[0][size - 1].name.clone();
    let survivors: Vec<String> = groups[0]
        .iter()
        .map(|p| p.name.clone())
        .filter(|n| *n != victim)
        .collect();
    let pool = groups[0][0].name.clone();
    let killed = Instant::now();
    cluster.kill(&victim).await?;
    // Rank 0 notices and deregisters the pool at once: the pool record goes first (what the
    // gateways route by), then the ranks it leads exit non-zero (a failure, so the kubelet
    // restarts them and LWS recreates the group); the dead rank's own key goes with its lease.
    ferrite_cluster_tests::wait::until(
        &format!("pool {pool}'s record to leave etcd"),
        lease_ttl,
        || async {
            match pool_in_etcd(&store, &pool).await {
                Ok((None, _, _)) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let deregistered_after = killed.elapsed();
    let exits = cluster
        .wait_exited(&survivors, Duration::from_secs(30))
        .await?;
    for (pod, container, status, success) in &exits {
        ensure!(
            !success,
            "pod {pod} container {container} exited {status} after its pool lost a rank: \
             not a failure, so no restart would re-form the group"
        );
    }
    let failed_after = killed.elapsed();
    ferrite_cluster_tests::wait::until(
        &format!("every key of pool {pool} to leave etcd within the lease TTL"),
        // The TTL from the kill, and etcd's expiry sweep (it revokes expired leases in
        // passes, later on a loaded machine).
        lease_ttl.saturating_sub(killed.elapsed()) + Duration::from_secs(3),
        || async {
            match pool_in_etcd(&store, &pool).await {
                Ok((None, None, r)) if r.is_empty() => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let gone_after = killed.elapsed();
    wait_for_ready_pools(
        gateway_grpc,
        group_count as u32 - 1,
        Duration::from_secs(15),
    )
    .await?;
    for other in groups[1..].iter().flatten() {
        ensure!(
            cluster.all_running(&other.name)?,
            "pod {} of another group stopped",
            other.name
        );
    }
    let channel = ferrite_cluster_tests::cluster::channel(gateway_grpc).await?;
    let mut client = InferenceClient::new(channel);
    for i in 0..3 {
        let c = grpc::generate(&mut client, grpc::greedy_text("The sky is", 4))
            .await
            .with_context(|| format!("request {i} after pool {pool} failed"))?;
        ensure!(c.token_ids.len() == 4, "{c:?}");
    }
    eprintln!(
        "rank pod {victim} killed: pool {pool} deregistered after {:.2} s, its other ranks exited \
         non-zero after {:.2} s, its last key (the dead rank's) expired after {:.2} s (lease TTL \
         {} s); the other pool served",
        deregistered_after.as_secs_f64(),
        failed_after.as_secs_f64(),
        gone_after.as_secs_f64(),
        lease_ttl.as_secs()
    );

    // RecreateGroupOnPodRestart: the group's pods deleted and created anew.
    let group: Vec<String> = groups[0].iter().map(|p| p.name.clone()).collect();
    cluster.recreate(&group).await?;
    cluster.wait_all_ready(READY_TIMEOUT).await?;
    print_timings(
        &format!("group {pool} recreated (RecreateGroupOnPodRestart): pod start → Ready"),
        &cluster,
        Some(&group),
    );
    let again = pools_formed(&store, &groups[..1]).await?;
    ensure!(
        again[0] != epochs[0],
        "pool {pool} re-formed with the old epoch {}",
        epochs[0]
    );
    wait_for_ready_pools(gateway_grpc, group_count as u32, Duration::from_secs(30)).await?;
    for i in 0..2 {
        let c = grpc::generate(&mut client, grpc::greedy_text("After the re-forming:", 6))
            .await
            .with_context(|| format!("request {i} after pool {pool} re-formed"))?;
        ensure!(c.token_ids.len() == 6, "{c:?}");
    }

    no_probe_problems(&cluster)?;
    delete_everything(&mut cluster).await
}
