//! A cluster for one test: a real etcd, N `ferrite worker` processes (one pool each) and a
//! `ferrite gateway`, all on 127.0.0.1 with ports the processes pick themselves (port 0).

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context, Result, anyhow};
use ferrite_placement::testing::EtcdServer;
use ferrite_placement::{KeySchema, PoolRecord, Store};
use ferrite_proto::v1::inference_client::InferenceClient;
use ferrite_proto::v1::{ListModelsRequest, Model};
use ferrite_proto::worker::v1::worker_client::WorkerClient;
use ferrite_proto::worker::v1::{GetLoadRequest, Load};
use tonic::transport::{Channel, Endpoint};

use crate::process::Proc;
use crate::{MODEL, ferrite_bin, wait};

/// How long a worker may take to load the model and register (about 1–2 s when idle).
pub const WORKER_READY_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the gateway may take to bind and print `ready`.
pub const GATEWAY_READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the gateway may take to see freshly registered pools.
pub const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(15);
/// The etcd key prefix every process of a test cluster uses.
pub const PREFIX: &str = "/ferrite/v1";

/// Flags of a `ferrite worker`. Defaults keep memory small (several workers share 24 GiB with
/// other work) and the lease short (fault tests wait for it).
#[derive(Debug, Clone)]
pub struct WorkerOptions {
    pub lease_ttl_s: u64,
    pub kv_cache_mib: usize,
    pub max_num_seqs: Option<usize>,
    pub max_waiting: Option<usize>,
    pub max_model_len: Option<usize>,
    /// A model file (or directory) served instead of the default model, under [`MODEL`]'s
    /// name unless `served_name` says another.
    pub model_file: Option<std::path::PathBuf>,
    pub served_name: Option<String>,
    /// Added to the worker's environment (`FERRITE_TLS_CERT`, …).
    pub env: Vec<(String, String)>,
    /// Added to the worker's command line.
    pub extra_args: Vec<String>,
}

impl Default for WorkerOptions {
    fn default() -> Self {
        Self {
            lease_ttl_s: 3,
            kv_cache_mib: 400,
            max_num_seqs: None,
            max_waiting: None,
            max_model_len: None,
            model_file: None,
            served_name: None,
            env: Vec::new(),
            extra_args: Vec::new(),
        }
    }
}

impl WorkerOptions {
    /// The command line of rank `rank` of a pool of `tp`.
    fn rank_args(&self, pool: &str, etcd: &str, rank: u32, tp: u32) -> Vec<String> {
        let (rank, tp) = (rank.to_string(), tp.to_string());
        let mut args: Vec<String> = [
            "worker",
            "--model",
            MODEL,
            "--pool",
            pool,
            "--rank",
            &rank,
            "--tp",
            &tp,
            "--listen",
            "127.0.0.1:0",
            "--etcd",
            etcd,
            "--prefix",
            PREFIX,
        ]
        .map(String::from)
        .into();
        if let Some(file) = &self.model_file {
            args[2] = file.display().to_string();
            let name = self.served_name.as_deref().unwrap_or(MODEL);
            args.extend(["--served-model-name".into(), name.into()]);
        }
        args.extend(["--lease-ttl-s".into(), self.lease_ttl_s.to_string()]);
        // The exact arithmetic: answers compare with `ferrite generate`'s whatever the batch.
        args.extend(["--cpu-activations".into(), "f32".into()]);
        args.extend(["--kv-cache-mib".into(), self.kv_cache_mib.to_string()]);
        let optional = [
            ("--max-num-seqs", self.max_num_seqs),
            ("--max-waiting", self.max_waiting),
            ("--max-model-len", self.max_model_len),
        ];
        for (flag, value) in optional {
            if let Some(v) = value {
                args.extend([flag.to_owned(), v.to_string()]);
            }
        }
        args.extend(self.extra_args.iter().cloned());
        args
    }
}

/// One rank > 0 of a tensor-parallel pool: a `ferrite worker --rank R` process, which serves
/// gRPC health only.
#[derive(Debug)]
pub struct RankProc {
    pub rank: u32,
    /// Its gRPC health address.
    pub health: SocketAddr,
    pub proc: Proc,
}

impl RankProc {
    /// Starts rank `rank` of `pool` (of `tp` ranks) without waiting for it.
    pub fn spawn(
        etcd: &str,
        pool: &str,
        rank: u32,
        tp: u32,
        options: &WorkerOptions,
    ) -> Result<Proc> {
        WorkerProc::spawn_rank(etcd, pool, rank, tp, options)
    }

    /// Waits for a spawned rank's `ready` (it joined its pool) and reads its health address.
    pub async fn ready(rank: u32, mut proc: Proc) -> Result<Self> {
        let lines = proc.wait_ready(WORKER_READY_TIMEOUT).await?;
        Ok(Self {
            rank,
            health: addr_after(&lines, "health on")?,
            proc,
        })
    }
}

