//! Loading a model: find the checkpoint format, read the config, borrow the weights, build the
//! tokenizer.

use std::path::{Path, PathBuf};
use std::time::Instant;

use ferrite_formats::error::FormatError;
use ferrite_formats::gguf::{GgufFile, GgufValue};
use ferrite_formats::quantized::QuantConfig;
use ferrite_formats::{LoadQuantize, TensorMap, safetensors};
use ferrite_kernels::quant::GgmlActivations;
use ferrite_text::{GgufVocab, Tokenizer};
use tracing::field::Empty;

use crate::config::ModelConfig;
use crate::dummy::dummy_tensors;
use crate::encoder::EncoderModel;
use crate::error::{ModelError, Result};
use crate::llama::{LlamaModel, WeightNaming};
use crate::pooling::Pooling;
use crate::presets;
use crate::tp::{ShardAlign, TpRank};

/// The on-disk format of a checkpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WeightFormat {
    Gguf,
    /// A Hugging Face directory: config.json, *.safetensors, tokenizer.json.
    Safetensors,
    /// Random weights of a named shape ([`presets`]), made in memory.
    Dummy,
}

/// A model ready to run, with its tokenizer.
#[derive(Debug)]
pub struct LoadedModel {
    pub model: LlamaModel,
    /// None for a checkpoint without tokenizer files (it runs on token ids only).
    pub tokenizer: Option<Tokenizer>,
    pub path: PathBuf,
    pub format: WeightFormat,
    /// Bytes of tensor data in the checkpoint.
    pub checkpoint_bytes: usize,
    pub load_seconds: f64,
    /// How its embeddings are pooled, as the checkpoint says.
    pub pooling: Pooling,
}

/// What an engine runs: a model in host memory, or the shape of random weights that are made
/// straight on the GPU (`--load-format dummy` there). The latter has no host copy at all, so a
/// model larger than host memory (Llama-3-70B in f16 is 140 GB) still runs.
#[derive(Debug)]
pub enum EngineModel {
    Host(LlamaModel),
    DeviceRandom(RandomShape),
    /// An encoder in host memory, run on the CPU ([`crate::encoder`]).
    Encoder(EncoderModel),
}

/// Random weights of a preset's shape, to be made on the device.
#[derive(Debug, Clone)]
pub struct RandomShape {
    pub cfg: ModelConfig,
    /// The layers' projections as random codes of this format instead of 16-bit values.
    pub quantize: Option<LoadQuantize>,
    pub seed: u64,
}

impl EngineModel {
    pub fn config(&self) -> &ModelConfig {
        match self {
            Self::Host(m) => m.config(),
            Self::DeviceRandom(s) => &s.cfg,
            Self::Encoder(m) => m.config(),
        }
    }

    /// How the layers' projections are stored (`Q4_1`, `w4g128`, `F16`, ...).
    pub fn linear_storage(&self) -> String {
        match self {
            Self::Host(m) => m.linear_storage(),
            Self::DeviceRandom(s) => s.quantize.map_or("F16".into(), |f| f.to_string()),
            Self::Encoder(_) => "as stored".into(),
        }
    }
}

impl From<LlamaModel> for EngineModel {
    fn from(m: LlamaModel) -> Self {
        Self::Host(m)
    }
}

impl From<EncoderModel> for EngineModel {
    fn from(m: EncoderModel) -> Self {
        Self::Encoder(m)
    }
}

/// The shape of a preset for random weights made on a GPU: only the `config` phase runs here;
/// the weights are made in the GPU's `model_init` phase.
pub fn device_random_shape(
    preset_name: &str,
    seed: u64,
    options: LoadOptions,
) -> Result<RandomShape> {
    let preset = presets::preset(preset_name)?;
    let span = config_span(Path::new(preset.name), "dummy");
    let _entered = span.enter();
    let cfg = preset.config()?;
    record_config(&span, &cfg);
    Ok(RandomShape {
        cfg,
        quantize: options.quantize,
        seed,
    })
}

