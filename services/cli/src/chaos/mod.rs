//! `ferrite bench chaos`: the fault run of a cluster as one command. A real etcd, a gateway and
//! two worker pools of the model (all processes of this binary) under steady streaming load,
//! then one fault after another: etcd lost for a while, the gateway killed and restarted, a
//! pool drained, a worker stopped (`kill -STOP`), a worker whose model computes NaN, an engine
//! that panics, a burst on small KV caches, a crowd of clients that disconnect mid-stream, and
//! a rank lost from a tensor-parallel pool.
//!
//! Per fault it prints the requests started while it ran (and until traffic settled), how they
//! ended (ok, or failed by gRPC code, or hung: neither within its deadline plus a margin), how
//! long traffic took to recover once the fault ended (to the first request started after it
//! that succeeded), and what the live pools still held once the clients paused (KV blocks in
//! use, requests running or waiting). The goal: nothing hung, nothing held, every failure one
//! a client can act on (UNAVAILABLE, RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED, or a connection
//! cut under the stream by a killed process: retry), and recovery within the lease TTL + 1 s.

mod faults;
mod load;
mod procs;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_placement::testing::EtcdServer;
use ferrite_proto::worker::v1 as pb;
use serde_json::json;

use crate::table::Table;
use load::{Load, Outcome, Record};
use procs::Node;

#[derive(Debug, Args)]
pub struct ChaosArgs {
    /// The model every pool serves (a name or a GGUF file; the TP pool splits it 3 ways).
    #[arg(long, default_value = "smollm2-135m")]
    model: String,
    /// Streaming clients of the steady load, each with one request at a time.
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Each request's deadline (gRPC `grpc-timeout`).
    #[arg(long, default_value_t = 30)]
    deadline_s: u64,
    /// The workers' lease TTL (the recovery goal is this + 1 s).
    #[arg(long, default_value_t = 3)]
    lease_ttl_s: u64,
    /// Each worker's KV cache (small, so the burst preempts).
    #[arg(long, default_value_t = 64)]
    kv_cache_mib: usize,
    /// How long etcd stays down, and a worker stopped.
    #[arg(long, default_value_t = 15)]
    outage_s: u64,
    /// Requests of the burst, and the tokens each asks for.
    #[arg(long, default_value_t = 64)]
    burst: usize,
    #[arg(long, default_value_t = 128)]
    burst_tokens: u32,
    /// Clients that disconnect after their first token.
    #[arg(long, default_value_t = 100)]
    disconnects: usize,
    /// Only these faults (comma-separated names of the table's first column).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    #[arg(long)]
    json: bool,
}

/// The cluster the faults act on.
pub(crate) struct Cluster {
    args: ChaosArgs,
    dir: PathBuf,
    /// The model file the workers load (resolved once).
    model_file: PathBuf,
    etcd: EtcdServer,
    gateway: Node,
    /// The gateway's fixed ports (it comes back on them).
    grpc_port: u16,
    http_port: u16,
    /// Live pools: name → (process, worker API address).
    pools: BTreeMap<String, (Node, SocketAddr)>,
}

/// What one fault did, as the table shows it.
#[derive(Debug)]
pub(crate) struct Phase {
    name: &'static str,
    /// When the fault ended (recovery is measured from here).
    ended: Instant,
    /// A note on what the fault itself saw (exit codes, refusals).
    note: String,
}

const READY_TIMEOUT: Duration = Duration::from_secs(180);

impl Cluster {
    async fn start(args: ChaosArgs) -> Result<Self> {
        let status = std::process::Command::new("etcd").arg("--version").output();
        if !status.is_ok_and(|o| o.status.success()) {
            bail!("bench chaos runs a real etcd: put `etcd` on the PATH (Debian: etcd-server)");
        }
        let model_file =
            ferrite_engine::registry::resolve(&args.model, |what| eprintln!("ferrite: {what} ..."))
                .with_context(|| format!("resolving --model {}", args.model))?;
        let dir = procs::run_dir()?;
        let etcd = tokio::task::spawn_blocking(EtcdServer::start).await?;
        let (grpc_port, http_port) = (procs::free_port()?, procs::free_port()?);
        let mut c = Self {
            gateway: Self::spawn_gateway(&etcd, grpc_port, http_port, &dir)?,
            args,
            dir,
            model_file,
            etcd,
            grpc_port,
            http_port,
            pools: BTreeMap::new(),
        };
        c.gateway.ready(READY_TIMEOUT).await?;
        for pool in ["a", "b"] {
            c.add_pool(pool, &[]).await?;
        }
        Ok(c)
    }