/// A tensor-parallel pool as processes: rank 0 (the worker the gateway reaches) and the others.
#[derive(Debug)]
pub struct TpPool {
    pub leader: WorkerProc,
    pub ranks: Vec<RankProc>,
}

impl TpPool {
    /// Starts ranks `tp-1` down to 1 first, then rank 0 (ranks may start in any order; they
    /// find rank 0 in etcd), and waits for all of them.
    pub async fn start(etcd: &str, pool: &str, tp: u32, options: &WorkerOptions) -> Result<Self> {
        let spawned = (1..tp)
            .rev()
            .map(|r| RankProc::spawn(etcd, pool, r, tp, options).map(|p| (r, p)))
            .collect::<Result<Vec<_>>>()?;
        let leader = WorkerProc::spawn_rank(etcd, pool, 0, tp, options)?;
        let ranks =
            futures::future::try_join_all(spawned.into_iter().map(|(r, p)| RankProc::ready(r, p)));
        let (mut ranks, leader) = tokio::try_join!(ranks, WorkerProc::ready(pool, leader))?;
        ranks.sort_by_key(|r| r.rank);
        Ok(Self { leader, ranks })
    }

    pub fn rank_mut(&mut self, rank: u32) -> &mut RankProc {
        self.ranks
            .iter_mut()
            .find(|r| r.rank == rank)
            .unwrap_or_else(|| panic!("no rank {rank}"))
    }
}

/// The address a process printed after `marker` on one of `lines` (the first `ip:port` token
/// after it, with any `http://` and trailing `/…` or `,` removed).
pub fn addr_after(lines: &[String], marker: &str) -> Result<SocketAddr> {
    for line in lines {
        if let Some((_, rest)) = line.split_once(marker) {
            for token in rest.split_whitespace() {
                let t = token.trim_start_matches("http://").trim_end_matches(',');
                let t = t.split('/').next().unwrap_or(t);
                if let Ok(addr) = t.parse() {
                    return Ok(addr);
                }
            }
        }
    }
    Err(anyhow!(
        "no address after {marker:?} in the output {lines:?}"
    ))
}

/// A gRPC channel to `addr` (loopback only), connected now.
pub async fn channel(addr: SocketAddr) -> Result<Channel> {
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "refusing a non-loopback address {addr}"
    );
    Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(Duration::from_secs(5))
        .tcp_nodelay(true)
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))
}

/// One `ferrite worker` process: pool `pool`, rank 0.
#[derive(Debug)]
pub struct WorkerProc {
    pub pool: String,
    pub addr: SocketAddr,
    pub proc: Proc,
}

impl WorkerProc {
    /// A worker serving the tiny fixture model `fixture` ([`crate::fixture_model`]) as pool
    /// and model `name`, with `flags` besides, in `cluster`'s etcd: started and ready.
    pub async fn serve_fixture(
        cluster: &Cluster,
        fixture: &str,
        name: &str,
        flags: &[&str],
    ) -> Result<Self> {
        let options = WorkerOptions {
            model_file: Some(crate::fixture_model(fixture)),
            served_name: Some(name.to_owned()),
            kv_cache_mib: 16,
            extra_args: flags.iter().map(|f| f.to_string()).collect(),
            ..WorkerOptions::default()
        };
        Self::start(&cluster.etcd.endpoint(), name, &options).await
    }

    /// Starts the process without waiting for it (see [`WorkerProc::ready`]).
    pub fn spawn(etcd: &str, pool: &str, options: &WorkerOptions) -> Result<Proc> {
        Self::spawn_rank(etcd, pool, 0, 1, options)
    }

    /// Starts rank `rank` of a pool of `tp` (rank 0 serves the worker API) without waiting.
    pub fn spawn_rank(
        etcd: &str,
        pool: &str,
        rank: u32,
        tp: u32,
        options: &WorkerOptions,
    ) -> Result<Proc> {
        let name = if tp == 1 {
            format!("worker {pool}")
        } else {
            format!("{pool} rank {rank}")
        };
        Proc::spawn_with_env(
            name,
            &ferrite_bin()?,
            &options.rank_args(pool, etcd, rank, tp),
            &options.env,
        )
    }

    /// Waits for a spawned worker's `ready` and reads its address.
    pub async fn ready(pool: &str, mut proc: Proc) -> Result<Self> {
        let lines = proc.wait_ready(WORKER_READY_TIMEOUT).await?;
        let addr = addr_after(&lines, "serving on")?;
        Ok(Self {
            pool: pool.to_owned(),
            addr,
            proc,
        })
    }

    pub async fn start(etcd: &str, pool: &str, options: &WorkerOptions) -> Result<Self> {
        Self::ready(pool, Self::spawn(etcd, pool, options)?).await
    }