/// What to do to a model while loading it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Quantize the layers' projections by round-to-nearest to this format (`--quantize`).
    pub quantize: Option<LoadQuantize>,
    /// Leave the checkpoint's pages to whoever reads the weights next instead of reading them
    /// all in `load_weights`: set for a GPU, whose upload streams every byte anyway (reading
    /// them first would read the checkpoint twice). A rank of a tensor-parallel pool reads
    /// only its shard's pages, after building the shard.
    pub lazy_pages: bool,
    /// Load this rank's shard of the model (see [`crate::tp`]).
    pub tp: TpRank,
    /// On the CPU, the activations GGUF block weights take (`--cpu-activations`).
    pub ggml_activations: GgmlActivations,
    /// Serve a causal LM as a classifier whose head is its LM head's rows of these tokens
    /// (`--classifier-from-tokens`; [`crate::classify::by_tokens`]); empty: as it is.
    pub classifier_tokens: Vec<String>,
}

/// A model of a preset's shape with random weights and no tokenizer (`--load-format dummy`),
/// loaded through the usual phases.
pub fn load_dummy(preset_name: &str, seed: u64, options: LoadOptions) -> Result<LoadedModel> {
    let start = Instant::now();
    if !options.classifier_tokens.is_empty() {
        return Err(ModelError::BadConfig(
            "--classifier-from-tokens: random weights have no tokenizer to find the tokens in"
                .into(),
        ));
    }
    let preset = presets::preset(preset_name)?;
    let cfg = {
        let span = config_span(Path::new(preset.name), "dummy");
        let _entered = span.enter();
        let cfg = preset.config()?;
        record_config(&span, &cfg);
        cfg
    };
    let tensors = {
        let _span = tracing::info_span!(target: STARTUP_TARGET, "load_weights", format = "dummy",
            mode = "random", bytes = Empty, tensors = Empty)
        .entered();
        let t = dummy_tensors(&cfg, seed);
        tracing::Span::current().record("bytes", t.total_bytes() as i64);
        tracing::Span::current().record("tensors", t.len() as i64);
        t
    };
    let bytes = tensors.total_bytes();
    let model = model_init(&tensors, WeightNaming::HuggingFace, cfg, options)?;
    Ok(LoadedModel {
        model,
        tokenizer: None,
        path: PathBuf::from(format!("dummy:{}", preset.name)),
        format: WeightFormat::Dummy,
        checkpoint_bytes: bytes,
        load_seconds: start.elapsed().as_secs_f64(),
        pooling: Pooling::default(),
    })
}

/// Parses a `--quantize` value: `rtn-` and a weight format (`rtn-w4g128`, `rtn-w8pc-sym`),
/// `rtn-w8a8` or `rtn-fp8`.
pub fn parse_quantize(s: &str) -> std::result::Result<LoadQuantize, String> {
    let format = s.strip_prefix("rtn-").ok_or_else(|| {
        format!("`{s}`: the method must be rtn (e.g. rtn-w4g128, rtn-w8a8, rtn-fp8)")
    })?;
    format.parse()
}

/// Loads a `.gguf` file or a Hugging Face model directory.
pub fn load(path: &Path) -> Result<LoadedModel> {
    load_with(path, LoadOptions::default())
}

/// [`load`], then what `options` ask for.
pub fn load_with(path: &Path, options: LoadOptions) -> Result<LoadedModel> {
    let start = Instant::now();
    let io_err = |source| FormatError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io_err)?;
    let ((model, tokenizer, format, bytes), pooling) = if meta.is_dir() {
        (load_hf_dir(path, options)?, Pooling::of_dir(path))
    } else {
        load_gguf(path, options)?
    };
    Ok(LoadedModel {
        model,
        tokenizer,
        path: path.to_owned(),
        format,
        checkpoint_bytes: bytes,
        load_seconds: start.elapsed().as_secs_f64(),
        pooling,
    })
}

/// `cfg`, made a classifier by its tokens where `options` name them.
fn with_token_classifier(
    mut cfg: ModelConfig,
    tokenizer: Option<&Tokenizer>,
    options: &LoadOptions,
) -> Result<ModelConfig> {
    if !options.classifier_tokens.is_empty() {
        crate::classify::by_tokens(&mut cfg, &options.classifier_tokens, tokenizer)?;
    }
    Ok(cfg)
}

