//! `ferrite bench collective`: all-reduce time and bandwidth per message size across N rank
//! processes on this machine, in nccl-tests' columns (size, count, type, time, algbw, busbw).
//!
//! Each rank is a process of its own (`ferrite bench collective-rank`), joined over the chosen
//! backend exactly as the ranks of a pool are. Every rank checks the first result of each size
//! bit for bit against the sum in rank order it computes itself, so the table is only printed
//! for a collective that is right.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Args;
use ferrite_collective::Collective;
use ferrite_collective::tcp::{JoinLimits, PoolKey, TcpCollective};
use serde_json::json;

use crate::table::Table;

/// The bench's ranks are started together by rank 0 (one epoch; no earlier pool to refuse).
const BENCH_EPOCH: u64 = 1;

/// Warm-up all-reduces per size (the first one is also checked).
const WARMUPS: usize = 2;

#[derive(Debug, Clone, Args)]
pub struct CollectiveArgs {
    /// `cpu` (f32 over TCP, as the CPU pools), `host` (f16 on GPUs, through the host and
    /// TCP, as ranks sharing a GPU) or `nccl` (f16 on GPUs, one per rank).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "host", "nccl"])]
    backend: String,
    /// Ranks.
    #[arg(long, default_value_t = 2)]
    tp: usize,
    /// Message sizes in bytes (K and M suffixes: 1024 and 1024²).
    #[arg(long, default_value = "4K,64K,1M,16M", value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<usize>,
    /// Timed all-reduces per size.
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// How long a rank may wait for another before the collective fails, naming it.
    #[arg(long, default_value_t = 10)]
    timeout_s: u64,
    #[arg(long)]
    json: bool,
}

/// One rank of `bench collective` (started by it, or by hand on several hosts).
#[derive(Debug, Args)]
pub struct RankArgs {
    #[arg(long)]
    rank: usize,
    #[arg(long)]
    world: usize,
    /// Rank 0 listens here; the others connect to it.
    #[arg(long)]
    leader: SocketAddr,
    #[command(flatten)]
    bench: CollectiveArgs,
}

fn parse_size(s: &str) -> Result<usize, String> {
    let (num, mult) = match s.trim().to_ascii_uppercase() {
        t if t.ends_with('M') => (t[..t.len() - 1].to_owned(), 1 << 20),
        t if t.ends_with('K') => (t[..t.len() - 1].to_owned(), 1 << 10),
        t => (t, 1),
    };
    let n: usize = num.parse().map_err(|e| format!("size {s:?}: {e}"))?;
    if n == 0 || !(n * mult).is_multiple_of(4) {
        return Err(format!(
            "size {s:?}: a positive multiple of 4 bytes (f32 elements)"
        ));
    }
    Ok(n * mult)
}

