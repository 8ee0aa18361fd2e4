//! A rendered overlay, rehearsed as local processes: what a kubelet and kube-proxy would do
//! with it, on this machine.
//!
//! - Each pod gets its own loopback address (127.x.y.z, standing for the pod IP), so every
//!   container binds the ports it declares, as in its own network namespace; `0.0.0.0` in a
//!   container's strings becomes that address.
//! - Containers start from the image's ENTRYPOINT/CMD/ENV (read from deploy/docker/Dockerfile)
//!   and the container's `command`, `args`, `envFrom` and `env`, with the downward API's values
//!   and Kubernetes' `$(VAR)` expansion, in a cleared environment (nothing of this test's
//!   environment leaks in but PATH). Init containers run first, each to exit 0.
//! - Service names (with a port) in those strings become the local port of a forwarder that
//!   picks a Ready pod of the Service's selector and connects to its targetPort; pod DNS names
//!   under a headless Service become pod addresses; volume mount paths become local
//!   directories (emptyDir and configMap volumes per pod, claims shared by name).
//! - Probes run on their declared schedule (start-up first, then readiness and liveness) against
//!   the pod address; a pod is Ready when every container's readiness probe passes.
//! - Termination: the pod leaves the Services' endpoints, each container's preStop sleep runs,
//!   then SIGTERM; SIGKILL if the grace period runs out.
//!
//! Images that are not ferrite's or etcd's run as stand-ins: the test names a local address
//! for each of their ports (the OpenTelemetry Collector's OTLP port becomes an OTLP receiver).
//! Hardware this machine lacks is mapped by variables set over an image's containers' own
//! (the CUDA image's containers get `FERRITE_DEVICE=cpu`: their GPUs become the CPU).
//!
//! Beyond what a kubelet does, [`Cluster::kill`] ends a pod's processes as a crash would, and
//! [`Cluster::recreate`] deletes pods and creates them anew (what a LeaderWorkerSet does to a
//! group with `RecreateGroupOnPodRestart`).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use ferrite_cluster_tests::Proc;
use serde_json::Value;
use tokio::net::TcpStream;

use crate::manifest::{ImageConfig, Plan, PodPlan, Rewrites, array, expand, str_at};
use crate::probe::Probe;
use crate::proxy::{self, PodState, ServicePort, States, lock};

mod start;

use start::StartContext;

/// How long an init container may run.
const INIT_TIMEOUT: Duration = Duration::from_secs(120);

/// How the test maps images to this machine.
#[derive(Debug, Clone, Default)]
pub struct Images {
    /// Image repository (without tag) → its Dockerfile stage's ENTRYPOINT, CMD and ENV.
    pub configs: BTreeMap<String, ImageConfig>,
    /// Executable path in an image → local executable.
    pub executables: BTreeMap<String, PathBuf>,
    /// Image repository → (port name → local address) for images run as stand-ins.
    pub stand_ins: BTreeMap<String, BTreeMap<String, SocketAddr>>,
    /// Image repository → variables set over its containers' own (after `env`, as a mutating
    /// admission webhook would), mapping hardware this machine lacks.
    pub env_overrides: BTreeMap<String, Vec<(String, String)>>,
}

fn repository(image: &str) -> &str {
    // `registry/name:tag` → `registry/name` (a registry port's colon comes before a slash).
    match image.rfind(':') {
        Some(i) if !image[i..].contains('/') => &image[..i],
        _ => image,
    }
}

/// One started container.
#[derive(Debug)]
pub struct Container {
    pub name: String,
    pub spec: Value,
    pub proc: Proc,
    /// The strings it was started with, after mapping (for error messages).
    pub argv: Vec<String>,
}

/// What terminating one container came to.
#[derive(Debug)]
pub struct Exit {
    pub container: String,
    /// Exit status 0, before any SIGKILL.
    pub success: bool,
    /// Ended by the SIGTERM itself (a Go program such as etcd re-raises it after its own
    /// clean-up; Kubernetes reports exit code 143).
    pub by_sigterm: bool,
    pub status: String,
    /// From the start of the pod's termination to the exit.
    pub after: Duration,
    pub killed: bool,
}