/// The `tracing` target of start-up phase spans; equal to `ferrite_telemetry::phases::TARGET`
/// (this crate does not depend on the telemetry one).
pub const STARTUP_TARGET: &str = "ferrite::startup";

/// The `config` phase's span; [`record_config`] fills it in.
fn config_span(path: &Path, format: &'static str) -> tracing::Span {
    tracing::info_span!(target: STARTUP_TARGET, "config", format, path = %path.display(),
        architecture = Empty, num_layers = Empty, hidden_size = Empty, vocab_size = Empty,
        max_position_embeddings = Empty)
}

fn record_config(span: &tracing::Span, cfg: &ModelConfig) {
    span.record("architecture", tracing::field::debug(cfg.architecture));
    span.record("num_layers", cfg.num_layers as i64);
    span.record("hidden_size", cfg.hidden_size as i64);
    span.record("vocab_size", cfg.vocab_size as i64);
    span.record(
        "max_position_embeddings",
        cfg.max_position_embeddings as i64,
    );
}

/// The `load_weights` and `model_init` phases. A whole model reads every byte of the checkpoint
/// first, so that neither the warm-up nor the first request pays for page faults (unless
/// [`LoadOptions::lazy_pages`]), then builds the model over it. A rank of a pool builds its
/// shard first and then reads only the pages the shard uses. Returns the model and the bytes
/// of tensor data in the checkpoint.
fn load_and_init(
    tensors: &TensorMap,
    format: &'static str,
    naming: WeightNaming,
    cfg: ModelConfig,
    options: LoadOptions,
) -> Result<(LlamaModel, usize)> {
    let span = |mode: &'static str, tensors: usize| {
        tracing::info_span!(target: STARTUP_TARGET, "load_weights", format, mode,
            bytes = Empty, tensors = tensors as i64, gb_per_s = Empty)
    };
    let record = |span: &tracing::Span, bytes: usize, start: Instant| {
        span.record("bytes", bytes as i64);
        span.record(
            "gb_per_s",
            bytes as f64 / start.elapsed().as_secs_f64().max(1e-9) / 1e9,
        );
    };
    if !options.tp.is_solo() {
        let model = model_init(tensors, naming, cfg, options)?;
        let span = span("shard", tensors.len());
        let _entered = span.enter();
        let start = Instant::now();
        record(&span, model.load_pages(), start);
        return Ok((model, tensors.total_bytes()));
    }
    {
        let lazy = options.lazy_pages;
        let span = span(if lazy { "mmap-lazy" } else { "mmap" }, tensors.len());
        let _entered = span.enter();
        if !lazy {
            let start = Instant::now();
            record(&span, tensors.load_pages(), start);
        }
    }
    let model = model_init(tensors, naming, cfg, options)?;
    Ok((model, tensors.total_bytes()))
}

/// The `model_init` phase: the model built over the loaded tensors.
/// Quantizing at load (`--quantize`) happens here too.
fn model_init(
    tensors: &TensorMap,
    naming: WeightNaming,
    cfg: ModelConfig,
    options: LoadOptions,
) -> Result<LlamaModel> {
    let span = tracing::info_span!(target: STARTUP_TARGET, "model_init",
        num_layers = cfg.num_layers as i64, num_heads = cfg.num_heads as i64,
        num_kv_heads = cfg.num_kv_heads as i64, head_dim = cfg.head_dim as i64,
        quantize = Empty, weights = Empty, cpu_activations = ?options.ggml_activations);
    let _entered = span.enter();
    if !options.tp.is_solo() {
        let align = shard_align(tensors, naming, &cfg, options.quantize);
        crate::tp::check_split(&cfg, options.tp.world, align)?;
    }
    let mut model = LlamaModel::load_shard(tensors, naming, cfg, options.tp)?;
    model.matmul.ggml_activations = options.ggml_activations;
    if let Some(format) = options.quantize {
        span.record(
            "quantize",
            tracing::field::display(format_args!("rtn-{format}")),
        );
        model.quantize_linear(format)?;
    }
    span.record("weights", tracing::field::display(model.linear_storage()));
    Ok(model)
}