    fn spawn_gateway(
        etcd: &EtcdServer,
        grpc: u16,
        http: u16,
        dir: &std::path::Path,
    ) -> Result<Node> {
        let args: Vec<String> = [
            "gateway",
            "--listen",
            &format!("127.0.0.1:{grpc}"),
            "--http-listen",
            &format!("127.0.0.1:{http}"),
            "--etcd",
            &etcd.endpoint(),
        ]
        .map(String::from)
        .into();
        Node::spawn("gateway", &args, &[], dir)
    }

    /// The arguments of rank `rank` of `pool` (of `tp` ranks) over `model`.
    fn worker_args(&self, pool: &str, rank: u32, tp: u32, model: &std::path::Path) -> Vec<String> {
        let mut args: Vec<String> = ["worker", "--model"].map(String::from).into();
        args.push(model.display().to_string());
        for (flag, value) in [
            ("--served-model-name", self.args.model.clone()),
            ("--pool", pool.to_owned()),
            ("--rank", rank.to_string()),
            ("--tp", tp.to_string()),
            ("--listen", "127.0.0.1:0".to_owned()),
            ("--etcd", self.etcd.endpoint()),
            ("--lease-ttl-s", self.args.lease_ttl_s.to_string()),
            ("--kv-cache-mib", self.args.kv_cache_mib.to_string()),
            ("--max-model-len", "1024".to_owned()),
            ("--drain-timeout-s", "10".to_owned()),
        ] {
            args.extend([flag.to_owned(), value]);
        }
        args
    }

    /// Starts a one-rank pool and waits for it to serve.
    async fn add_pool(&mut self, pool: &str, env: &[(&str, &str)]) -> Result<()> {
        let args = self.worker_args(pool, 0, 1, &self.model_file.clone());
        let mut node = Node::spawn(&format!("pool-{pool}"), &args, env, &self.dir)?;
        let lines = node.ready(READY_TIMEOUT).await?;
        let addr = procs::addr_after(&lines, "serving on")?;
        self.pools.insert(pool.to_owned(), (node, addr));
        Ok(())
    }

    fn gateway_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.grpc_port))
    }

    /// KV blocks in use and requests running or waiting, summed over the live pools.
    async fn held(&self) -> (u64, u64) {
        let (mut blocks, mut requests) = (0, 0);
        for (_, addr) in self.pools.values() {
            let load = async {
                let mut c =
                    pb::worker_client::WorkerClient::connect(format!("http://{addr}")).await?;
                anyhow::Ok(c.get_load(pb::GetLoadRequest {}).await?.into_inner())
            };
            if let Ok(Ok(l)) = tokio::time::timeout(Duration::from_secs(2), load).await {
                blocks += u64::from(l.kv_blocks_used);
                requests += u64::from(l.running + l.waiting);
            }
        }
        (blocks, requests)
    }
}

/// A row of the table: a fault and how the requests of its phase went.
struct Row {
    name: &'static str,
    requests: usize,
    ok: usize,
    failed: BTreeMap<String, usize>,
    /// Failures with a code a client cannot act on.
    unactionable: usize,
    hung: usize,
    recovery_s: Option<f64>,
    kv_blocks_left: u64,
    requests_left: u64,
    note: String,
}

/// Codes a client can act on (retry, later or elsewhere).
fn actionable(code: tonic::Code) -> bool {
    matches!(
        code,
        tonic::Code::Unavailable | tonic::Code::ResourceExhausted | tonic::Code::DeadlineExceeded
    )
}