    /// A client of the internal worker API.
    pub async fn client(&self) -> Result<WorkerClient<Channel>> {
        Ok(WorkerClient::new(channel(self.addr).await?))
    }

    /// The worker's current load (running, waiting, KV blocks).
    pub async fn load(&self) -> Result<Load> {
        let mut c = self.client().await?;
        Ok(c.get_load(GetLoadRequest {}).await?.into_inner())
    }
}

/// One `ferrite gateway` process.
#[derive(Debug)]
pub struct GatewayProc {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub proc: Proc,
}

impl GatewayProc {
    pub fn spawn(etcd: &str) -> Result<Proc> {
        Self::spawn_with_env(etcd, &[])
    }

    /// [`GatewayProc::spawn`] with `env` added (e.g. `FERRITE_API_KEYS`).
    pub fn spawn_with_env(etcd: &str, env: &[(String, String)]) -> Result<Proc> {
        let args = [
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--etcd",
            etcd,
            "--prefix",
            PREFIX,
        ]
        .map(String::from);
        Proc::spawn_with_env("gateway", &ferrite_bin()?, &args, env)
    }

    pub async fn ready(mut proc: Proc) -> Result<Self> {
        let lines = proc.wait_ready(GATEWAY_READY_TIMEOUT).await?;
        Ok(Self {
            grpc: addr_after(&lines, "gRPC on")?,
            http: addr_after(&lines, "HTTP on")?,
            proc,
        })
    }

    /// The gateway's entry for [`MODEL`], if some pool of it is ready.
    pub async fn model_entry(&self) -> Result<Option<Model>> {
        let mut c = InferenceClient::new(channel(self.grpc).await?);
        let models = c
            .list_models(ListModelsRequest {})
            .await?
            .into_inner()
            .models;
        Ok(models.into_iter().find(|m| m.name == MODEL))
    }

    /// Waits until ListModels shows [`MODEL`] with `n` ready pools; returns how long it took.
    /// A gateway prints `ready` once it listens, before placement has answered it: until then
    /// it answers UNAVAILABLE, so a test's first request waits for this.
    pub async fn wait_for_ready_pools(&self, n: usize, timeout: Duration) -> Result<Duration> {
        let what = format!("the gateway to list {MODEL} with {n} ready pools");
        let (_, took) = wait::until(&what, timeout, || async {
            match self.model_entry().await {
                Ok(Some(m)) if m.ready_pools as usize == n => Ok(()),
                Ok(other) => Err(format!("ListModels entry: {other:?}")),
                Err(e) => Err(format!("ListModels failed: {e:#}")),
            }
        })
        .await?;
        Ok(took)
    }
}

/// One `ferrite serve` process (gateway and worker in one, placement in process) of the
/// default model on free ports, with a KV cache of one full-length sequence.
#[derive(Debug)]
pub struct ServeProc {
    pub grpc: SocketAddr,
    pub http: SocketAddr,
    pub proc: Proc,
}

impl ServeProc {
    /// Starts it and waits for its `ready`.
    pub async fn start() -> Result<Self> {
        Self::start_with_env(&[]).await
    }

    /// [`ServeProc::start`] with `env` added to its environment.
    pub async fn start_with_env(env: &[(String, String)]) -> Result<Self> {
        Self::start_model(MODEL, env).await
    }

    /// [`ServeProc::start_with_env`] of `--model model`.
    pub async fn start_model(model: &str, env: &[(String, String)]) -> Result<Self> {
        let args = [
            "serve",
            "--model",
            model,
            "--grpc-listen",
            "127.0.0.1:0",
            "--http-listen",
            "127.0.0.1:0",
            "--kv-cache-mib",
            "400",
        ]
        .map(String::from);
        let mut proc = Proc::spawn_with_env("serve", &ferrite_bin()?, &args, env)?;
        let lines = proc.wait_ready(WORKER_READY_TIMEOUT).await?;
        Ok(Self {
            grpc: addr_after(&lines, "gRPC")?,
            http: addr_after(&lines, "HTTP")?,
            proc,
        })
    }
}

/// etcd + workers + gateway. Everything is killed (and etcd's data removed) on drop.
#[derive(Debug)]
pub struct Cluster {
    // Field order is drop order: the processes go before etcd.
    pub gateway: GatewayProc,
    pub workers: Vec<WorkerProc>,
    pub options: WorkerOptions,
    pub etcd: EtcdServer,
}