/// The runs a shard's cuts must keep whole: the row-parallel projections' column blocks (the
/// largest over their stored types, and over the format quantized to at load), and the FP8
/// blocks' rows.
fn shard_align(
    t: &TensorMap,
    naming: WeightNaming,
    cfg: &ModelConfig,
    quantize: Option<LoadQuantize>,
) -> ShardAlign {
    let stored = (0..cfg.num_layers).flat_map(|i| {
        [
            naming.layer(i, "attn_output.weight", "self_attn.o_proj.weight"),
            naming.layer(i, "ffn_down.weight", "mlp.down_proj.weight"),
            // GGUF's stacked experts (Hugging Face's are named per expert).
            naming.layer(i, "ffn_down_exps.weight", "mlp.experts.down_proj"),
        ]
    });
    let quantized = t.quant().and_then(QuantConfig::group_size);
    // gpt-oss's MXFP4 experts: blocks of 32 columns.
    let mxfp4 = (t.int_type(&naming.layer(0, "", "mlp.experts.down_proj_blocks")))
        .map(|_| ferrite_formats::mxfp4::BLOCK);
    let cols = stored
        .filter_map(|name| t.entry(&name).map(|e| e.ty.block_elems()))
        .chain(quantized)
        .chain(mxfp4)
        .chain(quantize.and_then(|f| f.group_size()))
        .max()
        .unwrap_or(1);
    let rows = t.quant().map_or(1, QuantConfig::row_block);
    ShardAlign { rows, cols }
}

/// An encoder loaded ([`crate::encoder`]), with its tokenizer.
#[derive(Debug)]
pub struct LoadedEncoder {
    pub model: EncoderModel,
    pub tokenizer: Option<Tokenizer>,
    pub pooling: Pooling,
    /// Bytes of tensor data in the checkpoint.
    pub checkpoint_bytes: usize,
}

/// Whether `path` is a Hugging Face directory whose `config.json` names an encoder.
pub fn is_encoder_dir(path: &Path) -> bool {
    let read = std::fs::read(path.join("config.json")).ok();
    let cfg = read.and_then(|raw| serde_json::from_slice::<serde_json::Value>(&raw).ok());
    cfg.is_some_and(|c| crate::encoder::is_encoder(&c))
}

/// The encoder in Hugging Face directory `dir`, through the usual phases. An encoder is run
/// as its checkpoint stores it, whole, on one rank: `options` may ask for nothing else.
pub fn load_encoder(dir: &Path, options: &LoadOptions) -> Result<LoadedEncoder> {
    let refuse = |what: &str| {
        Err(ModelError::BadConfig(format!(
            "{what}: an encoder ({}) runs as its checkpoint stores it, whole on one rank",
            dir.display()
        )))
    };
    if options.quantize.is_some() {
        return refuse("--quantize");
    }
    if !options.tp.is_solo() {
        return refuse("tensor parallelism");
    }
    if !options.classifier_tokens.is_empty() {
        return refuse("--classifier-from-tokens");
    }
    let (cfg, shape, mut tensors) = {
        let span = config_span(dir, "safetensors");
        let _entered = span.enter();
        let p = dir.join("config.json");
        let raw = std::fs::read(&p).map_err(|source| FormatError::Io { path: p, source })?;
        let json: serde_json::Value = serde_json::from_slice(&raw)
            .map_err(|e| ModelError::BadConfig(format!("config.json: {e}")))?;
        let (cfg, shape) = crate::encoder::config(&json, max_seq_length(dir))?;
        record_config(&span, &cfg);
        (cfg, shape, safetensors::open_dir(dir)?)
    };
    let tokenizer = hf_tokenizer(dir)?;
    {
        let _span = tracing::info_span!(target: STARTUP_TARGET, "load_weights",
            format = "safetensors", mode = "mmap", bytes = tensors.total_bytes() as i64,
            tensors = tensors.len() as i64)
        .entered();
        tensors.load_pages();
    }
    crate::encoder::base_names(&mut tensors);
    let (pooling, mode) = Pooling::of_encoder_dir(dir);
    let sep = tokenizer.as_ref().and_then(|t| t.token_to_id("[SEP]"));
    let model = {
        let _span = tracing::info_span!(target: STARTUP_TARGET, "model_init",
            num_layers = cfg.num_layers as i64, num_heads = cfg.num_heads as i64,
            head_dim = cfg.head_dim as i64, weights = "as stored")
        .entered();
        EncoderModel::load(&tensors, cfg, shape, mode, sep)?
    };
    Ok(LoadedEncoder {
        model,
        tokenizer,
        pooling,
        checkpoint_bytes: tensors.total_bytes(),
    })
}

