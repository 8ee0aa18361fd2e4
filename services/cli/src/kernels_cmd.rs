//! `ferrite kernels build`: compiles every CUDA kernel module with NVRTC into the CUBIN cache,
//! for this machine's GPU or a named arch — so a container image or a fresh node can be warmed
//! before its first start, and so the kernels can be checked on a machine without a GPU.

use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::{Args, Subcommand};
use ferrite_engine::model::STARTUP_TARGET;
use ferrite_kernels::cuda::{self, KernelCache, ModuleBuild};
use serde_json::json;

use crate::table::Table;

#[derive(Debug, Subcommand)]
pub enum KernelsCommand {
    /// Compile (or find in the cache) every kernel module, in a `kernel_compile` span.
    Build(BuildArgs),
}

#[derive(Debug, Args)]
pub struct BuildArgs {
    /// Target arch (e.g. sm_90); default: that of cuda:0.
    #[arg(long)]
    arch: Option<String>,
    /// Default: $FERRITE_KERNEL_CACHE, else ~/.cache/ferrite/kernels.
    #[arg(long)]
    cache_dir: Option<PathBuf>,
    #[arg(long)]
    json: bool,
}

pub fn run(cmd: KernelsCommand) -> Result<()> {
    match cmd {
        KernelsCommand::Build(args) => build(args),
    }
}

fn build(args: BuildArgs) -> Result<()> {
    let arch = match args.arch {
        Some(a) if a.starts_with("sm_") && a.len() > 3 => a,
        Some(a) => bail!("--arch {a}: expected an arch such as sm_90"),
        None => {
            let devices = ferrite_kernels::device::cuda_devices()
                .map_err(|why| anyhow::anyhow!("{why}; name the target with --arch sm_90"))?;
            let d = devices
                .first()
                .context("no CUDA device; name the target with --arch")?;
            cuda::arch_of(d.compute_capability)
        }
    };
    let dir = args.cache_dir.unwrap_or_else(cuda::default_cache_dir);
    let builds = compile_all(&dir, &arch)?;
    if args.json {
        let rows: Vec<_> = builds
            .iter()
            .map(|b| json!({"module": b.module, "hit": b.hit, "cubin_bytes": b.cubin_bytes, "seconds": b.seconds}))
            .collect();
        println!(
            "{}",
            json!({"arch": arch, "cache_dir": dir, "modules": rows})
        );
        return Ok(());
    }
    println!("arch {arch}, cache {}", dir.display());
    let mut table = Table::new(&["module", "cache", "cubin bytes", "ms"]);
    for b in &builds {
        table.row(vec![
            b.module.to_owned(),
            if b.hit { "hit" } else { "miss" }.to_owned(),
            b.cubin_bytes.to_string(),
            format!("{:.1}", b.seconds * 1e3),
        ]);
    }
    print!("{}", table.render());
    Ok(())
}

/// The `kernel_compile` phase: every module from the cache or NVRTC, with the hit and miss
/// counts on the span.
pub fn compile_all(dir: &std::path::Path, arch: &str) -> Result<Vec<ModuleBuild>> {
    let span = tracing::info_span!(target: STARTUP_TARGET, "kernel_compile",
        arch, modules = cuda::MODULES.len(), hits = tracing::field::Empty,
        misses = tracing::field::Empty, nvrtc = tracing::field::Empty);
    let _entered = span.enter();
    let cache = KernelCache::new(dir, arch)?;
    let (major, minor) = cache.nvrtc_version();
    span.record("nvrtc", format!("{major}.{minor}"));
    let builds: Vec<ModuleBuild> = cuda::build_modules(&cache)?
        .into_iter()
        .map(|(_, b)| b)
        .collect();
    let hits = builds.iter().filter(|b| b.hit).count();
    span.record("hits", hits as i64);
    span.record("misses", (builds.len() - hits) as i64);
    Ok(builds)
}