impl Cluster {
    /// Waits (up to 30 s) until the gateway's `/v1/models` lists every model of `names`.
    pub async fn wait_listed(&self, names: &[&str]) -> Result<()> {
        let listed = || async {
            let models = crate::http::get(self.gateway.http, "/v1/models").await;
            match models.and_then(|m| m.json()).map(|m| m.to_string()) {
                Ok(t) if names.iter().all(|n| t.contains(&format!("\"{n}\""))) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        };
        let what = format!("{names:?} listed");
        wait::until(&what, Duration::from_secs(30), listed)
            .await
            .map(|_| ())
    }

    /// Starts etcd, then one worker per pool and the gateway side by side, and waits until the
    /// gateway lists every pool as ready.
    pub async fn start(pools: &[&str], options: WorkerOptions) -> Result<Self> {
        Self::start_with(pools, options, &[]).await
    }

    /// [`Cluster::start`] with `gateway_env` added to the gateway's environment (its flags,
    /// as `FERRITE_…` variables).
    pub async fn start_with(
        pools: &[&str],
        options: WorkerOptions,
        gateway_env: &[(String, String)],
    ) -> Result<Self> {
        let etcd = tokio::task::spawn_blocking(EtcdServer::start)
            .await
            .context("starting etcd")?;
        let endpoint = etcd.endpoint();
        let gateway = GatewayProc::spawn_with_env(&endpoint, gateway_env)?;
        let spawned = pools
            .iter()
            .map(|pool| WorkerProc::spawn(&endpoint, pool, &options).map(|p| (*pool, p)))
            .collect::<Result<Vec<_>>>()?;
        let workers = futures::future::try_join_all(
            spawned
                .into_iter()
                .map(|(pool, p)| WorkerProc::ready(pool, p)),
        );
        let (workers, gateway) = tokio::try_join!(workers, GatewayProc::ready(gateway))?;
        let cluster = Self {
            gateway,
            workers,
            options,
            etcd,
        };
        cluster
            .wait_for_ready_pools(pools.len(), DISCOVERY_TIMEOUT)
            .await?;
        Ok(cluster)
    }

    pub fn worker(&self, pool: &str) -> &WorkerProc {
        self.workers
            .iter()
            .find(|w| w.pool == pool)
            .unwrap_or_else(|| panic!("no worker for pool {pool}"))
    }

    pub fn worker_mut(&mut self, pool: &str) -> &mut WorkerProc {
        self.workers
            .iter_mut()
            .find(|w| w.pool == pool)
            .unwrap_or_else(|| panic!("no worker for pool {pool}"))
    }

    /// A client of the gateway's public API.
    pub async fn inference(&self) -> Result<InferenceClient<Channel>> {
        Ok(InferenceClient::new(channel(self.gateway.grpc).await?))
    }

    /// The gateway's entry for [`MODEL`], if some pool of it is ready.
    pub async fn model_entry(&self) -> Result<Option<Model>> {
        self.gateway.model_entry().await
    }

    /// Waits until the cluster's gateway lists [`MODEL`] with `n` ready pools.
    pub async fn wait_for_ready_pools(&self, n: usize, timeout: Duration) -> Result<Duration> {
        self.gateway.wait_for_ready_pools(n, timeout).await
    }

    /// The pool whose worker runs a request, once one does (within `timeout`).
    pub async fn pool_running_a_request(&self, timeout: Duration) -> Result<String> {
        let (pool, _) = wait::until("a pool running the request", timeout, || async {
            for w in &self.workers {
                match w.load().await {
                    Ok(l) if l.running > 0 => return Ok(w.pool.clone()),
                    Ok(_) => {}
                    Err(e) => return Err(format!("GetLoad of {}: {e:#}", w.pool)),
                }
            }
            Err("no pool runs it".to_owned())
        })
        .await?;
        Ok(pool)
    }

    /// A placement store over this cluster's etcd, to look at the keys the workers wrote.
    pub async fn store(&self) -> Result<Store> {
        Ok(Store::connect(&self.etcd.endpoints(), PREFIX).await?)
    }

    pub fn schema(&self) -> KeySchema {
        KeySchema::new(PREFIX)
    }

    /// The keys of `pool` in etcd: `pools/{pool}` and everything under `pools/{pool}/`.
    pub async fn pool_keys(&self, store: &Store, pool: &str) -> Result<Vec<String>> {
        let schema = self.schema();
        let own = schema.pool(pool);
        let children = schema.pool_children_prefix(pool);
        Ok(store
            .get_prefix(&own)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| *k == own || k.starts_with(&children))
            .collect())
    }

    /// The `pools/{pool}` record in etcd, if there is one.
    pub async fn pool_record(&self, store: &Store, pool: &str) -> Result<Option<PoolRecord>> {
        let key = self.schema().pool(pool);
        let found = store.get_prefix(&key).await?;
        match found.into_iter().find(|(k, _)| *k == key) {
            Some((_, value)) => Ok(Some(
                serde_json::from_slice(&value).with_context(|| format!("the record of {key}"))?,
            )),
            None => Ok(None),
        }
    }
}
