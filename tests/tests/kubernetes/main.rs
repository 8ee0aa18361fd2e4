//! The Kubernetes deployment (deploy/kubernetes) rehearsed without a cluster: an overlay is
//! rendered with `kubectl kustomize`, and every container of it is started as a local process
//! from exactly its rendered `command`/`args`/`env` (see `rehearsal.rs` for how names,
//! addresses and volumes map to this machine, `lws.rs` for how a LeaderWorkerSet becomes
//! pods). Then, as a cluster would judge it, for the `cpu` overlay:
//!
//! - every probe, as declared (gRPC health service names, HTTP paths, named ports), passes:
//!   each pod turns Ready, no liveness probe fails; every declared port listens, and every
//!   PodMonitor endpoint answers;
//! - the gateway Service (its gRPC port, and its HTTP port 80 → `http`) lists both worker
//!   pools (named after their pods) and answers the official `openai` Python client;
//! - the workers' and gateways' start-up traces reach the collector through its Service;
//! - deleting a worker pod (SIGTERM, then the manifest's grace period) drains it: the requests
//!   in flight finish whole, the process exits 0 within the grace period, its pool leaves
//!   etcd, and the other pool serves what comes next;
//! - deleting every pod ends every process with exit 0 within its grace period.
//!
//! The `multinode` overlay (a LeaderWorkerSet of tensor-parallel pools) and the `gpu-tp` overlay
//! (`ferrite serve --tp 3` in one pod) are rehearsed the same way, their GPUs mapped to the CPU
//! (`multinode.rs`, `gpu_tp.rs`).
//!
//! So a flag, variable, port or path renamed on one side (binary or manifests) fails here.
//! It also checks that every FERRITE_* variable the overlays set for `worker`/`gateway`/`serve`
//! is one the binary reads. Needs the tools of tests/kubernetes/tools.sh (tests/run.sh installs
//! them) and the ferrite binary (release build).

mod gpu_tp;
mod lws;
mod manifest;
mod multinode;
mod probe;
mod proxy;
mod rehearsal;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};
use ferrite_cluster_tests::grpc::{self, Completion};
use ferrite_cluster_tests::python::run_client;
use ferrite_cluster_tests::{MODEL, Proc, ferrite_bin, serial, wait, workspace_root};
use ferrite_placement::{KeySchema, Store};
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::v1::{Finish, ListModelsRequest};
use ferrite_proto::worker::v1::GetLoadRequest;
use ferrite_proto::worker::v1::worker_client::WorkerClient;
use ferrite_telemetry::receiver::OtlpReceiver;
use serde_json::Value;

use manifest::{Plan, image_config, str_at};
use rehearsal::{Cluster, Images, Seed};

/// Env var naming the directory of kubectl and the Python with PyYAML (tests/kubernetes/tools.sh).
const TOOLS_ENV: &str = "FERRITE_K8S_TOOLS";
/// How long every pod gets to turn Ready (ferrite loads the small model in seconds; the
/// manifests' own start-up budgets are minutes, for big models on GPUs).
const READY_TIMEOUT: Duration = Duration::from_secs(120);
/// The etcd prefix of the manifests' ferrite-config.
const PREFIX: &str = "/ferrite/v1";

fn tools_bin() -> Result<PathBuf> {
    let dir = std::env::var_os(TOOLS_ENV).map_or_else(
        || workspace_root().join("target/k8s-tools/bin"),
        PathBuf::from,
    );
    anyhow::ensure!(
        dir.join("python").exists() && dir.join("kubectl").exists(),
        "no kubectl and Python with PyYAML in {}: run `bash tests/kubernetes/tools.sh` (tests/run.sh \
         does), or point {TOOLS_ENV} at a directory with both",
        dir.display()
    );
    Ok(dir)
}

/// `kubectl kustomize deploy/kubernetes/<name>`, as JSON objects.
async fn render(name: &str) -> Result<Vec<Value>> {
    let bin = tools_bin()?;
    let script = workspace_root().join("tests/kubernetes/render.py");
    let out = Proc::output(
        format!("render {name}"),
        &bin.join("python"),
        &[script.to_string_lossy().into_owned(), name.to_owned()],
        Duration::from_secs(60),
    )
    .await?;
    serde_json::from_str(&out).context("render.py printed no JSON list")
}