/// A pod started on this machine.
#[derive(Debug)]
pub struct Pod {
    pub plan: PodPlan,
    pub containers: Vec<Container>,
    /// When the pod first turned Ready, after `started`.
    pub ready_after: Arc<Mutex<Option<Duration>>>,
    /// Probe failures that a kubelet would act on (start-up given up, liveness failed).
    pub problems: Arc<Mutex<Vec<String>>>,
    /// Each container's last failed probe, for the report when a pod never turns Ready.
    pub last_failure: Arc<Mutex<BTreeMap<String, String>>>,
    probes: Vec<tokio::task::JoinHandle<()>>,
    _forwards: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Pod {
    fn drop(&mut self) {
        for p in &self.probes {
            p.abort();
        }
        for f in &self._forwards {
            f.abort();
        }
    }
}

/// A rehearsed cluster: the pods and the Services of one rendering.
#[derive(Debug)]
pub struct Cluster {
    pub plan: Plan,
    pub states: States,
    pub service_ports: Vec<ServicePort>,
    pub pods: Vec<Pod>,
    rewrites: Rewrites,
    images: Images,
    workdir: PathBuf,
    seeds: BTreeMap<String, Seed>,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.pods.clear();
        let _ = std::fs::remove_dir_all(&self.workdir);
    }
}

impl Cluster {
    /// Opens every Service port and maps every name; starts no pod yet.
    pub async fn new(plan: Plan, images: Images, workdir: PathBuf) -> Result<Self> {
        let states: States = Arc::new(Mutex::new(
            plan.pods
                .iter()
                .map(|p| (p.name.clone(), PodState::default()))
                .collect(),
        ));
        let mut rewrites = Rewrites::default();
        let mut service_ports = Vec::new();
        for svc in &plan.services {
            if svc.headless {
                // Pod DNS names under it: `pod.svc.ns.svc(.cluster.local)` and shorter forms.
                for pod in plan.pods.iter().filter(|p| p.selected_by(&svc.selector)) {
                    for name in svc.dns_names() {
                        rewrites
                            .hosts
                            .push((format!("{}.{name}", pod.name), pod.ip.to_string()));
                    }
                }
                continue;
            }
            for (port, target) in &svc.ports {
                let sp = ServicePort::start(svc, *port, target, &plan.pods, states.clone()).await?;
                for name in svc.dns_names() {
                    rewrites
                        .service_ports
                        .push((format!("{name}:{port}"), sp.local.to_string()));
                }
                service_ports.push(sp);
            }
        }
        rewrites.sort();
        std::fs::create_dir_all(&workdir)?;
        Ok(Self {
            plan,
            states,
            service_ports,
            pods: Vec::new(),
            rewrites,
            images,
            workdir,
            seeds: BTreeMap::new(),
        })
    }

    /// The local address of Service `name`'s port `port`.
    pub fn service_addr(&self, name: &str, port: u16) -> Result<SocketAddr> {
        self.service_ports
            .iter()
            .find(|s| s.service == name && s.port == port)
            .map(|s| s.local)
            .ok_or_else(|| anyhow!("no Service port {name}:{port}"))
    }

    /// Starts every pod at once, as `kubectl apply` would (init containers run inside each
    /// pod's task, so one pod's init does not hold up another).
    pub async fn start_all(&mut self, seeds: &BTreeMap<String, Seed>) -> Result<()> {
        self.seeds = seeds.clone();
        let plans = self.plan.pods.clone();
        self.pods = self.start_pods(plans).await?;
        Ok(())
    }

    async fn start_pods(&self, plans: Vec<PodPlan>) -> Result<Vec<Pod>> {
        let starts = plans.into_iter().map(|plan| {
            let ctx = StartContext {
                rewrites: self.rewrites.clone(),
                images: self.images.clone(),
                config_maps: self.plan.config_maps.clone(),
                workdir: self.workdir.clone(),
                states: self.states.clone(),
                seeds: self.seeds.clone(),
            };
            async move { ctx.start_pod(plan).await }
        });
        futures::future::try_join_all(starts).await
    }

    fn pod_mut(&mut self, name: &str) -> Result<&mut Pod> {
        self.pods
            .iter_mut()
            .find(|p| p.plan.name == name)
            .ok_or_else(|| anyhow!("no pod {name}"))
    }

    /// The probes' last failures and each container's argv and stderr tail, for errors.
    pub async fn report(&mut self, name: &str) -> String {
        match self.pod_mut(name) {
            Ok(pod) => pod_report(pod).await,
            Err(e) => e.to_string(),
        }
    }

    /// Whether every container of pod `name` still runs.
    pub fn all_running(&mut self, name: &str) -> Result<bool> {
        let pod = self.pod_mut(name)?;
        Ok(pod.containers.iter_mut().all(|c| c.proc.is_running()))
    }

    /// Ends every container of pod `name` with SIGKILL, as a crash (or the OOM killer, or a
    /// lost node) would; the pod stays, not Ready.
    pub async fn kill(&mut self, name: &str) -> Result<()> {
        let pod = self.pod_mut(name)?;
        for c in &mut pod.containers {
            c.proc.kill_hard().await?;
        }
        Ok(())
    }