/// Rank `rank`'s input: different on every rank, reproducible everywhere.
fn values(rank: usize, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((rank * 7919 + i) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// The sum every rank must get: ranks added in order, in f32, as the backend adds them.
fn expected(world: usize, n: usize) -> Vec<f32> {
    let mut sum = values(0, n);
    for r in 1..world {
        for (s, x) in sum.iter_mut().zip(values(r, n)) {
            *s += x;
        }
    }
    sum
}

/// One row: (bytes, seconds per all-reduce).
fn measure(c: &mut dyn Collective, bytes: usize, iters: usize) -> Result<f64> {
    let n = bytes / 4;
    let mut buf = values(c.rank(), n);
    c.all_reduce_sum(&mut buf)?;
    if buf != expected(c.world(), n) {
        bail!(
            "rank {}: the all-reduce of {bytes} bytes gave a wrong sum",
            c.rank()
        );
    }
    for _ in 1..WARMUPS {
        c.all_reduce_sum(&mut buf)?;
    }
    c.barrier()?;
    let started = Instant::now();
    for _ in 0..iters {
        c.all_reduce_sum(&mut buf)?;
    }
    Ok(started.elapsed().as_secs_f64() / iters.max(1) as f64)
}

/// Runs one rank; rank 0 prints the table.
pub fn rank(args: RankArgs) -> Result<()> {
    let b = &args.bench;
    let timeout = Duration::from_secs(b.timeout_s);
    let key = PoolKey {
        world: args.world,
        epoch: BENCH_EPOCH,
        secret: Vec::new(),
    };
    let mut c = if args.rank == 0 {
        let listener = TcpListener::bind(args.leader)
            .with_context(|| format!("rank 0 listening on {}", args.leader))?;
        TcpCollective::lead(listener, &key, timeout, timeout)?
    } else {
        let limits = JoinLimits::new(timeout, timeout);
        TcpCollective::join(args.leader, args.rank, &key, limits)?
    };
    let formed = format!("rank {} of {}: formed", args.rank, args.world);
    ferrite_telemetry::notice("info", &formed);
    let rows = match b.backend.as_str() {
        "cpu" => b
            .sizes
            .iter()
            .map(|&bytes| Ok((bytes, measure(&mut c, bytes, b.iters)?)))
            .collect::<Result<Vec<_>>>()?,
        gpu => crate::bench_collective_gpu::rows(gpu, &mut c, &b.sizes, b.iters, timeout)?,
    };
    if args.rank == 0 {
        print_rows(&rows, args.world, &b.backend, b.json);
    }
    Ok(())
}

fn print_rows(rows: &[(usize, f64)], world: usize, backend: &str, as_json: bool) {
    // The CPU pools reduce f32; the GPU pools their 16-bit activations.
    let (ty, elem) = if backend == "cpu" {
        ("float", 4)
    } else {
        ("half", 2)
    };
    // nccl-tests' bus bandwidth of an all-reduce: algbw · 2(n-1)/n.
    let bus = 2.0 * (world as f64 - 1.0) / world as f64;
    let cells: Vec<(usize, f64, f64, f64)> = rows
        .iter()
        .map(|&(bytes, secs)| {
            let algbw = bytes as f64 / secs / 1e9;
            (bytes, secs * 1e6, algbw, algbw * bus)
        })
        .collect();
    if as_json {
        let rows: Vec<_> = cells
            .iter()
            .map(|&(size, us, alg, busbw)| json!({ "size": size, "count": size / elem, "type": ty, "redop": "sum", "time_us": us, "algbw_gb_s": alg, "busbw_gb_s": busbw, "correct": true }))
            .collect();
        println!(
            "{}",
            json!({ "backend": backend, "ranks": world, "rows": rows })
        );
        return;
    }
    let mut t = Table::new(&[
        "size (B)",
        "count",
        "type",
        "redop",
        "time (us)",
        "algbw (GB/s)",
        "busbw (GB/s)",
    ]);
    for (size, us, alg, busbw) in cells {
        t.row(vec![
            size.to_string(),
            (size / elem).to_string(),
            ty.into(),
            "sum".into(),
            format!("{us:.1}"),
            format!("{alg:.3}"),
            format!("{busbw:.3}"),
        ]);
    }
    let how = match backend {
        "cpu" => "cpu (TCP)",
        "host" => "host (GPU → host → TCP → GPU)",
        _ => "nccl (on the GPU)",
    };
    println!("all-reduce, backend {how}, {world} rank processes on this machine");
    println!("{}", t.render());
}

/// `bench collective`: starts `--tp` rank processes and passes rank 0's table through.
pub fn run(args: CollectiveArgs) -> Result<()> {
    if args.tp == 0 {
        bail!("--tp must be at least 1");
    }
    // A free loopback port for rank 0 (released again just before rank 0 binds it).
    let leader = TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let exe = std::env::current_exe().context("finding the ferrite binary")?;
    let mut ranks = Vec::new();
    for r in 0..args.tp {
        let mut cmd = Command::new(&exe);
        cmd.args(["bench", "collective-rank", "--rank", &r.to_string()])
            .args([
                "--world",
                &args.tp.to_string(),
                "--leader",
                &leader.to_string(),
            ])
            .args([
                "--backend",
                &args.backend,
                "--iters",
                &args.iters.to_string(),
            ])
            .args(["--timeout-s", &args.timeout_s.to_string()])
            .arg(format!(
                "--sizes={}",
                args.sizes
                    .iter()
                    .map(usize::to_string)
                    .collect::<Vec<_>>()
                    .join(",")
            ))
            .stdout(if r == 0 {
                Stdio::piped()
            } else {
                Stdio::null()
            });
        if args.json {
            cmd.arg("--json");
        }
        ranks.push(cmd.spawn().with_context(|| format!("starting rank {r}"))?);
    }
    let out = ranks[0].stdout.take().context("rank 0's output")?;
    for line in BufReader::new(out).lines() {
        println!("{}", line?);
    }
    let mut failed = Vec::new();
    for (r, mut child) in ranks.into_iter().enumerate() {
        if !child.wait()?.success() {
            failed.push(r);
        }
    }
    if !failed.is_empty() {
        bail!("ranks {failed:?} failed (their errors are above)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes_and_must_hold_whole_floats() {
        assert_eq!(parse_size("4K"), Ok(4096));
        assert_eq!(parse_size("16m"), Ok(16 << 20));
        assert_eq!(parse_size("8"), Ok(8));
        assert!(parse_size("6").is_err());
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
    }
}