/// The ferrite subcommand and container of every ferrite process container in `objects`.
fn ferrite_containers(plan: &Plan) -> Vec<(String, String, Value)> {
    let mut out = Vec::new();
    for pod in &plan.pods {
        for c in pod.containers() {
            let image = str_at(&c, "/image");
            let sub = c
                .pointer("/args/0")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            if image.starts_with("ferrite")
                && ["worker", "gateway", "serve"].contains(&sub.as_str())
            {
                out.push((pod.owner.clone(), sub, c));
            }
        }
    }
    out
}

/// Variables every ferrite process reads besides its flags' (telemetry, caches).
const PROCESS_VARIABLES: &[&str] = &[
    "FERRITE_LOG",
    "FERRITE_LOG_FORMAT",
    "FERRITE_CACHE_DIR",
    "FERRITE_KERNEL_CACHE",
];

/// The overlays with ferrite containers of their own.
const OVERLAYS: &[&str] = &[
    "overlays/cpu",
    "overlays/gpu",
    "overlays/gpu-tp",
    "overlays/multinode",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn overlays_set_only_variables_the_binary_reads() -> Result<()> {
    let bin = ferrite_bin()?;
    let binary = std::fs::read(&bin)?;
    let mut help = BTreeMap::new();
    for overlay in OVERLAYS {
        let plan = Plan::new(&render(overlay).await?, rehearsal::first_pod_ip())?;
        let checked = variables_read(&plan, &bin, &binary, &mut help).await?;
        anyhow::ensure!(
            checked > 10,
            "{overlay}: only {checked} variables found: is the rendering right?"
        );
    }
    Ok(())
}

/// Checks every FERRITE_* variable `plan`'s ferrite containers set; returns how many.
async fn variables_read(
    plan: &Plan,
    bin: &std::path::Path,
    binary: &[u8],
    help: &mut BTreeMap<String, String>,
) -> Result<usize> {
    let mut checked = 0;
    for (owner, sub, c) in ferrite_containers(plan) {
        if !help.contains_key(&sub) {
            let text = Proc::output(
                format!("ferrite {sub} --help"),
                bin,
                &[sub.clone(), "--help".into()],
                Duration::from_secs(30),
            )
            .await?;
            help.insert(sub.clone(), text);
        }
        let mut names: Vec<String> = manifest::array(&c, "env")
            .iter()
            .map(|e| str_at(e, "/name").to_owned())
            .collect();
        for from in manifest::array(&c, "envFrom") {
            let cm = str_at(&from, "/configMapRef/name");
            names.extend(
                plan.config_maps
                    .get(cm)
                    .into_iter()
                    .flat_map(|d| d.keys().cloned()),
            );
        }
        for name in names.iter().filter(|n| n.starts_with("FERRITE_")) {
            let flag = help[&sub].contains(&format!("[env: {name}="));
            let process_wide = PROCESS_VARIABLES.contains(&name.as_str())
                && binary.windows(name.len()).any(|w| w == name.as_bytes());
            anyhow::ensure!(
                flag || process_wide,
                "{owner} sets {name} for `ferrite {sub}`, which reads no such variable"
            );
            checked += 1;
        }
    }
    Ok(checked)
}

/// The model file of [`MODEL`] in this machine's cache (pulled if needed).
async fn cached_model() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("FERRITE_TEST_GGUF") {
        return Ok(PathBuf::from(p));
    }
    let out = Proc::output(
        "ferrite model path",
        &ferrite_bin()?,
        &["model".into(), "path".into(), MODEL.into()],
        Duration::from_secs(300),
    )
    .await?;
    Ok(PathBuf::from(out.trim()))
}

fn which(program: &str) -> Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("no {program} on the PATH (tests/run.sh installs etcd-server)"))
}

async fn list_models(addr: std::net::SocketAddr) -> Result<Vec<(String, u32)>> {
    let channel = ferrite_cluster_tests::cluster::channel(addr).await?;
    let models = InferenceClient::new(channel)
        .list_models(ListModelsRequest {})
        .await?
        .into_inner()
        .models;
    Ok(models
        .into_iter()
        .map(|m| (m.name, m.ready_pools))
        .collect())
}

fn ready_pools(models: &[(String, u32)]) -> u32 {
    models
        .iter()
        .find(|(n, _)| n == MODEL)
        .map_or(0, |(_, r)| *r)
}

/// A rehearsed overlay: its cluster, and the receiver standing in for the collector's backend.
struct Rehearsal {
    cluster: Cluster,
    receiver: OtlpReceiver,
}

