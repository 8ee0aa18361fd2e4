//! `ferrite doctor`: checks a host before it serves, one line per check, each `ok`, `note`
//! (fine, but worth knowing) or `FIX` with what to do. What users of vLLM check by hand when a
//! multi-GPU set-up hangs: which devices the driver sees, which CUDA libraries load (and under
//! which names: NCCL's real soname is `libnccl.so.2`) at which versions, whether the ranks of
//! a pool can all-reduce on this host, and whether `/dev/shm` is large enough for NCCL.
//!
//! The all-reduce runs `--tp` real rank processes (`bench collective`), checked bit for bit;
//! on a GPU, NCCL all-reduces on it, eagerly and inside a CUDA graph ([`crate::doctor_gpu`]).
//! The exit status is 1 when any check says FIX.

use std::process::Command;

use anyhow::{Context, Result};
use clap::Args;
use ferrite_kernels::cuda::libs::{self, LibraryProbe};
use serde_json::json;

use crate::table::Table;

/// Less than this in `/dev/shm` and NCCL's shared-memory transport fails between the ranks
/// of one host (Docker's default is 64 MiB).
const SHM_MIN_BYTES: u64 = 1 << 30;

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Ranks of the all-reduce check: the pool size you mean to run.
    #[arg(long, default_value_t = 2)]
    tp: usize,
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Ok,
    Note,
    Fix,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Note => "note",
            Verdict::Fix => "FIX",
        }
    }
}

#[derive(Debug)]
struct Check {
    name: String,
    verdict: Verdict,
    detail: String,
}

fn check(name: &str, verdict: Verdict, detail: impl Into<String>) -> Check {
    Check {
        name: name.to_owned(),
        verdict,
        detail: detail.into(),
    }
}

pub fn run(args: DoctorArgs) -> Result<()> {
    let gpus = ferrite_kernels::device::cuda_devices();
    let mut checks = vec![cpu()];
    checks.push(match &gpus {
        Ok(d) => {
            let listed: Vec<String> = d.iter().map(ToString::to_string).collect();
            check("GPUs", Verdict::Ok, listed.join("; "))
        }
        Err(why) => check(
            "GPUs",
            Verdict::Note,
            format!("{why}: the CPU backend serves"),
        ),
    });
    let have_gpu = gpus.is_ok();
    checks.extend(libs::probe_all().iter().map(|p| library(p, have_gpu)));
    checks.push(shm(have_gpu));
    checks.push(all_reduce_cpu(args.tp));
    checks.push(if have_gpu {
        match crate::doctor_gpu::nccl_all_reduce() {
            Ok(detail) => check("all-reduce (GPU)", Verdict::Ok, detail),
            Err(e) => check(
                "all-reduce (GPU)",
                Verdict::Fix,
                format!("{e:#} (ranks sharing one GPU can still run with --collective host)"),
            ),
        }
    } else {
        check("all-reduce (GPU)", Verdict::Note, "not run: no GPU")
    });
    report(&checks, args.json);
    if checks.iter().any(|c| c.verdict == Verdict::Fix) {
        std::process::exit(1);
    }
    Ok(())
}

fn cpu() -> Check {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let isa = ferrite_kernels::quant::Isa::best();
    let panels = match ferrite_kernels::quant::panels_name(isa) {
        Some(p) => format!("int8 panels at {p}"),
        None => "no int8 panels (batches of GGUF blocks in f32)".into(),
    };
    check(
        "CPU",
        Verdict::Ok,
        format!("{cores} cores, kernels for {isa}, {panels}"),
    )
}

/// A library's line: needed only where there is a GPU (NVRTC also compiles kernels ahead of
/// time without one).
fn library(p: &LibraryProbe, have_gpu: bool) -> Check {
    match p.found {
        Some(name) => {
            let version = p.version.as_deref().unwrap_or("version unknown");
            check(p.what, Verdict::Ok, format!("{version} ({name})"))
        }
        None => {
            let fix = match p.what {
                "CUDA driver" => "install the NVIDIA driver (nvidia-smi must work)".to_owned(),
                "NCCL" => "pip install nvidia-nccl-cu13 (or apt install libnccl2) and put its lib directory on LD_LIBRARY_PATH".into(),
                "NVRTC" => "pip install nvidia-cuda-nvrtc and put nvidia/cu13/lib on LD_LIBRARY_PATH".into(),
                _ => "pip install nvidia-cublas and put nvidia/cu13/lib on LD_LIBRARY_PATH".into(),
            };
            let verdict = if have_gpu {
                Verdict::Fix
            } else {
                Verdict::Note
            };
            let tried = p.tried.join(", ");
            check(p.what, verdict, format!("not found (tried {tried}): {fix}"))
        }
    }
}

/// `/dev/shm`'s size, from `df` (coreutils, on every Linux host).
fn shm(have_gpu: bool) -> Check {
    let size = Command::new("df")
        .args(["-B1", "--output=size", "/dev/shm"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.lines().nth(1).and_then(|l| l.trim().parse::<u64>().ok()));
    match size {
        Some(b) if b >= SHM_MIN_BYTES => check("/dev/shm", Verdict::Ok, gib(b)),
        Some(b) => check(
            "/dev/shm",
            if have_gpu {
                Verdict::Fix
            } else {
                Verdict::Note
            },
            format!(
                "{}: NCCL needs ≥ 1 GiB between the ranks of a host (docker run --shm-size=1g; \
                 Kubernetes: an emptyDir with medium Memory at /dev/shm)",
                gib(b)
            ),
        ),
        None => check("/dev/shm", Verdict::Note, "not mounted (or df failed)"),
    }
}

fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// An all-reduce across `tp` rank processes of this binary over the CPU backend, checked bit
/// for bit by every rank.
fn all_reduce_cpu(tp: usize) -> Check {
    let name = "all-reduce (CPU)";
    let ran = std::env::current_exe()
        .context("finding the ferrite binary")
        .and_then(|exe| {
            Command::new(exe)
                .args(["bench", "collective", "--tp", &tp.to_string()])
                .args(["--sizes", "1M", "--iters", "5", "--json"])
                .output()
                .context("starting the ranks")
        });
    let out = match ran {
        Ok(o) if o.status.success() => o,
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().last().unwrap_or("no error printed");
            return check(name, Verdict::Fix, format!("{tp} ranks failed: {last}"));
        }
        Err(e) => return check(name, Verdict::Fix, format!("{e:#}")),
    };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    match v["rows"][0]["time_us"].as_f64() {
        Some(us) => check(
            name,
            Verdict::Ok,
            format!("{tp} rank processes, 1 MiB in {us:.0} µs, sums exact"),
        ),
        None => check(name, Verdict::Fix, format!("no result from the ranks: {v}")),
    }
}

fn report(checks: &[Check], as_json: bool) {
    if as_json {
        let rows: Vec<_> = checks
            .iter()
            .map(|c| json!({ "check": c.name, "verdict": c.verdict.as_str(), "detail": c.detail }))
            .collect();
        println!("{}", json!({ "checks": rows }));
        return;
    }
    let mut t = Table::new(&["", "check", "detail"]);
    for c in checks {
        t.row(vec![
            c.verdict.as_str().into(),
            c.name.clone(),
            c.detail.clone(),
        ]);
    }
    println!("{}", t.render());
}