    /// Waits (at most `timeout`) for every container of pods `names` to exit by itself;
    /// returns (pod, container, exit status, whether it exited 0).
    pub async fn wait_exited(
        &mut self,
        names: &[String],
        timeout: Duration,
    ) -> Result<Vec<(String, String, String, bool)>> {
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        for name in names {
            let pod = self.pod_mut(name)?;
            for c in &mut pod.containers {
                let left = deadline.saturating_duration_since(Instant::now());
                let status = match c.proc.wait_exit(left).await {
                    Ok(s) => s,
                    Err(e) => {
                        let report = c.proc.stderr_report().await;
                        bail!("pod {name} container {}: {e}\n{report}", c.name);
                    }
                };
                out.push((
                    name.clone(),
                    c.name.clone(),
                    status.to_string(),
                    status.success(),
                ));
            }
        }
        Ok(out)
    }

    /// Deletes pods `names` (a kubelet's termination, for what still runs of them) and creates
    /// them anew from their plans: same names, labels and addresses, fresh emptyDirs.
    pub async fn recreate(&mut self, names: &[String]) -> Result<()> {
        for name in names {
            let states = self.states.clone();
            let i = self
                .pods
                .iter()
                .position(|p| &p.plan.name == name)
                .ok_or_else(|| anyhow!("no pod {name}"))?;
            let mut pod = self.pods.remove(i);
            terminate_pod(&mut pod, &states).await?;
            drop(pod);
            let dir = self.workdir.join("pods").join(name);
            if dir.exists() {
                std::fs::remove_dir_all(&dir)?;
            }
            lock(&states).insert(name.clone(), PodState::default());
        }
        let plans: Vec<PodPlan> = self
            .plan
            .pods
            .iter()
            .filter(|p| names.contains(&p.name))
            .cloned()
            .collect();
        let started = self.start_pods(plans).await?;
        self.pods.extend(started);
        Ok(())
    }