/// Renders `overlay`, starts every pod of it and waits until all are Ready; prints each pod's
/// start → Ready time.
///
/// The images: ferrite's from its Dockerfile's `cpu` and `cuda` stages (the CUDA image's
/// containers get FERRITE_DEVICE=cpu: no GPU here), etcd's binary from the PATH, the collector
/// as a stand-in whose OTLP port reaches a receiver here. The model volume holds the model already (as a filled
/// PersistentVolume would): the init containers find it instead of downloading it.
async fn rehearse(overlay: &str) -> Result<Rehearsal> {
    let root = workspace_root();
    let plan = Plan::new(&render(overlay).await?, rehearsal::first_pod_ip())?;
    let receiver = OtlpReceiver::start().await?;
    let receiver_addr: std::net::SocketAddr =
        receiver.endpoint().trim_start_matches("http://").parse()?;
    let dockerfile = root.join("deploy/docker/Dockerfile");
    let cpu_image = image_config(&dockerfile, "cpu")?;
    let cuda_image = image_config(&dockerfile, "cuda")?;
    let entrypoint = cpu_image
        .entrypoint
        .first()
        .cloned()
        .context("the cpu image has no ENTRYPOINT")?;
    anyhow::ensure!(
        cuda_image.entrypoint == cpu_image.entrypoint,
        "the cuda and cpu images start differently"
    );
    let gpu_to_cpu = vec![("FERRITE_DEVICE".to_owned(), "cpu".to_owned())];
    let uses_cuda = plan.pods.iter().any(|p| {
        p.containers()
            .iter()
            .any(|c| manifest::str_at(c, "/image").starts_with("ferrite-cuda"))
    });
    if uses_cuda {
        eprintln!(
            "{overlay}: the ferrite-cuda image's containers run with FERRITE_DEVICE=cpu (their \
             nvidia.com/gpu mapped to the CPU: no GPU here)"
        );
    }
    let images = Images {
        configs: [
            ("ferrite".to_owned(), cpu_image),
            ("ferrite-cuda".to_owned(), cuda_image),
        ]
        .into(),
        executables: [
            (entrypoint, ferrite_bin()?),
            ("/usr/local/bin/etcd".to_owned(), which("etcd")?),
        ]
        .into(),
        stand_ins: [(
            "otel/opentelemetry-collector-contrib".to_owned(),
            [("otlp-grpc".to_owned(), receiver_addr)].into(),
        )]
        .into(),
        env_overrides: [("ferrite-cuda".to_owned(), gpu_to_cpu)].into(),
    };
    let model = cached_model().await?;
    let seeds = [(
        "models".to_owned(),
        Seed {
            relative: PathBuf::from(format!("models/{MODEL}"))
                .join(model.file_name().context("model file name")?),
            source: model,
        },
    )]
    .into();

    let workdir = root
        .join("target/kubernetes")
        .join(format!("rehearsal-{}", std::process::id()));
    let mut cluster = Cluster::new(plan, images, workdir).await?;
    cluster.start_all(&seeds).await?;
    cluster.wait_all_ready(READY_TIMEOUT).await?;
    print_timings(
        &format!("{overlay}: pod start → Ready (probes on their declared periods)"),
        &cluster,
        None,
    );
    Ok(Rehearsal { cluster, receiver })
}

/// The start → Ready table of `cluster`'s pods (only `only`, if given).
fn print_timings(title: &str, cluster: &Cluster, only: Option<&[String]>) {
    eprintln!("{title}:");
    for pod in &cluster.pods {
        if only.is_some_and(|names| !names.contains(&pod.plan.name)) {
            continue;
        }
        let after = (*proxy::lock(&pod.ready_after)).unwrap_or_default();
        let role = match pod.plan.labels.get(lws::WORKER_INDEX) {
            Some(i) => format!("{} rank {i}", pod.plan.component),
            None => pod.plan.component.clone(),
        };
        let stand_in = if pod.containers.is_empty() {
            " (stand-in)"
        } else {
            ""
        };
        eprintln!(
            "  {:<15} {:<36} {:>6.2} s{stand_in}",
            role,
            pod.plan.name,
            after.as_secs_f64()
        );
    }
}

