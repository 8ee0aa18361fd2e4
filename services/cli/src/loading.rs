//! Resolving `--model` and loading it, with the shared engine flags.

use anyhow::{Context, Result};
use clap::Args;
use std::sync::{Arc, OnceLock};

use ferrite_engine::engine::{CudaPlacement, Engine, EngineConfig, Speculation};
use ferrite_engine::gpu::{self, GpuOptions};
use ferrite_engine::model::STARTUP_TARGET;
use ferrite_engine::model::kv::KvDtype;
use ferrite_engine::model::pooling::Pooling;
use ferrite_engine::model::{self, EngineModel, LoadOptions, LoadQuantize, LoadedModel};
use ferrite_engine::registry;
use ferrite_engine::tp::TpRank;
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::{self, Gpu};
use ferrite_kernels::device::{self, Device, DeviceRequest};
use ferrite_kernels::quant::GgmlActivations;
use tracing::field::Empty;

/// What [`ModelArgs::load_for_engine`] gives: what an engine is built from, the tokenizer,
/// and how embeddings are pooled.
pub type ForEngine = (EngineModel, Option<ferrite_text::Tokenizer>, Pooling);

/// Flags every command that runs a model takes.
#[derive(Debug, Clone, Args)]
pub struct ModelArgs {
    /// A .gguf file, a Hugging Face model directory, a Hugging Face Hub repository (`org/name[@revision][:quant]`, fetched into the Hub's cache), or a known model name (`ferrite model list`).
    #[arg(long, default_value = registry::DEFAULT_MODEL, env = "FERRITE_MODEL")]
    pub model: String,
    /// Context length (prompt + output) in tokens; default: the model's, capped at 8192.
    #[arg(long, env = "FERRITE_MAX_MODEL_LEN")]
    pub max_model_len: Option<usize>,
    /// Memory for the KV cache on the CPU, in MiB (like vLLM's `VLLM_CPU_KVCACHE_SPACE`).
    #[arg(long, default_value_t = 1024, env = "FERRITE_KV_CACHE_MIB")]
    pub kv_cache_mib: usize,
    /// Fraction of GPU memory the process may use (weights, activations, KV cache). Applies to
    /// CUDA devices; the CPU backend sizes its KV cache with --kv-cache-mib.
    #[arg(long, default_value_t = 0.9, value_parser = fraction, env = "FERRITE_GPU_MEMORY_UTILIZATION")]
    pub gpu_memory_utilization: f64,
    /// Tokens per step (chunked prefill budget).
    #[arg(long, default_value_t = 512, env = "FERRITE_MAX_NUM_BATCHED_TOKENS")]
    pub max_num_batched_tokens: usize,
    /// Sequences running at once at most.
    #[arg(long, default_value_t = 64, env = "FERRITE_MAX_NUM_SEQS")]
    pub max_num_seqs: usize,
    /// Quantize the layers' weights at load by round-to-nearest: rtn-w<bits>g<group> or
    /// rtn-w<bits>pc (per-channel), bits 8, 4, 3 or 2, groups 32, 64 or 128, optionally -sym
    /// (no zero points) and -bf16 (bf16 scales), e.g. rtn-w4g128, rtn-w8pc-sym; or rtn-w8a8
    /// (int8 weights per channel, int8 activations per token) or rtn-fp8 (e4m3 weights per
    /// channel, FP8 activations per token). With --load-format dummy on a GPU: random codes
    /// of that format.
    #[arg(long, value_parser = model::parse_quantize, env = "FERRITE_QUANTIZE")]
    pub quantize: Option<LoadQuantize>,
    /// `auto`: a file or directory checkpoint; `dummy`: random weights of the shape --model
    /// names (a preset: `ferrite model list`), for speed measurements without a download.
    #[arg(long, value_enum, default_value = "auto", env = "FERRITE_LOAD_FORMAT")]
    pub load_format: LoadFormat,
    /// cpu, cuda, cuda:N, or auto (cuda:0 where a GPU works, else the CPU, saying why). With
    /// `--load-format dummy` on a GPU the random weights are made there, with no host copy.
    #[arg(long, default_value = "auto", env = "FERRITE_DEVICE")]
    pub device: DeviceRequest,
    /// The 16-bit type of weights and activations on a GPU: auto (the checkpoint's BF16, else
    /// float16), float16 or bfloat16.
    #[arg(long, value_enum, default_value = "auto", env = "FERRITE_DTYPE")]
    pub dtype: DtypeArg,
    /// On a GPU, run decode steps eagerly instead of replaying captured CUDA graphs.
    #[arg(long, env = "FERRITE_ENFORCE_EAGER")]
    pub enforce_eager: bool,
    /// Plan each step while the device runs the one before (`on`), or only once it has run
    /// (`off`); `auto`: on a GPU only, as the CPU's forward runs on the thread that plans and
    /// leaves nothing to overlap.
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "FERRITE_ASYNC_SCHEDULING"
    )]
    pub async_scheduling: OnOffAuto,
    /// Recompute every prompt from scratch instead of reusing the KV blocks of prefixes
    /// computed before (prefix caching is on by default).
    #[arg(long, env = "FERRITE_NO_PREFIX_CACHING")]
    pub no_prefix_caching: bool,
    /// On the CPU, how GGUF block-quantized weights (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K)
    /// multiply activations: `int8` (the default: a one-token step's rounded per block of 32
    /// and multiplied in integers, as llama.cpp does, logits moving by up to ~2.5%; prompts
    /// and batches, on x86 CPUs with AVX2 (Q8_0 with VNNI only), in two int8 terms,
    /// close to exact) or `f32` (exact: what the golden tests hold against transformers).
    #[arg(
        long,
        value_enum,
        default_value = "int8",
        env = "FERRITE_CPU_ACTIVATIONS"
    )]
    pub cpu_activations: CpuActivations,
    /// What the KV cache stores: `auto` (f16 on the CPU; on a GPU the weights' 16-bit type),
    /// `f16` (on the CPU half the memory of f32, so twice the tokens in --kv-cache-mib, and
    /// half the bytes attention reads, each value rounded once, as llama.cpp's default cache;
    /// on a GPU with --dtype float16 only), `fp8` (on the CPU: FP8 e4m3, vLLM's `fp8` cache
    /// of scale 1, a quarter of f32's bytes: twice f16's tokens), or `f32` (the CPU's exact
    /// path: with --cpu-activations f32, what the golden tests hold against transformers).
    #[arg(
        long,
        value_enum,
        default_value = "auto",
        env = "FERRITE_KV_CACHE_DTYPE"
    )]
    pub kv_cache_dtype: KvCacheDtype,
    /// How the ranks of a `--tp` pool on GPUs exchange activations: `auto` (NCCL when every
    /// rank has a GPU of its own, `host` when ranks share one), `nccl`, `host` (through host
    /// memory and the pool's TCP link: slow, eager only, but N ranks may share one GPU), or
    /// `tcp` (the CPU's; on a GPU the same as host). On the CPU only `tcp` exists.
    #[arg(long, value_enum, default_value = "auto", env = "FERRITE_COLLECTIVE")]
    pub collective: CollectiveArg,
    /// The GPUs of a pool's ranks, by ordinal, rank 0 first (`--devices 0,1,2,3`): rank r
    /// runs on `cuda:<the r-th>`. Unset: every rank on `--device`. Ignored with `--device cpu`.
    #[arg(long, value_delimiter = ',', env = "FERRITE_DEVICES")]
    pub devices: Vec<usize>,
    /// Speculative decoding by n-gram lookup (vLLM's `ngram` method): each decoding sequence
    /// guesses up to this many next tokens from where its last tokens occurred before in its
    /// context, and a step checks them together, keeping the output that decoding one token at
    /// a time gives (exactly with `--cpu-activations f32`; under int8 a step of several rows
    /// rounds as a batch does). Pays where outputs repeat their context. 0: off. Not with
    /// `--async-scheduling on` (`auto` is then off).
    #[arg(long, default_value_t = 0, env = "FERRITE_NUM_SPECULATIVE_TOKENS")]
    pub num_speculative_tokens: usize,
    /// The longest run of a sequence's last tokens looked up in its context (tried first).
    #[arg(long, default_value_t = 4, env = "FERRITE_PROMPT_LOOKUP_MAX")]
    pub prompt_lookup_max: usize,
    /// The shortest run looked up.
    #[arg(long, default_value_t = 2, env = "FERRITE_PROMPT_LOOKUP_MIN")]
    pub prompt_lookup_min: usize,
    /// A LoRA adapter served beside the model, as NAME=PATH: a directory PEFT saved
    /// (adapter_config.json and adapter_model.safetensors), a GGUF LoRA file (llama.cpp's
    /// convert_lora_to_gguf.py writes them), or a Hugging Face Hub repository of either
    /// (org/name[@revision][:file.gguf], fetched into the Hub's cache); repeat for more. Requests ask for one by giving
    /// NAME as their model; every adapter is held in memory and any mix of them and the base
    /// shares a batch. CPU only for now.
    #[arg(long = "lora-modules", value_parser = lora_module, num_args = 1..)]
    pub lora_modules: Vec<LoraModule>,
    /// Serve a causal LM as a sequence classifier whose labels are these tokens, as its
    /// vocabulary spells them (`--classifier-from-tokens no,yes`; vLLM's
    /// `classifier_from_token`): its head is the LM head's rows of them. Two tokens make a
    /// reranker of one label, scoring a pair by the second token's probability over the two
    /// (Qwen3-Reranker's `no,yes`). Such a pool answers /v1/rerank, /v1/score and /classify,
    /// and generates no text.
    #[arg(long, value_delimiter = ',', env = "FERRITE_CLASSIFIER_FROM_TOKENS")]
    pub classifier_from_tokens: Vec<String>,
    /// How a reranker's query and document become one prompt: a built-in template
    /// (`qwen3-reranker`: the prompt Qwen3-Reranker's model card builds) or a Jinja file,
    /// rendered with two messages of roles `query` and `document` (as vLLM's score
    /// templates). Unset: the pair is joined as the tokenizer joins a pair.
    #[arg(long, env = "FERRITE_SCORE_TEMPLATE")]
    pub score_template: Option<String>,

    /// A reasoning model's parser (vLLM's names): its thinking between `<think>` and
    /// `</think>` comes apart from its answer (`reasoning` beside `content`), and a request's
    /// grammar holds the answer only. `deepseek_r1` (DeepSeek-R1, QwQ) and `deepseek_v3`
    /// (DeepSeek-V3.1): the output starts thinking unless the prompt closed the block;
    /// `qwen3` and `glm45`: thinking only where the output's first token or the prompt opens
    /// it. `openai_gptoss` (gpt-oss, its default): the `analysis` channel's messages are the
    /// thinking, the `final` channel's the answer.
    #[arg(long, env = "FERRITE_REASONING_PARSER",
          value_parser = clap::builder::PossibleValuesParser::new(ferrite_text::reasoning::PARSERS))]
    pub reasoning_parser: Option<String>,

    /// Variables the chat template gets unless a request's `chat_template_kwargs` sets them,
    /// as a JSON object: `{"enable_thinking": false}` serves Qwen3 without thinking.
    #[arg(long, env = "FERRITE_DEFAULT_CHAT_TEMPLATE_KWARGS",
          value_parser = template_kwargs)]
    pub default_chat_template_kwargs: Option<String>,
}