    /// Every TCP port each started container declares accepts connections on its pod's
    /// address (but those named in `transient`, open only for a while), and every PodMonitor
    /// endpoint answers 200 on the pods it selects that declare its port (what Prometheus
    /// would scrape). Returns what was scraped, as `pod port path`.
    pub async fn check_ports_and_scrapes(&self, transient: &[&str]) -> Result<Vec<String>> {
        for pod in self.pods.iter().filter(|p| !p.containers.is_empty()) {
            for c in &pod.containers {
                for port in array(&c.spec, "ports") {
                    if !matches!(str_at(&port, "/protocol"), "" | "TCP")
                        || transient.contains(&str_at(&port, "/name"))
                    {
                        continue;
                    }
                    let n = PodPlan::resolve_port(&c.spec, &port["containerPort"])?;
                    let at = SocketAddr::new(IpAddr::V4(pod.plan.ip), n);
                    let connected =
                        tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(at)).await;
                    anyhow::ensure!(
                        matches!(connected, Ok(Ok(_))),
                        "pod {} container {} declares port {} ({n}), but nothing listens there: {connected:?}",
                        pod.plan.name,
                        c.name,
                        str_at(&port, "/name")
                    );
                }
            }
        }
        let mut scraped = Vec::new();
        for m in &self.plan.monitors {
            for pod in self.pods.iter().filter(|p| !p.containers.is_empty()) {
                if !pod.plan.selected_by(&m.selector) {
                    continue;
                }
                for (port, path) in &m.endpoints {
                    let Some(n) = pod
                        .containers
                        .iter()
                        .find_map(|c| PodPlan::resolve_port(&c.spec, &port.as_str().into()).ok())
                    else {
                        continue;
                    };
                    let at = SocketAddr::new(IpAddr::V4(pod.plan.ip), n);
                    let r = ferrite_cluster_tests::http::get(at, path)
                        .await
                        .with_context(|| format!("PodMonitor {} scraping {at}{path}", m.name))?;
                    anyhow::ensure!(
                        r.status == 200,
                        "PodMonitor {}: GET http://{at}{path} on pod {} answered {}",
                        m.name,
                        pod.plan.name,
                        r.status
                    );
                    scraped.push(format!("{} {port} {path}", pod.plan.name));
                }
            }
        }
        Ok(scraped)
    }

    /// Waits until every pod is Ready; fails early, with the probes' last word, on a problem a
    /// kubelet would act on, or after `timeout`.
    pub async fn wait_all_ready(&mut self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        loop {
            let mut waiting = Vec::new();
            for pod in &mut self.pods {
                let problems = lock(&pod.problems).clone();
                if !problems.is_empty() {
                    let report = pod_report(pod).await;
                    bail!("pod {}: {}\n{report}", pod.plan.name, problems.join("; "));
                }
                for c in &mut pod.containers {
                    if !c.proc.is_running() {
                        let report = c.proc.stderr_report().await;
                        bail!(
                            "pod {} container {} exited (started as {:?})\n{report}",
                            pod.plan.name,
                            c.name,
                            c.argv
                        );
                    }
                }
                if lock(&pod.ready_after).is_none() {
                    waiting.push(pod.plan.name.clone());
                }
            }
            if waiting.is_empty() {
                return Ok(());
            }
            if started.elapsed() > timeout {
                let mut reports = String::new();
                for pod in &mut self.pods {
                    if waiting.contains(&pod.plan.name) {
                        reports.push_str(&pod_report(pod).await);
                    }
                }
                bail!("pods not Ready after {timeout:?}: {waiting:?}\n{reports}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Deletes pod `name` as a kubelet would (see the module doc); returns each container's
    /// exit.
    pub async fn terminate(&mut self, name: &str) -> Result<Vec<Exit>> {
        let states = self.states.clone();
        let pod = self
            .pods
            .iter_mut()
            .find(|p| p.plan.name == name)
            .ok_or_else(|| anyhow!("no pod {name}"))?;
        terminate_pod(pod, &states).await
    }

    /// Terminates every pod at once.
    pub async fn terminate_all(&mut self) -> Result<Vec<(String, Vec<Exit>)>> {
        let states = self.states.clone();
        let all = self.pods.iter_mut().map(|pod| {
            let states = states.clone();
            async move {
                let name = pod.plan.name.clone();
                terminate_pod(pod, &states).await.map(|e| (name, e))
            }
        });
        futures::future::try_join_all(all).await
    }
}

async fn pod_report(pod: &mut Pod) -> String {
    let mut out = format!("--- pod {} ---\n", pod.plan.name);
    for (who, failure) in lock(&pod.last_failure).iter() {
        out.push_str(&format!("last failed probe of {who}: {failure}\n"));
    }
    for c in &mut pod.containers {
        out.push_str(&format!("container {} argv {:?}\n", c.name, c.argv));
        out.push_str(&c.proc.stderr_report().await);
        out.push('\n');
    }
    out
}

async fn terminate_pod(pod: &mut Pod, states: &States) -> Result<Vec<Exit>> {
    let begun = Instant::now();
    if let Some(s) = lock(states).get_mut(&pod.plan.name) {
        s.terminating = true;
    }
    for p in &pod.probes {
        p.abort();
    }
    let grace = Duration::from_secs(pod.plan.grace_period_s());
    let stops = pod.containers.iter_mut().map(|c| async move {
        let pre_stop = c
            .spec
            .pointer("/lifecycle/preStop")
            .cloned()
            .unwrap_or(Value::Null);
        // A container that has ended already gets neither its preStop nor a signal.
        if c.proc.is_running() {
            if let Some(s) = pre_stop.pointer("/sleep/seconds").and_then(Value::as_u64) {
                tokio::time::sleep(Duration::from_secs(s).min(grace)).await;
            } else if !pre_stop.is_null() {
                bail!("container {}: only preStop sleep is rehearsed", c.name);
            }
        }
        if c.proc.is_running() {
            c.proc.signal_term()?;
        }
        let left = grace.saturating_sub(begun.elapsed());
        let (status, killed) = match c.proc.wait_exit(left).await {
            Ok(status) => (status, false),
            Err(_) => {
                c.proc.kill_hard().await?;
                (c.proc.wait_exit(Duration::from_secs(5)).await?, true)
            }
        };
        Ok(Exit {
            container: c.name.clone(),
            success: status.success() && !killed,
            by_sigterm: std::os::unix::process::ExitStatusExt::signal(&status) == Some(15),
            status: status.to_string(),
            after: begun.elapsed(),
            killed,
        })
    });
    futures::future::try_join_all(stops).await
}

/// A file a volume holds before its pod starts (as a PersistentVolume filled earlier would):
/// `source` appears in the volume as `relative` (a symbolic link).
#[derive(Debug, Clone)]
pub struct Seed {
    pub source: PathBuf,
    pub relative: PathBuf,
}

/// Links the seed's file into `volume`.
fn place_seed(volume: &Path, seed: &Seed) -> Result<()> {
    let source = &seed.source;
    let dest = volume.join(&seed.relative);
    if let Some(parent) = dest.parent() {
        std::fs::create_dir_all(parent)?;
    }
    if !dest.exists() {
        std::os::unix::fs::symlink(source, &dest)
            .with_context(|| format!("linking {} at {}", source.display(), dest.display()))?;
    }
    Ok(())
}

/// A distinct 127.a.b.0/24 per test process, so that two rehearsals never share addresses.
pub fn first_pod_ip() -> Ipv4Addr {
    let pid = std::process::id();
    let a = 100 + (pid % 100) as u8;
    let b = ((pid / 100) % 250) as u8;
    Ipv4Addr::new(127, a, b, 10)
}