/// sentence-transformers' `max_seq_length` (`sentence_bert_config.json`), if set.
fn max_seq_length(dir: &Path) -> Option<usize> {
    let raw = std::fs::read(dir.join("sentence_bert_config.json")).ok()?;
    let cfg: serde_json::Value = serde_json::from_slice(&raw).ok()?;
    cfg.get("max_seq_length")?.as_u64().map(|n| n as usize)
}

/// What a checkpoint loads into: the model, its tokenizer, its format and tensor bytes.
type Loaded = (LlamaModel, Option<Tokenizer>, WeightFormat, usize);

fn load_gguf(path: &Path, options: LoadOptions) -> Result<(Loaded, Pooling)> {
    let (gguf, cfg) = {
        let span = config_span(path, "gguf");
        let _entered = span.enter();
        let gguf = GgufFile::open(path)?;
        let cfg = ModelConfig::from_gguf(&gguf)?;
        record_config(&span, &cfg);
        (gguf, cfg)
    };
    let tokenizer = {
        let _span = tracing::info_span!(target: STARTUP_TARGET, "tokenizer_init", source = "gguf")
            .entered();
        Tokenizer::from_gguf_vocab(gguf_vocab(&gguf)?)?
    };
    let cfg = with_token_classifier(cfg, Some(&tokenizer), &options)?;
    let (model, bytes) = load_and_init(&gguf.tensors, "gguf", WeightNaming::Gguf, cfg, options)?;
    let pooling = Pooling::of_gguf(&gguf);
    Ok(((model, Some(tokenizer), WeightFormat::Gguf, bytes), pooling))
}

fn gguf_vocab(g: &GgufFile) -> Result<GgufVocab> {
    let key = |k: &str| format!("tokenizer.ggml.{k}");
    let model = g
        .get_str(&key("model"))
        .ok_or_else(|| ModelError::BadConfig("GGUF has no tokenizer.ggml.model".into()))?
        .to_owned();
    let tokens = g.get_strings(&key("tokens")).ok_or_else(|| {
        ModelError::BadConfig("GGUF has no tokenizer.ggml.tokens string array".into())
    })?;
    let numbers = |k: &str| -> Option<Vec<GgufValue>> {
        g.get(&key(k)).and_then(|v| v.as_array()).map(<[_]>::to_vec)
    };
    let id = |k: &str| g.get_u64(&key(k)).and_then(|v| u32::try_from(v).ok());
    Ok(GgufVocab {
        model,
        pre: g.get_str(&key("pre")).map(str::to_owned),
        tokens,
        scores: numbers("scores")
            .map(|a| a.iter().map(|v| v.as_f64().unwrap_or(0.0) as f32).collect()),
        token_types: numbers("token_type").map(|a| {
            a.iter()
                .map(|v| match v {
                    GgufValue::I32(t) => *t,
                    other => other
                        .as_u64()
                        .and_then(|t| i32::try_from(t).ok())
                        .unwrap_or(1),
                })
                .collect()
        }),
        merges: g.get_strings(&key("merges")),
        bos_id: id("bos_token_id"),
        eos_id: id("eos_token_id"),
        unk_id: id("unknown_token_id"),
        pad_id: id("padding_token_id"),
        add_bos: g.get_bool(&key("add_bos_token")),
        add_eos: g.get_bool(&key("add_eos_token")),
        add_space_prefix: g.get_bool(&key("add_space_prefix")),
        chat_template: g.get_str("tokenizer.chat_template").map(str::to_owned),
    })
}