impl Row {
    fn new(phase: &Phase, records: &[Record], held: (u64, u64)) -> Self {
        let mut failed = BTreeMap::new();
        let (mut ok, mut hung, mut unactionable) = (0, 0, 0);
        for r in records {
            match &r.outcome {
                Outcome::Ok | Outcome::Disconnected => ok += 1,
                Outcome::Hung => hung += 1,
                Outcome::Cut => *failed.entry("cut (transport)".to_owned()).or_default() += 1,
                Outcome::Failed(code) => {
                    *failed.entry(format!("{code:?}")).or_default() += 1;
                    unactionable += usize::from(!actionable(*code));
                }
            }
        }
        let recovery_s = records
            .iter()
            .filter(|r| r.started >= phase.ended && r.outcome == Outcome::Ok)
            .map(|r| r.started.duration_since(phase.ended).as_secs_f64())
            .reduce(f64::min);
        Self {
            name: phase.name,
            requests: records.len(),
            ok,
            failed,
            unactionable,
            hung,
            recovery_s,
            kv_blocks_left: held.0,
            requests_left: held.1,
            note: phase.note.clone(),
        }
    }

    fn goal_met(&self, lease_ttl_s: u64) -> bool {
        let recovered = self
            .recovery_s
            .is_some_and(|s| s <= lease_ttl_s as f64 + 1.0);
        self.hung == 0
            && self.unactionable == 0
            && self.kv_blocks_left == 0
            && self.requests_left == 0
            && recovered
    }

    fn failed_cell(&self) -> String {
        if self.failed.is_empty() {
            return "0".into();
        }
        let parts: Vec<String> = self
            .failed
            .iter()
            .map(|(c, n)| format!("{n} {c}"))
            .collect();
        parts.join(", ")
    }
}

pub fn run(args: ChaosArgs) -> Result<()> {
    if args.clients == 0 || args.deadline_s == 0 {
        bail!("--clients ≥ 1 and --deadline-s ≥ 1 are needed");
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(chaos(args))
}

async fn chaos(args: ChaosArgs) -> Result<()> {
    let json_out = args.json;
    let deadline = Duration::from_secs(args.deadline_s);
    let (clients, lease_ttl_s) = (args.clients, args.lease_ttl_s);
    let mut cluster = Cluster::start(args).await?;
    let load = Load::start(
        cluster.gateway_addr(),
        &cluster.args.model.clone(),
        clients,
        deadline,
    );
    let mut rows = Vec::new();
    for (i, fault) in faults::ALL.iter().enumerate() {
        if !cluster.args.only.is_empty() && !cluster.args.only.iter().any(|o| o == fault.name) {
            continue;
        }
        eprintln!("bench chaos: {}", fault.name);
        load.set_phase(i);
        load.resume();
        let phase = (fault.run)(&mut cluster, &load).await?;
        // Traffic after the fault, then a quiet moment to see what is left held.
        tokio::time::sleep(Duration::from_secs(5)).await;
        load.pause().await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        let held = cluster.held().await;
        rows.push(Row::new(&phase, &load.records(i), held));
    }
    load.stop().await;
    print(&rows, lease_ttl_s, json_out);
    let _ = std::fs::remove_dir_all(&cluster.dir);
    Ok(())
}

fn print(rows: &[Row], lease_ttl_s: u64, as_json: bool) {
    if as_json {
        let out: Vec<_> = rows
            .iter()
            .map(|r| json!({ "fault": r.name, "requests": r.requests, "ok": r.ok, "failed": r.failed,
                "hung": r.hung, "recovery_s": r.recovery_s, "kv_blocks_left": r.kv_blocks_left,
                "requests_left": r.requests_left, "goal_met": r.goal_met(lease_ttl_s), "note": r.note }))
            .collect();
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
        return;
    }
    let mut t = Table::new(&[
        "fault",
        "requests",
        "ok",
        "failed (by code)",
        "hung",
        "recovery (s)",
        "KV blocks left",
        "requests left",
        "goal",
        "what the fault saw",
    ]);
    for r in rows {
        t.row(vec![
            r.name.to_owned(),
            r.requests.to_string(),
            r.ok.to_string(),
            r.failed_cell(),
            r.hung.to_string(),
            r.recovery_s.map_or("-".into(), |s| format!("{s:.2}")),
            r.kv_blocks_left.to_string(),
            r.requests_left.to_string(),
            if r.goal_met(lease_ttl_s) {
                "met"
            } else {
                "MISSED"
            }
            .to_owned(),
            r.note.clone(),
        ]);
    }
    print!("{}", t.render());
    println!(
        "goal: no request hung, nothing held, failures only UNAVAILABLE / RESOURCE_EXHAUSTED / \
         DEADLINE_EXCEEDED / cut by a killed process, recovery ≤ lease TTL + 1 s = {} s",
        lease_ttl_s + 1
    );
}