/// Waits until the gateway at `gateway` counts `n` Ready pools of [`MODEL`].
async fn wait_for_ready_pools(
    gateway: std::net::SocketAddr,
    n: u32,
    timeout: Duration,
) -> Result<Duration> {
    let (_, took) = wait::until(
        &format!("the gateway Service to list {n} Ready pools"),
        timeout,
        || async {
            match list_models(gateway).await {
                Ok(m) if ready_pools(&m) == n => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    Ok(took)
}

/// The official `openai` client through the gateway Service's HTTP port: models, a
/// completion, a chat.
async fn openai_answers(gateway_http: std::net::SocketAddr) -> Result<()> {
    let openai = run_client(
        "openai_client.py",
        &[
            "--base-url".into(),
            format!("http://{gateway_http}/v1"),
            "--prompt".into(),
            "The capital of France is".into(),
            "--chat".into(),
            "What is the capital of France?".into(),
            "--max-tokens".into(),
            "8".into(),
        ],
        Duration::from_secs(120),
    )
    .await?;
    anyhow::ensure!(
        openai["models"]
            .as_array()
            .is_some_and(|m| m.iter().any(|x| x == MODEL)),
        "openai models.list: {}",
        openai["models"]
    );
    anyhow::ensure!(
        openai["completion"]["finish_reason"] == "length"
            && !openai["completion"]["text"]
                .as_str()
                .unwrap_or("")
                .is_empty(),
        "openai completion through the Service: {}",
        openai["completion"]
    );
    anyhow::ensure!(
        !openai["chat"]["content"].as_str().unwrap_or("").is_empty(),
        "openai chat through the Service: {}",
        openai["chat"]
    );
    Ok(())
}

/// Every declared port listens and every PodMonitor endpoint answers. (`comm`, rank 0's
/// rendezvous listener, is open only while its pool forms: the collective record in etcd names
/// it, and the multinode rehearsal checks that.)
async fn ports_and_scrapes(cluster: &Cluster) -> Result<()> {
    let scraped = cluster.check_ports_and_scrapes(&["comm"]).await?;
    eprintln!(
        "every declared container port listens; the PodMonitors scrape {} endpoints",
        scraped.len()
    );
    Ok(())
}

/// No pod saw a probe failure a kubelet would act on (a liveness failure, a start-up probe
/// given up).
fn no_probe_problems(cluster: &Cluster) -> Result<()> {
    for pod in &cluster.pods {
        let problems = proxy::lock(&pod.problems).clone();
        anyhow::ensure!(problems.is_empty(), "pod {}: {problems:?}", pod.plan.name);
    }
    Ok(())
}

/// Deletes every pod: each ferrite process exits 0 within its grace period (etcd may end by
/// the SIGTERM it re-raises after shutting down cleanly).
async fn delete_everything(cluster: &mut Cluster) -> Result<()> {
    let ferrite_pods: Vec<String> = cluster
        .pods
        .iter()
        .filter(|p| {
            p.containers
                .iter()
                .any(|c| str_at(&c.spec, "/image").starts_with("ferrite"))
        })
        .map(|p| p.plan.name.clone())
        .collect();
    for (pod, exits) in cluster.terminate_all().await? {
        for e in exits {
            anyhow::ensure!(
                e.success || (e.by_sigterm && !e.killed && !ferrite_pods.contains(&pod)),
                "pod {pod} container {} ended {} after {:?} (killed: {})",
                e.container,
                e.status,
                e.after,
                e.killed
            );
        }
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cpu_overlay_rehearsed() -> Result<()> {
    let _turn = serial().await;
    let Rehearsal {
        mut cluster,
        receiver,
    } = rehearse("overlays/cpu").await?;

    // The gateway Service: both pools, then the openai client on the HTTP port (80 → http).
    let gateway_grpc = cluster.service_addr("ferrite-gateway", 50051)?;
    let gateway_http = cluster.service_addr("ferrite-gateway", 80)?;
    let workers = cluster.plan.pods_of("Deployment/ferrite-worker").len() as u32;
    wait_for_ready_pools(gateway_grpc, workers, Duration::from_secs(30)).await?;
    ports_and_scrapes(&cluster).await?;
    openai_answers(gateway_http).await?;

    // Traces went through the collector's Service to the stand-in.
    let spans = receiver
        .wait_for(Duration::from_secs(15), |spans| {
            ["ferrite-worker", "ferrite-gateway"].iter().all(|svc| {
                spans
                    .iter()
                    .any(|s| s.name == "startup" && s.service_name.as_deref() == Some(svc))
            })
        })
        .await;
    anyhow::ensure!(
        spans.is_ok(),
        "no startup spans of both the workers and the gateways reached the collector Service: {:?}",
        spans.map_or_else(
            |s| s
                .iter()
                .map(|s| (s.service_name.clone(), s.name.clone()))
                .collect::<Vec<_>>(),
            |_| Vec::new()
        )
    );

    drain_a_worker(&mut cluster, gateway_grpc).await?;
    // No liveness probe failed meanwhile (the kubelet would have restarted the container).
    no_probe_problems(&cluster)?;
    delete_everything(&mut cluster).await
}

/// Deletes the first worker pod while it serves requests: they finish, the process exits 0
/// within the grace period, the pool leaves etcd, and the other pool serves on.
async fn drain_a_worker(cluster: &mut Cluster, gateway: std::net::SocketAddr) -> Result<()> {
    const TOKENS: u32 = 96;
    const REQUESTS: usize = 4;
    let victim = cluster.plan.pods_of("Deployment/ferrite-worker")[0].clone();
    let worker_port = victim
        .containers()
        .iter()
        .find_map(|c| manifest::PodPlan::resolve_port(c, &"grpc".into()).ok())
        .context("the worker declares no grpc port")?;
    let worker_addr = std::net::SocketAddr::new(std::net::IpAddr::V4(victim.ip), worker_port);

    let channel = ferrite_cluster_tests::cluster::channel(gateway).await?;
    let requests: Vec<_> = (0..REQUESTS)
        .map(|i| {
            let mut client = InferenceClient::new(channel.clone());
            tokio::spawn(async move {
                grpc::generate(
                    &mut client,
                    grpc::greedy_text(&format!("Request {i} of the drain test:"), TOKENS),
                )
                .await
            })
        })
        .collect();
    // Wait until the victim holds some of them.
    let (_, _) = wait::until(
        "the worker pod to be serving requests",
        Duration::from_secs(20),
        || async {
            let channel = ferrite_cluster_tests::cluster::channel(worker_addr)
                .await
                .map_err(|e| e.to_string())?;
            let load = WorkerClient::new(channel)
                .get_load(GetLoadRequest {})
                .await
                .map_err(|e| e.to_string())?
                .into_inner();
            if load.running > 0 {
                Ok(())
            } else {
                Err(format!("{load:?}"))
            }
        },
    )
    .await?;
    let grace = Duration::from_secs(victim.grace_period_s());
    let exits = cluster.terminate(&victim.name).await?;
    for e in &exits {
        anyhow::ensure!(
            e.success && e.after < grace,
            "worker pod {} container {} ended {} after {:?} (grace {grace:?}, killed: {})",
            victim.name,
            e.container,
            e.status,
            e.after,
            e.killed
        );
        eprintln!(
            "worker pod {} drained and exited ({}) {:.2} s after SIGTERM (grace period {} s)",
            victim.name,
            e.status,
            e.after.as_secs_f64(),
            grace.as_secs()
        );
    }
    for r in requests {
        let c: Completion = r
            .await?
            .map_err(|s| anyhow::anyhow!("a request in flight failed: {s}"))?;
        anyhow::ensure!(
            c.token_ids.len() == TOKENS as usize && c.finish.as_ref().is_some_and(is_length),
            "a request in flight came back cut: {} tokens, finish {:?}",
            c.token_ids.len(),
            c.finish
        );
    }
    // The pool is gone from etcd (through the etcd Service, as a ferrite process sees it) and
    // from the gateways; the other pool serves.
    let etcd = cluster.service_addr("ferrite-etcd", 2379)?;
    let store = Store::connect(&[format!("http://{etcd}")], PREFIX).await?;
    let key = KeySchema::new(PREFIX).pool(&victim.name);
    let left = store.get_prefix(&key).await?;
    anyhow::ensure!(
        left.iter().all(|(k, _)| *k != key),
        "the drained pool's key {key} is still in etcd"
    );
    let workers = cluster.plan.pods_of("Deployment/ferrite-worker").len() as u32;
    wait::until(
        "the gateways to drop the drained pool",
        Duration::from_secs(15),
        || async {
            match list_models(gateway).await {
                Ok(m) if ready_pools(&m) == workers - 1 => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await?;
    let mut client = InferenceClient::new(channel);
    let after = grpc::generate(&mut client, grpc::greedy_text("After the drain:", 8)).await?;
    anyhow::ensure!(after.token_ids.len() == 8, "after the drain: {after:?}");
    Ok(())
}

fn is_length(f: &Finish) -> bool {
    f.reason == ferrite_proto::v1::FinishReason::Length as i32
}