/// The decoder's tensors under a causal LM's names: a multimodal checkpoint's text model
/// (Gemma 3 4B and up; transformers 4.5x wrote it under `language_model.model.`, later
/// releases under `model.language_model.`, its LM head under `language_model.lm_head.` /
/// `lm_head.`; the vision tower's tensors stay, unread), or a base model's.
fn causal_lm_names(tensors: &mut TensorMap) {
    if tensors.contains("language_model.model.embed_tokens.weight") {
        tensors.rename_prefix("language_model.model.", "model.");
        tensors.rename_prefix("language_model.lm_head.", "lm_head.");
    } else if tensors.contains("model.language_model.embed_tokens.weight") {
        tensors.rename_prefix("model.language_model.", "model.");
    } else if tensors.contains("embed_tokens.weight") {
        // A base model saved without its head (`Qwen3Model`: Qwen3-Embedding), tied.
        tensors.rename_prefix("", "model.");
    }
}

fn load_hf_dir(dir: &Path, options: LoadOptions) -> Result<Loaded> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read(&p).map_err(|source| FormatError::Io { path: p, source })
    };
    let (cfg, tensors) = {
        let span = config_span(dir, "safetensors");
        let _entered = span.enter();
        let cfg_json: serde_json::Value = serde_json::from_slice(&read("config.json")?)
            .map_err(|e| ModelError::BadConfig(format!("config.json: {e}")))?;
        if crate::encoder::is_encoder(&cfg_json) {
            return Err(ModelError::BadConfig(format!(
                "{} is an encoder: it is served for embeddings and classification (ferrite \
                 serve or worker), and runs no decoder's command",
                dir.display()
            )));
        }
        let cfg = ModelConfig::from_hf_config(&cfg_json)?;
        let mut tensors = safetensors::open_dir(dir)?;
        causal_lm_names(&mut tensors);
        if let Some(q) = QuantConfig::from_hf_config(&cfg_json)? {
            tensors.set_quant(q);
        }
        record_config(&span, &cfg);
        (cfg, tensors)
    };
    let tokenizer = hf_tokenizer(dir)?;
    let cfg = with_token_classifier(cfg, tokenizer.as_ref(), &options)?;
    let naming = WeightNaming::HuggingFace;
    let (model, bytes) = load_and_init(&tensors, "safetensors", naming, cfg, options)?;
    Ok((model, tokenizer, WeightFormat::Safetensors, bytes))
}

/// The tokenizer beside a Hugging Face checkpoint in `dir` (`None` without `tokenizer.json`):
/// the `tokenizer_init` phase.
fn hf_tokenizer(dir: &Path) -> Result<Option<Tokenizer>> {
    let read = |name: &str| {
        let p = dir.join(name);
        std::fs::read(&p).map_err(|source| FormatError::Io { path: p, source })
    };
    let tokenizer_span =
        tracing::info_span!(target: STARTUP_TARGET, "tokenizer_init", source = "tokenizer.json")
            .entered();
    let tokenizer_config: Option<serde_json::Value> = match read("tokenizer_config.json") {
        Ok(raw) => Some(
            serde_json::from_slice(&raw)
                .map_err(|e| ModelError::BadConfig(format!("tokenizer_config.json: {e}")))?,
        ),
        Err(_) => None,
    };
    let mut tokenizer = match read("tokenizer.json") {
        Ok(raw) => Some(Tokenizer::from_tokenizer_json(
            &raw,
            tokenizer_config.as_ref(),
        )?),
        Err(_) => None,
    };
    // Checkpoints saved by transformers 4.43+ keep the template in its own file, which
    // transformers prefers to tokenizer_config.json's.
    if let (Some(t), Ok(raw)) = (tokenizer.as_mut(), read("chat_template.jinja")) {
        let source = String::from_utf8(raw)
            .map_err(|e| ModelError::BadConfig(format!("chat_template.jinja: {e}")))?;
        t.set_chat_template(&source)?;
    }
    drop(tokenizer_span);
    Ok(tokenizer)
}