/// `--default-chat-template-kwargs`: a JSON object, checked at start-up.
fn template_kwargs(s: &str) -> std::result::Result<String, String> {
    ferrite_text::chat::parse_kwargs(s)
        .map(|_| s.to_owned())
        .map_err(|e| e.to_string())
}

/// A LoRA adapter of `--lora-modules`: the name requests ask for, and where it is (a path,
/// or a Hugging Face Hub repository).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraModule {
    pub name: String,
    pub path: String,
}

fn lora_module(s: &str) -> Result<LoraModule, String> {
    let (name, path) = s
        .split_once('=')
        .filter(|(n, p)| !n.is_empty() && !p.is_empty())
        .ok_or_else(|| format!("`{s}`: give NAME=PATH"))?;
    Ok(LoraModule {
        name: name.to_owned(),
        path: path.to_owned(),
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvCacheDtype {
    Auto,
    F32,
    F16,
    /// FP8 e4m3 (vLLM's `fp8`).
    #[value(alias = "fp8_e4m3", alias = "fp8-e4m3")]
    Fp8,
}

impl KvCacheDtype {
    /// The CPU cache's dtype; on a GPU (`gpu`: the weights' dtype), a check that the cache
    /// there holds what was asked.
    fn resolve(self, gpu: Option<Dtype>) -> Result<KvDtype> {
        match (self, gpu) {
            (KvCacheDtype::F32, None) => Ok(KvDtype::F32),
            (KvCacheDtype::Auto | KvCacheDtype::F16, None) => Ok(KvDtype::F16),
            (KvCacheDtype::Fp8, None) => Ok(KvDtype::Fp8),
            (KvCacheDtype::Auto, Some(_)) | (KvCacheDtype::F16, Some(Dtype::F16)) => {
                Ok(KvDtype::default())
            }
            (asked, Some(d)) => anyhow::bail!(
                "--kv-cache-dtype {}: on a GPU the KV cache holds the weights' type ({d:?}); \
                 use auto, or f16 with --dtype float16",
                value_name(asked)
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CpuActivations {
    F32,
    Int8,
}

impl From<CpuActivations> for GgmlActivations {
    fn from(a: CpuActivations) -> Self {
        match a {
            CpuActivations::F32 => Self::F32,
            CpuActivations::Int8 => Self::Int8,
        }
    }
}

/// Where the sampling defaults of a served model come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum GenerationConfig {
    /// The model's own recommendation: its generation_config.json, its GGUF metadata, or the
    /// card of a known model.
    Auto,
    /// None: temperature 1 and no truncation unless a request says otherwise.
    None,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum CollectiveArg {
    Auto,
    Nccl,
    Host,
    Tcp,
}

impl From<CollectiveArg> for gpu::CollectiveKind {
    fn from(c: CollectiveArg) -> Self {
        match c {
            CollectiveArg::Auto => Self::Auto,
            CollectiveArg::Nccl => Self::Nccl,
            CollectiveArg::Host => Self::Host,
            CollectiveArg::Tcp => Self::Tcp,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnOffAuto {
    Auto,
    On,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DtypeArg {
    Auto,
    Float16,
    Bfloat16,
}

/// The GPU of this process, opened once (its kernels compiled or read from the cache).
static GPU: OnceLock<Arc<Gpu>> = OnceLock::new();

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFormat {
    Auto,
    Dummy,
}

/// The command-line spelling of a flag's value.
fn value_name(v: impl clap::ValueEnum) -> String {
    v.to_possible_value()
        .map_or_else(String::new, |p| p.get_name().to_owned())
}

/// A number in (0, 1].
pub(crate) fn fraction(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if v > 0.0 && v <= 1.0 {
        Ok(v)
    } else {
        Err(format!("{v} is not in (0, 1]"))
    }
}

impl ModelArgs {
    /// The engine's limits, and its GPU when `--device` names one (opened on first use, in
    /// the `kernel_compile` phase). `model` picks the automatic dtype.
    pub fn engine_config(&self, model: &EngineModel) -> Result<EngineConfig> {
        let gpu_check = model.config().gpu_check();
        let cuda = match (device::select(self.device)?, gpu_check) {
            ((Device::Cpu, _), _) => None,
            // What the GPU runner lacks kernels for: `auto` runs such a model where it can,
            // and `cuda` is refused before anything is uploaded.
            ((Device::Cuda(_), _), Err(e)) if self.device == DeviceRequest::Auto => {
                ferrite_telemetry::notice("info", &format!("ferrite: {e}; running on the CPU"));
                None
            }
            ((Device::Cuda(_), _), Err(e)) => return Err(e.into()),
            ((Device::Cuda(d), _), Ok(())) => {
                let gpu = open_gpu(d.ordinal)?;
                let dtype = match self.dtype {
                    DtypeArg::Auto => gpu::default_dtype(model),
                    DtypeArg::Float16 => Dtype::F16,
                    DtypeArg::Bfloat16 => Dtype::Bf16,
                };
                let opts = GpuOptions {
                    memory_utilization: self.gpu_memory_utilization,
                    cuda_graphs: !self.enforce_eager,
                    collective: self.collective.into(),
                    ..GpuOptions::new(dtype)
                };
                Some(CudaPlacement { gpu, opts })
            }
        };
        let speculation = self.speculation()?;
        let kv_cache_dtype = (self.kv_cache_dtype).resolve(cuda.as_ref().map(|c| c.opts.dtype))?;
        Ok(EngineConfig {
            async_scheduling: match self.async_scheduling {
                OnOffAuto::Auto => cuda.is_some() && speculation.is_none(),
                OnOffAuto::On => true,
                OnOffAuto::Off => false,
            },
            speculation,
            max_model_len: self.max_model_len,
            max_num_seqs: self.max_num_seqs,
            max_num_batched_tokens: self.max_num_batched_tokens,
            kv_cache_bytes: self.kv_cache_mib << 20,
            kv_cache_dtype,
            cuda,
            prefix_caching: !self.no_prefix_caching,
            model_identity: self.identity(),
            ..EngineConfig::default()
        })
    }

    /// Speculative decoding as the flags ask for it (`None`: off).
    fn speculation(&self) -> Result<Option<Speculation>> {
        if self.num_speculative_tokens == 0 {
            return Ok(None);
        }
        if self.async_scheduling == OnOffAuto::On {
            anyhow::bail!(
                "--num-speculative-tokens needs the tokens of each step before the next is \
                 planned: use --async-scheduling off or auto"
            );
        }
        let spec = Speculation {
            tokens: self.num_speculative_tokens,
            lookup_max: self.prompt_lookup_max,
            lookup_min: self.prompt_lookup_min,
        };
        spec.check().map_err(anyhow::Error::msg)?;
        Ok(Some(spec))
    }

    /// What makes this model's keys and values what they are, besides the shape the engine
    /// sees and the dtype it picks: the checkpoint, how it is loaded and quantized. Seeds the
    /// prefix cache's block hashes, so pools of other weights never share a block name.
    pub fn identity(&self) -> String {
        let quantize = self
            .quantize
            .map_or_else(|| "none".to_owned(), |q| format!("rtn-{q}"));
        // int8 activations and an f16 cache change the keys and values, not only the speed.
        format!(
            "model={} load_format={} quantize={quantize} cpu_activations={} kv_cache_dtype={}",
            self.model,
            value_name(self.load_format),
            value_name(self.cpu_activations),
            value_name(self.kv_cache_dtype)
        )
    }

    /// These flags as command-line arguments, for the rank processes `ferrite serve --tp N`
    /// starts (which must load the same model the same way).
    pub fn to_args(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--model".into(),
            self.model.clone(),
            "--kv-cache-mib".into(),
            self.kv_cache_mib.to_string(),
            "--gpu-memory-utilization".into(),
            self.gpu_memory_utilization.to_string(),
            "--max-num-batched-tokens".into(),
            self.max_num_batched_tokens.to_string(),
            "--max-num-seqs".into(),
            self.max_num_seqs.to_string(),
            "--device".into(),
            self.device.to_string(),
        ];
        if let Some(n) = self.max_model_len {
            a.extend(["--max-model-len".into(), n.to_string()]);
        }
        if let Some(q) = self.quantize {
            a.extend(["--quantize".into(), format!("rtn-{q}")]);
        }
        a.extend(["--load-format".into(), value_name(self.load_format)]);
        a.extend(["--dtype".into(), value_name(self.dtype)]);
        a.extend(["--cpu-activations".into(), value_name(self.cpu_activations)]);
        a.extend(["--kv-cache-dtype".into(), value_name(self.kv_cache_dtype)]);
        if self.enforce_eager {
            a.push("--enforce-eager".into());
        }
        if self.no_prefix_caching {
            a.push("--no-prefix-caching".into());
        }
        a.extend([
            "--async-scheduling".into(),
            value_name(self.async_scheduling),
        ]);
        a.extend(["--collective".into(), value_name(self.collective)]);
        if !self.devices.is_empty() {
            let list: Vec<String> = self.devices.iter().map(usize::to_string).collect();
            a.extend(["--devices".into(), list.join(",")]);
        }
        for m in &self.lora_modules {
            a.extend(["--lora-modules".into(), format!("{}={}", m.name, m.path)]);
        }
        if !self.classifier_from_tokens.is_empty() {
            let tokens = self.classifier_from_tokens.join(",");
            a.extend(["--classifier-from-tokens".into(), tokens]);
        }
        if let Some(t) = &self.score_template {
            a.extend(["--score-template".into(), t.clone()]);
        }
        if let Some(p) = &self.reasoning_parser {
            a.extend(["--reasoning-parser".into(), p.clone()]);
        }
        if let Some(k) = &self.default_chat_template_kwargs {
            a.extend(["--default-chat-template-kwargs".into(), k.clone()]);
        }
        a
    }

    /// These flags for rank `rank` of a pool: its own GPU where `--devices` lists them. On
    /// the CPU (`--device cpu`) the list is ignored, so one manifest serves both images.
    pub fn for_rank(&self, rank: usize, world: usize) -> Result<Self> {
        let mut me = self.clone();
        if self.devices.is_empty() || self.device == DeviceRequest::Cpu {
            return Ok(me);
        }
        if self.devices.len() != world {
            anyhow::bail!(
                "--devices lists {} GPUs for a pool of {world} ranks: give one per rank",
                self.devices.len()
            );
        }
        me.device = DeviceRequest::Cuda(self.devices[rank]);
        Ok(me)
    }

    /// The `device_init` phase: picks the device (refusing one that cannot run), then starts the
    /// CPU thread pool the matrix products run on (the CPU path, and loading for a GPU), rather
    /// than inside the first forward pass.
    pub fn init_device(&self) -> Result<Device> {
        let isa = ferrite_kernels::quant::Isa::best();
        let span = tracing::info_span!(target: STARTUP_TARGET, "device_init",
            requested = %self.device, device = Empty, isa = ?isa, threads = Empty, note = Empty);
        let _entered = span.enter();
        let (device, note) = device::select(self.device)?;
        match &device {
            Device::Cpu => span.record("device", "cpu"),
            Device::Cuda(d) => span.record("device", d.to_string().as_str()),
        };
        if let Some(note) = note {
            ferrite_telemetry::notice("info", &format!("ferrite: {note}"));
            span.record("note", note.as_str());
        }
        // Fails only if the pool was already started, which is as good.
        let _ = rayon::ThreadPoolBuilder::new().build_global();
        span.record("threads", rayon::current_num_threads() as i64);
        Ok(device)
    }

    /// What an engine is built from, the tokenizer if the model has one, and how its
    /// embeddings are pooled: with `--load-format dummy` on a GPU, the shape of random weights
    /// made there (so models larger than host memory run); else the model loaded into host
    /// memory.
    pub fn load_for_engine(&self) -> Result<ForEngine> {
        self.load_shard_for_engine(TpRank::SOLO)
    }

    /// [`Self::load_for_engine`] for rank `tp` of a tensor-parallel pool: its shard only.
    pub fn load_shard_for_engine(&self, tp: TpRank) -> Result<ForEngine> {
        let device = self.init_device()?;
        if !self.lora_modules.is_empty() && matches!(device, Device::Cuda(_)) {
            anyhow::bail!(
                "--lora-modules: LoRA adapters run on the CPU only for now (--device cpu)"
            );
        }
        if !self.classifier_from_tokens.is_empty() && matches!(device, Device::Cuda(_)) {
            anyhow::bail!(
                "--classifier-from-tokens: classifiers run on the CPU only for now (--device cpu)"
            );
        }
        if self.load_format == LoadFormat::Dummy && matches!(device, Device::Cuda(_)) {
            let shape = model::device_random_shape(&self.model, 0, self.load_options())
                .with_context(|| format!("dummy weights of shape {}", self.model))?;
            return Ok((EngineModel::DeviceRandom(shape), None, Pooling::default()));
        }
        // `--model` resolved once (a Hub name may pull it), for an encoder or a decoder.
        let path = match self.load_format {
            LoadFormat::Dummy => None,
            _ => Some(self.resolve()?),
        };
        if let Some(path) = path.as_deref().filter(|p| model::is_encoder_dir(p)) {
            return self.load_encoder(path, tp);
        }
        // The GPU upload reads every page as it copies: no separate pass over them first.
        let lazy_pages = matches!(device, Device::Cuda(_));
        let options = LoadOptions {
            lazy_pages,
            tp,
            ..self.load_options()
        };
        let mut loaded = self.load_on_host(path.as_deref(), options)?;
        for m in &self.lora_modules {
            let what = || format!("--lora-modules {}={}", m.name, m.path);
            let path = registry::resolve_adapter(&m.path, |what| {
                ferrite_telemetry::notice("info", &format!("ferrite: {what} ..."));
            })
            .with_context(what)?;
            loaded.model.load_lora(&m.name, &path).with_context(what)?;
        }
        Ok((loaded.model.into(), loaded.tokenizer, loaded.pooling))
    }

    /// The encoder ([`model::encoder`]) at `path`, `--model` resolved.
    fn load_encoder(&self, path: &std::path::Path, tp: TpRank) -> Result<ForEngine> {
        if !self.lora_modules.is_empty() {
            anyhow::bail!(
                "--lora-modules: {} is an encoder, which takes no adapters",
                self.model
            );
        }
        let options = LoadOptions {
            tp,
            ..self.load_options()
        };
        let loaded = model::load_encoder(path, &options)
            .with_context(|| format!("loading {}", path.display()))?;
        Ok((loaded.model.into(), loaded.tokenizer, loaded.pooling))
    }

    /// `--score-template`'s Jinja source (a built-in's, or the file's), checked to compile.
    pub fn score_template_source(&self) -> Result<Option<String>> {
        let Some(spec) = &self.score_template else {
            return Ok(None);
        };
        let source = match ferrite_text::score_template::builtin(spec) {
            Some(builtin) => builtin.to_owned(),
            None => std::fs::read_to_string(spec).with_context(|| {
                format!("--score-template {spec}: neither a built-in (qwen3-reranker) nor a file")
            })?,
        };
        ferrite_text::ScoreTemplate::new(&source, None, None)
            .with_context(|| format!("--score-template {spec}"))?;
        Ok(Some(source))
    }

    fn load_options(&self) -> LoadOptions {
        LoadOptions {
            quantize: self.quantize,
            ggml_activations: self.cpu_activations.into(),
            classifier_tokens: self.classifier_from_tokens.clone(),
            ..LoadOptions::default()
        }
    }

    /// The sampling a server applies to requests that leave a parameter unset, as `config`
    /// says where to find it (dummy weights recommend nothing).
    pub fn sampling_defaults(
        &self,
        config: GenerationConfig,
    ) -> Result<Option<ferrite_proto::v1::SamplingDefaults>> {
        if config == GenerationConfig::None || self.load_format == LoadFormat::Dummy {
            return Ok(None);
        }
        let path = self.resolve()?;
        ferrite_engine::recommended::sampling_defaults(&self.model, &path)
            .with_context(|| format!("the recommended sampling of {}", path.display()))
    }

    /// The model at `path` (`--model` resolved) in host memory, or dummy weights of
    /// `--model`'s shape where there is no path (`--load-format dummy`).
    fn load_on_host(
        &self,
        path: Option<&std::path::Path>,
        options: LoadOptions,
    ) -> Result<LoadedModel> {
        let Some(path) = path else {
            return model::load_dummy(&self.model, 0, options)
                .with_context(|| format!("making dummy weights of shape {}", self.model));
        };
        model::load_with(path, options).with_context(|| format!("loading {}", path.display()))
    }

    /// `--model` as a path (pulling a known model on first use, saying so).
    fn resolve(&self) -> Result<std::path::PathBuf> {
        let path = registry::resolve(&self.model, |what| {
            ferrite_telemetry::notice("info", &format!("ferrite: {what} ..."));
        })?;
        Ok(path)
    }
}

/// Loads `--model` and builds an engine over it; returns it with the model's tokenizer.
pub fn engine(args: &ModelArgs) -> Result<(Engine, ferrite_text::Tokenizer)> {
    let (model, tokenizer, _) = args.load_for_engine()?;
    let tokenizer = tokenizer.with_context(|| {
        format!(
            "{} has no tokenizer (a checkpoint without tokenizer.json, or dummy weights)",
            args.model
        )
    })?;
    let eos = tokenizer.eos_ids().to_vec();
    let cfg = args.engine_config(&model)?;
    let engine = Engine::new(model, eos, cfg)?;
    Ok((engine, tokenizer))
}

/// Opens `cuda:<ordinal>` with its kernels: the `kernel_compile` phase, whose span counts the
/// modules found in the CUBIN cache and those NVRTC compiled.
pub(crate) fn open_gpu(ordinal: usize) -> Result<Arc<Gpu>> {
    if let Some(g) = GPU.get() {
        return Ok(g.clone());
    }
    let span = tracing::info_span!(target: STARTUP_TARGET, "kernel_compile",
        device = ordinal as i64, modules = cuda::MODULES.len() as i64, hits = Empty,
        misses = Empty, arch = Empty);
    let _entered = span.enter();
    let (gpu, builds) = Gpu::open(ordinal, &cuda::default_cache_dir())
        .with_context(|| format!("opening cuda:{ordinal}"))?;
    let hits = builds.iter().filter(|b| b.hit).count();
    span.record("hits", hits as i64);
    span.record("misses", (builds.len() - hits) as i64);
    span.record("arch", gpu.arch.as_str());
    Ok(GPU.get_or_init(|| Arc::new(gpu)).clone())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        model: ModelArgs,
    }

    fn args(v: &[&str]) -> ModelArgs {
        Cli::parse_from(std::iter::once("ferrite").chain(v.iter().copied())).model
    }

    #[test]
    fn devices_place_each_rank_on_its_gpu() {
        let a = args(&["--device", "cuda", "--devices", "2,3"]);
        let rank1 = a.for_rank(1, 2).expect("two GPUs for two ranks");
        assert_eq!(rank1.device, DeviceRequest::Cuda(3));
        let e = a.for_rank(0, 3).expect_err("two GPUs for three ranks");
        assert!(e.to_string().contains("one per rank"), "{e}");
        // The rank processes `serve --tp` starts get the list (and pick their own entry).
        let passed = a.to_args();
        assert!(
            passed.windows(2).any(|w| w == ["--devices", "2,3"]),
            "{passed:?}"
        );
        assert!(
            passed.windows(2).any(|w| w == ["--collective", "auto"]),
            "{passed:?}"
        );
        // On the CPU the list is ignored: one manifest serves the cpu and cuda images.
        let cpu = args(&["--device", "cpu", "--devices", "0,1"]);
        assert_eq!(cpu.for_rank(1, 2).expect("cpu").device, DeviceRequest::Cpu);
        let none = args(&["--device", "cuda"]);
        assert_eq!(
            none.for_rank(1, 2).expect("shared").device,
            DeviceRequest::Cuda(0)
        );
    }

    #[test]
    fn lora_modules_are_name_dir_pairs_and_reach_the_rank_processes() {
        let a = args(&[
            "--lora-modules",
            "sql=/a/sql",
            "chat=b",
            "--lora-modules",
            "x=c",
        ]);
        let names: Vec<&str> = a.lora_modules.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["sql", "chat", "x"]);
        assert_eq!(a.lora_modules[0].path, "/a/sql");
        let again = args(&a.to_args().iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(again.lora_modules, a.lora_modules);
        for bad in ["sql", "=dir", "sql="] {
            let Err(e) = Cli::try_parse_from(["ferrite", "--lora-modules", bad]) else {
                panic!("{bad} parsed");
            };
            assert!(e.to_string().contains("NAME=PATH"), "{bad}: {e}");
        }
    }

    /// The classifier's tokens reach the rank processes and the loader, in order.
    #[test]
    fn classifier_tokens_reach_the_rank_processes() {
        let a = args(&["--classifier-from-tokens", "no,yes"]);
        assert_eq!(a.classifier_from_tokens, ["no", "yes"]);
        let again = args(&a.to_args().iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(again.classifier_from_tokens, a.classifier_from_tokens);
        assert_eq!(a.load_options().classifier_tokens, ["no", "yes"]);
    }

    /// A score template is a built-in's name or a file, checked to compile at start-up, and
    /// reaches the rank processes.
    #[test]
    fn score_templates_are_built_ins_or_files() {
        let builtin = args(&["--score-template", "qwen3-reranker"]);
        let source = builtin.score_template_source().expect("built in");
        assert!(source.is_some_and(|s| s.contains("<Document>")));
        let again = args(
            &builtin
                .to_args()
                .iter()
                .map(String::as_str)
                .collect::<Vec<_>>(),
        );
        assert_eq!(again.score_template, builtin.score_template);
        let dir = std::env::temp_dir().join(format!("ferrite-score-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let (good, bad) = (dir.join("good.jinja"), dir.join("bad.jinja"));
        std::fs::write(
            &good,
            "{{ messages[0].content }} | {{ messages[1].content }}",
        )
        .expect("write");
        std::fs::write(&bad, "{% if %}").expect("write");
        let file = args(&["--score-template", &good.to_string_lossy()]);
        assert!(file.score_template_source().expect("file").is_some());
        for spec in [
            bad.to_string_lossy().into_owned(),
            "no-such-template".into(),
        ] {
            let e = args(&["--score-template", &spec]).score_template_source();
            assert!(e.is_err(), "{spec}");
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(args(&[]).score_template_source().expect("none"), None);
    }
}
