//! The `gpu-tp` overlay rehearsed: its pool pod runs `ferrite serve --tp N` from its rendered
//! env (the GPUs mapped to the CPU: FERRITE_DEVICE=cpu), which starts ranks 1..N itself. Then:
//! the pod turns Ready on its declared probes, every declared port listens, the PodMonitors
//! scrape its `/metrics`; its pool registers in the cluster's etcd under the pod's name with N
//! ranks, rank 0 reached at the pod IP's worker port; the shared gateways route to it (the
//! official `openai` client through the gateway Service), and the pod's own OpenAI port (the
//! Inference Extension example's target) answers; deleting everything ends every process with
//! exit 0 within its grace period (serve drains, then stops its ranks).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use ferrite_cluster_tests::{MODEL, http, serial};
use ferrite_placement::keys::decode;
use ferrite_placement::{KeySchema, PoolRecord, PoolState, Store};

use crate::manifest::{PodPlan, str_at};
use crate::{
    PREFIX, Rehearsal, delete_everything, no_probe_problems, openai_answers, ports_and_scrapes,
    rehearse, wait_for_ready_pools,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn gpu_tp_overlay_rehearsed() -> Result<()> {
    let _turn = serial().await;
    let Rehearsal {
        mut cluster,
        receiver: _receiver,
    } = rehearse("overlays/gpu-tp").await?;
    let pod = cluster
        .plan
        .pods_of("Deployment/ferrite-pool-tp")
        .first()
        .copied()
        .cloned()
        .context("no pod of Deployment/ferrite-pool-tp")?;
    let container = pod
        .containers()
        .into_iter()
        .find(|c| str_at(c, "/args/0") == "serve")
        .context("the pool pod runs no `ferrite serve`")?;
    let tp: u32 = crate::manifest::array(&container, "env")
        .iter()
        .find(|e| str_at(e, "/name") == "FERRITE_TP")
        .map(|e| str_at(e, "/value").parse())
        .context("the pool sets no FERRITE_TP")??;
    ensure!(tp > 1, "FERRITE_TP={tp}: no tensor parallelism to rehearse");

    // The pool in etcd: the pod's name, N ranks, rank 0 at the pod IP's worker port.
    let etcd = cluster.service_addr("ferrite-etcd", 2379)?;
    let store = Store::connect(&[format!("http://{etcd}")], PREFIX).await?;
    let schema = KeySchema::new(PREFIX);
    let key = schema.pool(&pod.name);
    let worker_port = PodPlan::resolve_port(&container, &"grpc".into())?;
    // The pod is Ready once its own gateway half serves; the pool and its ranks register in
    // the cluster's etcd as soon as that is reachable (its members may turn Ready later).
    let found = ferrite_cluster_tests::wait::until(
        &format!("pool {} and its {tp} ranks to register in etcd", pod.name),
        Duration::from_secs(30),
        || async {
            let entries = store
                .get_prefix(&schema.pool(&pod.name))
                .await
                .map_err(|e| e.to_string())?;
            let keys: Vec<&String> = entries.iter().map(|(k, _)| k).collect();
            let ranks = (0..tp)
                .filter(|r| keys.contains(&&schema.rank(&pod.name, *r)))
                .count();
            match entries.iter().find(|(k, _)| *k == key) {
                Some((k, v)) if ranks == tp as usize => {
                    decode::<PoolRecord>(k, v).map_err(|e| e.to_string())
                }
                _ => Err(format!("{keys:?}")),
            }
        },
    )
    .await;
    let (record, _) = match found {
        Ok(f) => f,
        Err(e) => {
            let report = cluster.report(&pod.name).await;
            anyhow::bail!("{e:#}\n{report}");
        }
    };
    ensure!(
        record.tp == tp
            && record.state == PoolState::Ready
            && record.leader_addr == format!("http://{}:{worker_port}", pod.ip),
        "pool {}: {record:?}; expected {tp} ranks, Ready, rank 0 at http://{}:{worker_port}",
        pod.name,
        pod.ip
    );
    eprintln!(
        "pool {} of {tp} ranks (one `ferrite serve` pod) registered in the cluster's etcd",
        pod.name
    );

    let gateway_grpc = cluster.service_addr("ferrite-gateway", 50051)?;
    let gateway_http = cluster.service_addr("ferrite-gateway", 80)?;
    wait_for_ready_pools(gateway_grpc, 1, Duration::from_secs(30)).await?;
    ports_and_scrapes(&cluster).await?;
    openai_answers(gateway_http).await?;
    // The pod's own OpenAI-compatible port, where an InferencePool sends requests.
    let http_port = PodPlan::resolve_port(&container, &"http".into())?;
    let own = std::net::SocketAddr::new(std::net::IpAddr::V4(pod.ip), http_port);
    let models = http::get(own, "/v1/models").await?;
    ensure!(
        models.status == 200 && models.json()?.to_string().contains(MODEL),
        "GET /v1/models on the pool pod's http port: {models:?}"
    );

    no_probe_problems(&cluster)?;
    delete_everything(&mut cluster).await
}
