//! The rank processes of `ferrite serve --tp N` (and of the benches' `--tp N`, whose engine
//! [`pool_engine`] makes): ranks 1..N of the
//! pool whose rank 0 is the launching process itself, started as `ferrite worker` processes of
//! the same binary.
//!
//! They are handed rank 0's listener on their command line (`--comm-join`), since `serve`'s
//! placement store usually lives inside its own process; with `--etcd` they also register
//! their rank keys there. Their start-up traces join `serve`'s (`TRACEPARENT`), and each gets
//! an equal share of the cores, so the ranks of one host do not fight over them. They are
//! killed when `serve` ends; if `serve` is killed outright, they see their leader gone and
//! exit by themselves.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use ferrite_engine::engine::Engine;
use ferrite_engine::executor::Executor;
use ferrite_engine::tp::TpRank;
use ferrite_placement::CommRecord;
use ferrite_worker::CommLeader;

use crate::loading::ModelArgs;
use crate::placement_args::PlacementArgs;

/// What the rank processes need to know.
#[derive(Debug)]
pub struct RankLaunch<'a> {
    pub model: &'a ModelArgs,
    pub pool: &'a str,
    pub world: u32,
    pub record: &'a CommRecord,
    /// The pool's secret (handed over in the environment, not on the command line).
    pub secret: &'a str,
    /// Where they register their rank keys; `None`: nowhere (placement in the launcher).
    pub placement: Option<&'a PlacementArgs>,
    pub otlp_endpoint: Option<&'a str>,
}

/// A new random secret for a pool this process starts (hex, 256 bits from the OS).
pub fn fresh_secret() -> String {
    let mut bytes = [0u8; 32];
    let read = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes));
    if read.is_err() {
        // No /dev/urandom: the process's random hasher keys and the clock, as the epoch has.
        use std::hash::{BuildHasher, Hasher};
        for chunk in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            h.write_u128(nanos);
            chunk.copy_from_slice(&h.finish().to_le_bytes());
        }
    }
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The cores each rank's thread pool gets on this host.
pub fn threads_per_rank(world: u32) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cores / world.max(1) as usize).max(1)
}

/// Ranks 1..N, running; killed when dropped. (`std::process`: tokio's `process` feature
/// would be unified into every crate's tokio and rebuild them.)
#[derive(Debug)]
pub struct RankProcesses {
    children: Vec<Child>,
}

impl RankProcesses {
    pub fn spawn(l: &RankLaunch<'_>) -> Result<Self> {
        let exe = std::env::current_exe().context("finding the ferrite binary")?;
        let trace = ferrite_telemetry::propagation::env_for_child(&tracing::Span::current());
        let mut children = Vec::new();
        for rank in 1..l.world {
            let mut cmd = Command::new(&exe);
            if let Some(e) = l.otlp_endpoint {
                cmd.args(["--otlp-endpoint", e]);
            }
            cmd.arg("worker")
                .args(["--pool", l.pool])
                .args(["--rank", &rank.to_string(), "--tp", &l.world.to_string()])
                .args(["--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"])
                .args(["--comm-join", &l.record.address])
                .args(["--comm-epoch", &l.record.epoch.to_string()])
                .args(l.model.to_args())
                .envs(trace.iter().map(|(k, v)| (k, v)))
                .env("RAYON_NUM_THREADS", threads_per_rank(l.world).to_string())
                .env("FERRITE_COMM_SECRET", l.secret)
                // Its "ready" is not serve's: only its notices (stderr) pass through.
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::inherit());
            if let Some(p) = l.placement.filter(|p| !p.etcd.is_empty()) {
                cmd.args(["--etcd", &p.etcd.join(",")])
                    .args(["--prefix", &p.prefix]);
            }
            let child = cmd
                .spawn()
                .with_context(|| format!("starting rank {rank} ({})", exe.display()))?;
            children.push(child);
        }
        Ok(Self { children })
    }

    /// The ranks' process ids, rank 1 first.
    pub fn pids(&self) -> Vec<u32> {
        self.children.iter().map(Child::id).collect()
    }

    /// Resolves when any rank exits, saying which and how (its error is on stderr).
    pub async fn first_exit(&mut self) -> String {
        loop {
            for (i, c) in self.children.iter_mut().enumerate() {
                if let Ok(Some(status)) = c.try_wait() {
                    return format!("rank {} exited ({status})", i + 1);
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Waits (at most `limit`) for the ranks to exit after the leader stopped the pool.
    pub async fn wait_exit(mut self, limit: Duration) {
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline {
            let mut running = 0;
            for c in &mut self.children {
                running += usize::from(matches!(c.try_wait(), Ok(None)));
            }
            if running == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for RankProcesses {
    fn drop(&mut self) {
        for c in &mut self.children {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
            }
            let _ = c.wait();
        }
    }
}

/// An engine for a bench (`bench decode`, `bench latency`): the whole model here (`tp` ≤ 1), or rank 0 of a pool of `tp` rank
/// processes (returned too: they are killed when dropped), as `serve --tp N` runs one. Also
/// returns the model's linear-layer storage (a row label's default).
pub(crate) fn pool_engine(
    model_args: &ModelArgs,
    tp: u32,
) -> Result<(Engine, Option<RankProcesses>, String)> {
    if tp <= 1 {
        let (model, ..) = model_args.load_for_engine()?;
        let storage = model.linear_storage();
        // Token ids only: dummy-weight models have no tokenizer.
        let cfg = model_args.engine_config(&model)?;
        return Ok((Engine::new(model, vec![], cfg)?, None, storage));
    }
    let threads = threads_per_rank(tp);
    // Fails only if the pool was already built, which keeps that one.
    let _ = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build_global();
    let leader = CommLeader::bind(([127, 0, 0, 1], 0).into(), None, tp)?;
    let secret = fresh_secret();
    let ranks = RankProcesses::spawn(&RankLaunch {
        model: model_args,
        pool: "bench",
        world: tp,
        record: leader.record(),
        secret: &secret,
        placement: None,
        otlp_endpoint: None,
    })?;
    let (model, ..) = model_args.load_shard_for_engine(TpRank::new(0, tp as usize)?)?;
    let storage = model.linear_storage();
    let cfg = model_args.engine_config(&model)?;
    let comm = leader.accept_now(
        Duration::from_secs(300),
        Duration::from_secs(30),
        secret.into_bytes(),
    )?;
    let exec = Executor::new(model, &cfg, comm)?;
    Ok((
        Engine::from_executor(exec, vec![], &cfg)?,
        Some(ranks),
        storage,
    ))
}
