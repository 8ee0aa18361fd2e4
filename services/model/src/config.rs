//! The shape of a model, read from GGUF metadata or a Hugging Face `config.json`: the Llama
//! family, and Gemma 2 and 3 as sets of options on the same forward ([`crate::gemma`]).

use std::str::FromStr;

use ferrite_kernels::cpu::rope::{Rope, RopePairing};
use ferrite_kernels::cpu::{clamped_swiglu_in_place, gelu_tanh_mul_in_place, silu_mul_in_place};
use serde_json::Value;

use crate::error::{ModelError, Result};
use crate::gemma::{self, Gemma, GemmaOptions};
use crate::gpt_oss_config;
use crate::moe_config::{MoeConfig, MoeFamily};
pub use crate::rope::RopeScaling;
use crate::rope::{HfRope, yarn_mscale};
use crate::variants;
use crate::window::{self, WindowRule};

/// The model families ferrite runs. They share one forward ([`crate::llama`]) and differ
/// in the options of [`ModelConfig`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Architecture {
    /// Llama 2/3/3.1, SmolLM2.
    Llama,
    Mistral,
    /// Qwen2 / Qwen2.5: bias on the Q, K and V projections.
    Qwen2,
    /// Qwen3: RMSNorm on each head of Q and K.
    Qwen3,
    /// Mixtral: Mistral's layers with a mixture of experts for each MLP ([`crate::moe`]).
    Mixtral,
    /// Qwen2-MoE: Qwen2's layers with a mixture of experts and a shared expert for (most) MLPs.
    Qwen2Moe,
    /// Qwen3-MoE: Qwen3's layers with a mixture of experts for (most) MLPs.
    Qwen3Moe,
    /// Gemma 2: GeGLU, `1 + w` RMSNorm weights, norms after attention and MLP too, scaled
    /// embeddings, soft-capped attention scores and logits, sliding-window attention on
    /// alternate layers.
    Gemma2,
    /// Phi-3 / Phi-4: Q, K and V stored as one matrix, gate and up as one (cut apart at load);
    /// part of each head may rotate.
    Phi3,
    /// Gemma 3 (text): Gemma 2 without the soft caps, with an RMSNorm on each head of Q and K,
    /// five sliding layers to one full, and a rotary base of their own for the sliding ones.
    Gemma3,
    /// SmolLM3: Llama with no rotary embedding on every fourth layer (NoPE).
    SmolLm3,
    /// Granite 3.x: Llama with multipliers of the embeddings, the residual branches, the
    /// attention scores and the logits.
    Granite,
    /// OLMo 2: no norm before attention or the MLP, one after each (before its residual add),
    /// and RMSNorms over the whole of Q and of K (all heads together).
    Olmo2,
    /// gpt-oss: a mixture of experts with biases everywhere (attention's four projections, the
    /// router, the experts), a clamped SwiGLU, a learned sink logit per attention head, and
    /// sliding-window attention on alternate layers (`gpt_oss.rs`, `gpt_oss_config.rs`).
    GptOss,
    /// BERT, RoBERTa and XLM-RoBERTa: encoders, for embeddings, with a forward of their own
    /// ([`crate::encoder`]); the decoder's options do not apply to them.
    Encoder,
}

impl FromStr for Architecture {
    type Err = ModelError;

    /// Accepts GGUF `general.architecture` names and HF `architectures` / `model_type` names.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "llama" | "LlamaForCausalLM" => Architecture::Llama,
            "mistral" | "MistralForCausalLM" => Architecture::Mistral,
            "qwen2" | "Qwen2ForCausalLM" => Architecture::Qwen2,
            "qwen3" | "Qwen3ForCausalLM" => Architecture::Qwen3,
            "mixtral" | "MixtralForCausalLM" => Architecture::Mixtral,
            "qwen2moe" | "qwen2_moe" | "Qwen2MoeForCausalLM" => Architecture::Qwen2Moe,
            "qwen3moe" | "qwen3_moe" | "Qwen3MoeForCausalLM" => Architecture::Qwen3Moe,
            "gemma2" | "Gemma2ForCausalLM" => Architecture::Gemma2,
            "gemma3" | "gemma3_text" | "Gemma3ForCausalLM" => Architecture::Gemma3,
            "phi3" | "Phi3ForCausalLM" => Architecture::Phi3,
            "smollm3" | "SmolLM3ForCausalLM" => Architecture::SmolLm3,
            "granite" | "GraniteForCausalLM" => Architecture::Granite,
            "olmo2" | "Olmo2ForCausalLM" => Architecture::Olmo2,
            "gpt-oss" | "gpt_oss" | "GptOssForCausalLM" => Architecture::GptOss,
            other => return Err(ModelError::UnsupportedArchitecture(other.to_owned())),
        })
    }
}

/// The gated activation of the MLP: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// SwiGLU: `silu(x) = x * sigmoid(x)`.
    Silu,
    /// GeGLU with the tanh approximation of GELU (HF `gelu_pytorch_tanh`).
    GeluTanh,
    /// gpt-oss's `(clamp(up) + 1) · g · sigmoid(alpha · g)`, `g = min(gate, limit)`
    /// (`swiglu_alpha`, `swiglu_limit`).
    ClampedSwiglu { alpha: f32, limit: f32 },
}

impl FromStr for Activation {
    type Err = ModelError;

    /// Accepts HF `hidden_act` / `hidden_activation` names.
    fn from_str(s: &str) -> Result<Self> {
        Ok(match s {
            "silu" | "swish" => Activation::Silu,
            // Both are the tanh formula (`gelu_new` is transformers' own implementation of it).
            "gelu_pytorch_tanh" | "gelu_new" => Activation::GeluTanh,
            other => {
                return Err(ModelError::BadConfig(format!(
                    "activation `{other}` is not supported (supported: silu, gelu_pytorch_tanh)"
                )));
            }
        })
    }
}

impl Activation {
    /// `gate = act(gate) * up`, element by element.
    pub fn gated_in_place(self, gate: &mut [f32], up: &[f32]) {
        match self {
            Activation::Silu => silu_mul_in_place(gate, up),
            Activation::GeluTanh => gelu_tanh_mul_in_place(gate, up),
            Activation::ClampedSwiglu { alpha, limit } => {
                clamped_swiglu_in_place(gate, up, alpha, limit)
            }
        }
    }
}

/// How RoPE pairs the dimensions of a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Dimension `i` rotates with `i + d/2` (HF `rotate_half`, llama.cpp NEOX).
    Neox,
    /// Dimension `2i` rotates with `2i + 1` (llama.cpp NORM). GGUF `llama` checkpoints have their
    /// Q/K rows permuted by the converter for this pairing.
    Interleaved,
}

#[derive(Debug, Clone)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    pub rope_theta: f32,
    pub rope_style: RopeStyle,
    pub rope_scaling: RopeScaling,
    /// Number of dimensions of each head that RoPE rotates (all of them for these families).
    pub rope_dim: usize,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub qkv_bias: bool,
    /// A bias on the attention's output projection too (`attention_bias` of Llama, Qwen3,
    /// Gemma and gpt-oss, which puts one on all four).
    pub o_bias: bool,
    /// An RMSNorm on q and on k after their projections (and biases): of each head (Qwen3,
    /// Gemma 3), or with [`Self::qk_norm_all_heads`] of all heads together (OLMo 2).
    pub qk_norm: bool,
    /// OLMo 2: [`Self::qk_norm`] over all heads together.
    pub qk_norm_all_heads: bool,
    /// An RMSNorm before attention and before the MLP (every family but OLMo 2, whose norms
    /// are the [`Self::post_norms`] alone).
    pub pre_norms: bool,
    pub activation: Activation,
    /// Multiplies the token embeddings (Gemma: `sqrt(hidden_size)`; 1 otherwise).
    pub embedding_scale: f32,
    /// Added to every RMSNorm weight at load. Gemma's norm multiplies by `1 + w` and HF
    /// checkpoints store `w`; llama.cpp's converter adds the 1 when it writes GGUF, so 0 there.
    /// Folding it in once gives the same f32 product as adding it at every token.
    pub norm_weight_offset: f32,
    /// Gemma 2 and 3, OLMo 2: an RMSNorm on the attention output and on the MLP output, each
    /// before its residual add.
    pub post_norms: bool,
    /// Multiplies `q · k` (`1/sqrt(head_dim)`; Gemma 2: `query_pre_attn_scalar^-0.5`).
    pub attention_scale: f32,
    /// Gemma 2: attention scores become `tanh(s / cap) * cap` before the softmax.
    pub attn_logit_softcap: Option<f32>,
    /// Gemma 2: the output logits become `tanh(l / cap) * cap`.
    pub final_logit_softcap: Option<f32>,
    /// gpt-oss: each attention head has a learned sink logit (`self_attn.sinks`) in its
    /// softmax.
    pub attention_sinks: bool,
    /// Per layer: whether it rotates q and k by position (SmolLM3's every fourth layer does
    /// not: its attention knows order only through the causal mask).
    pub rotates: Vec<bool>,
    /// Granite: multiplies each attention and MLP output before its residual add; 1 otherwise.
    pub residual_scale: f32,
    /// Granite: divides the output logits; 1 otherwise.
    pub logits_divisor: f32,
    /// Per layer: how many of the most recent positions (the token's own included) its
    /// attention sees; `None` for all of them. The KV cache still keeps every position.
    pub attention_window: Vec<Option<usize>>,
    /// The experts of a mixture-of-experts model; `None` for a dense one.
    pub moe: Option<MoeConfig>,
    /// Gemma 3: the sliding-window layers rotate with this base, unscaled (the full layers
    /// with `rope_theta` and `rope_scaling`); `None`: every layer with `rope_theta`.
    pub local_rope_theta: Option<f32>,
    /// A sequence classifier's labels, in the order of its head's rows (Hugging Face
    /// `*ForSequenceClassification` checkpoints: rerankers, classifiers, reward models). Its
    /// answer is that head (`score.weight`) applied to the last token's final hidden state,
    /// not text ([`crate::classify`]). `None` for a generative model.
    pub labels: Option<Vec<String>>,
    /// A causal LM served as a classifier (`--classifier-from-tokens`): its head is made of
    /// the LM head's rows of these tokens ([`crate::classify`]) instead of `score.weight`.
    pub label_tokens: Option<Vec<u32>>,
}

/// What every model states: its family and sizes ([`ModelConfig::plain`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Dims {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_layers: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub head_dim: usize,
}

const CLASSIFIER: &str = "ForSequenceClassification";

/// The causal LM whose layers a sequence classifier (`LlamaForSequenceClassification`) has.
fn causal_name(arch: &str) -> String {
    match arch.strip_suffix(CLASSIFIER) {
        Some(family) => format!("{family}ForCausalLM"),
        None => arch.to_owned(),
    }
}

/// A sequence classifier's labels: `id2label` in id order, else `num_labels` of transformers'
/// default names (`LABEL_0`...), else its default two. `None` for another architecture.
pub(crate) fn classifier_labels(cfg: &Value, arch: &str) -> Option<Vec<String>> {
    if !arch.ends_with(CLASSIFIER) {
        return None;
    }
    let named = |n: usize| (0..n).map(|i| format!("LABEL_{i}")).collect::<Vec<_>>();
    let id2label = cfg.get("id2label").and_then(Value::as_object);
    let n = id2label
        .map(|m| m.len())
        .or_else(|| {
            cfg.get("num_labels")
                .and_then(Value::as_u64)
                .map(|n| n as usize)
        })
        .unwrap_or(2);
    let mut labels = named(n);
    for (id, label) in id2label.into_iter().flatten() {
        if let (Ok(i), Some(label)) = (id.parse::<usize>(), label.as_str())
            && i < n
        {
            labels[i] = label.to_owned();
        }
    }
    Some(labels)
}

/// The most layers a config may declare: far above any released model (Llama 3.1 405B has
/// 126), and low enough that a corrupt count is refused before anything is sized by it.
const MAX_LAYERS: usize = 4096;

/// `n` as a layer count, or why not.
fn layer_count(n: usize) -> Result<usize> {
    match n {
        1..=MAX_LAYERS => Ok(n),
        _ => Err(ModelError::BadConfig(format!(
            "{n} layers: a model has 1 to {MAX_LAYERS}"
        ))),
    }
}

impl ModelConfig {
    /// A model of `d`'s sizes with a plain Llama layer's options, which each reader (of
    /// `config.json`, of GGUF metadata, of an encoder's config) then changes where its family
    /// differs: SiLU, norms before attention and the MLP only, every layer rotating all of a
    /// head by base 10 000 unscaled (NEOX pairs), attention scaled by `1/sqrt(head_dim)`, no
    /// biases, caps, windows, sinks, experts, multipliers or labels, untied.
    pub(crate) fn plain(d: Dims) -> Self {
        ModelConfig {
            architecture: d.architecture,
            vocab_size: d.vocab_size,
            hidden_size: d.hidden_size,
            intermediate_size: d.intermediate_size,
            num_layers: d.num_layers,
            num_heads: d.num_heads,
            num_kv_heads: d.num_kv_heads,
            head_dim: d.head_dim,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            rope_style: RopeStyle::Neox,
            rope_scaling: RopeScaling::None,
            rope_dim: d.head_dim,
            max_position_embeddings: 4096,
            tie_word_embeddings: false,
            qkv_bias: false,
            o_bias: false,
            qk_norm: false,
            qk_norm_all_heads: false,
            pre_norms: true,
            activation: Activation::Silu,
            embedding_scale: 1.0,
            norm_weight_offset: 0.0,
            post_norms: false,
            attention_scale: 1.0 / (d.head_dim as f32).sqrt(),
            attn_logit_softcap: None,
            final_logit_softcap: None,
            attention_sinks: false,
            rotates: vec![true; d.num_layers],
            residual_scale: 1.0,
            logits_divisor: 1.0,
            attention_window: vec![None; d.num_layers],
            moe: None,
            local_rope_theta: None,
            labels: None,
            label_tokens: None,
        }
    }

    /// The context a model is served with where `--max-model-len` does not say: its own
    /// length, at most 8192.
    pub fn default_context(&self) -> usize {
        self.max_position_embeddings.min(8192)
    }

    /// The rotary embedding of this model served with contexts of `context` tokens (which
    /// only LongRoPE reads), its scaling folded into the frequencies and `freq_factors` (a
    /// Llama 3.1 GGUF file's per-pair divisors) applied. Public for `ferrite quantize` too,
    /// which checks that a GGUF model's frequencies are those its written `config.json` implies.
    pub fn rope(&self, freq_factors: Option<&[f32]>, context: usize) -> Rope {
        let f = (self.rope_scaling).frequencies(self.rope_theta, self.rope_dim, context);
        let mut inv_freq = f.inv_freq;
        for (x, d) in inv_freq.iter_mut().zip(freq_factors.unwrap_or_default()) {
            *x /= d;
        }
        Rope {
            inv_freq,
            position_scale: f.position_scale,
            scale: f.scale,
            pairing: match self.rope_style {
                RopeStyle::Neox => RopePairing::Half,
                RopeStyle::Interleaved => RopePairing::Adjacent,
            },
            head_dim: self.head_dim,
        }
    }

    /// Gemma 3's sliding layers' rotary embedding: this model's with their own base, unscaled.
    pub fn local_rope(&self) -> Option<Rope> {
        self.local_rope_theta.map(|theta| {
            let local = ModelConfig {
                rope_theta: theta,
                rope_scaling: RopeScaling::None,
                ..self.clone()
            };
            local.rope(None, 0)
        })
    }

    pub fn q_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// The lengths of the q and k norms' weights ([`Self::qk_norm`]): a head's, or all heads'.
    pub fn qk_norm_lens(&self) -> (usize, usize) {
        match self.qk_norm_all_heads {
            true => (self.q_dim(), self.kv_dim()),
            false => (self.head_dim, self.head_dim),
        }
    }

    /// Whether layer `index` rotates with the sliding layers' own base (Gemma 3's sliding
    /// layers) rather than `rope_theta`.
    pub fn local_rope_at(&self, index: usize) -> bool {
        self.local_rope_theta.is_some() && matches!(self.attention_window.get(index), Some(Some(_)))
    }

    /// The reasoning parser a model's chats need where `--reasoning-parser` does not say:
    /// gpt-oss writes every answer in harmony's channels (`openai_gptoss`), which read raw are
    /// its thinking and answer run together with their channels' names.
    pub fn default_reasoning_parser(&self) -> Option<&'static str> {
        (self.architecture == Architecture::GptOss).then_some("openai_gptoss")
    }

    /// Whether the GPU runner runs this model; if not (it runs on the CPU), why: it has no
    /// kernels yet for a mixture's experts, nor for an encoder.
    pub fn gpu_check(&self) -> Result<()> {
        let lacks = |what: &str| {
            Err(ModelError::BadConfig(format!(
                "the GPU runner does not take {what} yet (they run on the CPU: --device cpu)"
            )))
        };
        match (self.architecture, &self.moe) {
            (Architecture::Encoder, _) => lacks("encoders"),
            _ if self.attention_sinks || self.o_bias => {
                lacks("attention sinks or attention output biases")
            }
            (_, Some(_)) => lacks("mixture-of-experts models"),
            _ if self.residual_scale != 1.0 || self.logits_divisor != 1.0 => {
                lacks("residual or logit multipliers (Granite's)")
            }
            _ if !self.pre_norms || self.qk_norm_all_heads => {
                lacks("OLMo 2's norms (none before attention or the MLP; q/k norms over all heads)")
            }
            _ => Ok(()),
        }
    }

    pub(crate) fn validate(self) -> Result<Self> {
        let bad = |m: String| Err(ModelError::BadConfig(m));
        if self.hidden_size == 0 || self.num_layers == 0 || self.vocab_size == 0 {
            return bad("hidden size, layer count and vocabulary size must be non-zero".into());
        }
        if self.labels.as_ref().is_some_and(Vec::is_empty) {
            return bad("a sequence classifier with no labels (`num_labels` 0)".into());
        }
        if self.num_heads == 0
            || self.num_kv_heads == 0
            || !self.num_heads.is_multiple_of(self.num_kv_heads)
        {
            return bad(format!(
                "{} attention heads is not a multiple of {} KV heads",
                self.num_heads, self.num_kv_heads
            ));
        }
        if self.head_dim == 0
            || !self.head_dim.is_multiple_of(2)
            || self.rope_dim > self.head_dim
            || !self.rope_dim.is_multiple_of(2)
        {
            return bad(format!(
                "bad head dim {} / rope dim {}",
                self.head_dim, self.rope_dim
            ));
        }
        let positive = |v: f32| v.is_finite() && v > 0.0;
        let scales = [
            self.attention_scale,
            self.embedding_scale,
            self.residual_scale,
            self.logits_divisor,
        ];
        if !scales.into_iter().all(positive) {
            return bad(format!(
                "attention, embedding, residual and logit scales {scales:?} must be positive"
            ));
        }
        let caps = [self.attn_logit_softcap, self.final_logit_softcap];
        if caps.into_iter().flatten().any(|c| !positive(c)) || !self.norm_weight_offset.is_finite()
        {
            return bad("logit soft caps must be positive, the norm offset finite".into());
        }
        if self.rotates.len() != self.num_layers {
            return bad(format!(
                "{} layers marked rotating or not for {} layers",
                self.rotates.len(),
                self.num_layers
            ));
        }
        if self.attention_window.len() != self.num_layers
            || self.attention_window.contains(&Some(0))
        {
            return bad(format!(
                "{} attention windows (one per layer, each non-zero) for {} layers",
                self.attention_window.len(),
                self.num_layers
            ));
        }
        if let Some(moe) = &self.moe
            && moe.sparse_layers.len() != self.num_layers
        {
            return bad(format!(
                "{} layers marked sparse or dense for {} layers",
                moe.sparse_layers.len(),
                self.num_layers
            ));
        }
        // Written to also refuse NaN.
        if self.rms_norm_eps.is_nan()
            || self.rms_norm_eps <= 0.0
            || self.rope_theta.is_nan()
            || self.rope_theta <= 0.0
            || self.local_rope_theta.is_some_and(|t| !positive(t))
        {
            return bad("rms_norm_eps and rope_theta must be positive".into());
        }
        self.rope_scaling.validate(self.rope_dim)?;
        Ok(self)
    }

    fn gemma_shape(&self) -> gemma::Shape {
        gemma::Shape {
            hidden_size: self.hidden_size,
            num_heads: self.num_heads,
            num_layers: self.num_layers,
            head_dim: self.head_dim,
        }
    }

    /// A Gemma's options over the Llama family's.
    fn set_gemma(&mut self, o: GemmaOptions) {
        self.qkv_bias = false;
        self.post_norms = true;
        self.qk_norm |= o.qk_norm;
        self.embedding_scale = o.embedding_scale;
        self.norm_weight_offset = o.norm_weight_offset;
        self.attention_scale = o.attention_scale;
        self.attn_logit_softcap = o.attn_logit_softcap;
        self.final_logit_softcap = o.final_logit_softcap;
        self.attention_window = o.attention_window;
        self.local_rope_theta = o.local_rope_theta;
    }

    /// OLMo 2's norms over the Llama family's: after attention and the MLP instead of before,
    /// and over all heads of q and k.
    fn set_olmo2(&mut self) {
        self.pre_norms = false;
        self.post_norms = true;
        self.qk_norm = true;
        self.qk_norm_all_heads = true;
    }

    /// Granite's multipliers over the Llama family's.
    fn set_scales(&mut self, s: variants::Scales) {
        self.embedding_scale = s.embedding;
        self.residual_scale = s.residual;
        self.attention_scale = s.attention;
        self.logits_divisor = s.logits_divisor;
    }

    /// From a Hugging Face `config.json` (transformers 4.x `rope_theta`/`rope_scaling` or 5.x
    /// `rope_parameters`).
    pub fn from_hf_config(cfg: &Value) -> Result<Self> {
        let arch_name = cfg
            .get("architectures")
            .and_then(|a| a.get(0))
            .and_then(Value::as_str)
            .or_else(|| cfg.get("model_type").and_then(Value::as_str))
            .ok_or_else(|| {
                ModelError::BadConfig("config.json has no `architectures` or `model_type`".into())
            })?;
        if arch_name == "Gemma3ForConditionalGeneration" {
            return Self::from_hf_config(&gemma::text_config(cfg)?);
        }
        let architecture: Architecture = causal_name(arch_name).parse()?;
        let uint = |k: &str| cfg.get(k).and_then(Value::as_u64).map(|v| v as usize);
        let req = |k: &str| {
            uint(k).ok_or_else(|| ModelError::BadConfig(format!("config.json: `{k}` missing")))
        };
        let hidden_size = req("hidden_size")?;
        let num_heads = req("num_attention_heads")?;
        let num_kv_heads = uint("num_key_value_heads").unwrap_or(num_heads);
        let head_dim = match uint("head_dim") {
            Some(d) => d,
            None if num_heads > 0 => hidden_size / num_heads,
            None => 0,
        };
        // Gemma 3 in transformers 5 gives parameters per layer type: the global ones are the
        // full-attention layers' (the sliding layers' are `local_rope_theta`).
        let rope = cfg
            .get("rope_parameters")
            .or_else(|| cfg.get("rope_scaling"))
            .filter(|v| !v.is_null())
            .map(|r| r.get("full_attention").unwrap_or(r));
        let rope_theta = cfg
            .get("rope_theta")
            .and_then(Value::as_f64)
            .or_else(|| {
                rope.and_then(|r| r.get("rope_theta"))
                    .and_then(Value::as_f64)
            })
            .unwrap_or(10_000.0) as f32;
        let rope_dim = rope_dim(cfg, rope, head_dim)?;
        let max_position_embeddings = uint("max_position_embeddings").unwrap_or(4096);
        let rope_scaling = HfRope {
            cfg,
            rope,
            max_position: max_position_embeddings,
            rope_dim,
        }
        .scaling()?;
        let attention_bias = cfg.get("attention_bias").and_then(Value::as_bool);
        let gemma = gemma_of(architecture);
        // Gemma reads `hidden_activation` (its configs carry a `hidden_act` that transformers
        // ignores); the others `hidden_act`.
        let act_key = if gemma.is_some() {
            "hidden_activation"
        } else {
            "hidden_act"
        };
        let activation = match cfg.get(act_key) {
            // gpt-oss's configs say `silu`, which its experts do not run.
            _ if architecture == Architecture::GptOss => {
                let (alpha, limit) = gpt_oss_config::swiglu(cfg)?;
                Activation::ClampedSwiglu { alpha, limit }
            }
            None | Some(Value::Null) if gemma.is_some() => Activation::GeluTanh,
            None | Some(Value::Null) => Activation::Silu,
            Some(v) => v
                .as_str()
                .ok_or_else(|| {
                    ModelError::BadConfig(format!("config.json: `{act_key}` {v} is not a name"))
                })?
                .parse()?,
        };
        let num_layers = layer_count(req("num_hidden_layers")?)?;
        let moe = match architecture {
            Architecture::Mixtral => Some(MoeConfig::from_hf(cfg, MoeFamily::Mixtral, num_layers)?),
            Architecture::Qwen2Moe => Some(MoeConfig::from_hf(cfg, MoeFamily::Qwen2, num_layers)?),
            Architecture::Qwen3Moe => Some(MoeConfig::from_hf(cfg, MoeFamily::Qwen3, num_layers)?),
            Architecture::GptOss => Some(MoeConfig::from_hf(cfg, MoeFamily::GptOss, num_layers)?),
            _ => None,
        };
        let dims = Dims {
            architecture,
            vocab_size: req("vocab_size")?,
            hidden_size,
            intermediate_size: req("intermediate_size")?,
            num_layers,
            num_heads,
            num_kv_heads,
            head_dim,
        };
        let mut model = ModelConfig {
            rms_norm_eps: cfg
                .get("rms_norm_eps")
                .and_then(Value::as_f64)
                .unwrap_or(1e-6) as f32,
            rope_theta,
            rope_style: RopeStyle::Neox,
            rope_scaling,
            rope_dim,
            max_position_embeddings,
            tie_word_embeddings: cfg
                .get("tie_word_embeddings")
                .and_then(Value::as_bool)
                .unwrap_or(gemma.is_some() || architecture == Architecture::SmolLm3),
            // Qwen2-MoE's config says `qkv_bias` (true unless it says otherwise).
            qkv_bias: (cfg.get("qkv_bias").and_then(Value::as_bool))
                .or(attention_bias)
                .unwrap_or(matches!(
                    architecture,
                    Architecture::Qwen2 | Architecture::Qwen2Moe | Architecture::GptOss
                )),
            // Qwen2's biases are Q, K and V's alone, whatever its config says.
            o_bias: !matches!(architecture, Architecture::Qwen2 | Architecture::Qwen2Moe)
                && attention_bias.unwrap_or(architecture == Architecture::GptOss),
            qk_norm: matches!(architecture, Architecture::Qwen3 | Architecture::Qwen3Moe),
            activation,
            attention_sinks: architecture == Architecture::GptOss,
            attention_window: window::windows(cfg, window_rule(architecture), num_layers)?,
            moe,
            labels: classifier_labels(cfg, arch_name),
            ..ModelConfig::plain(dims)
        };
        if let Some(g) = gemma {
            let options = gemma::from_hf(cfg, g, model.gemma_shape())?;
            model.set_gemma(options);
        }
        match architecture {
            Architecture::SmolLm3 => {
                model.rotates = variants::smollm3_rotates(cfg, num_layers)?;
                model.attention_window = variants::smollm3_windows(cfg, &model.rotates)?;
            }
            Architecture::Granite => model.set_scales(variants::granite_from_hf(cfg, head_dim)?),
            Architecture::Olmo2 => model.set_olmo2(),
            _ => {}
        }
        model.validate()
    }
}

/// Which rule sets `arch`'s windows from its `config.json` (Gemma 2 sets its own).
fn window_rule(arch: Architecture) -> WindowRule {
    match arch {
        Architecture::Mistral => WindowRule::Mistral,
        Architecture::Qwen2
        | Architecture::Qwen2Moe
        | Architecture::Qwen3
        | Architecture::Qwen3Moe => WindowRule::Qwen,
        // transformers' Phi-3 attention slides where `sliding_window` is set (Phi-3-mini-4k's
        // 2047), on every layer, as Mixtral's.
        Architecture::Mixtral | Architecture::Phi3 => WindowRule::Mixtral,
        Architecture::GptOss => WindowRule::GptOss,
        // SmolLM3 sets its own ([`variants::smollm3_windows`]).
        Architecture::Llama
        | Architecture::SmolLm3
        | Architecture::Granite
        | Architecture::Olmo2
        | Architecture::Gemma2
        | Architecture::Gemma3
        | Architecture::Encoder => WindowRule::None,
    }
}

/// The dimensions of each head that rotate: `partial_rotary_factor` of them (top-level, or in
/// transformers 5's `rope_parameters`; all where neither says), as transformers rounds them.
fn rope_dim(cfg: &Value, rope: Option<&Value>, head_dim: usize) -> Result<usize> {
    let factor = cfg
        .get("partial_rotary_factor")
        .or_else(|| rope.and_then(|r| r.get("partial_rotary_factor")))
        .filter(|v| !v.is_null());
    let Some(factor) = factor else {
        return Ok(head_dim);
    };
    match factor.as_f64() {
        Some(f) if f > 0.0 && f <= 1.0 => Ok((head_dim as f64 * f) as usize),
        _ => Err(ModelError::BadConfig(format!(
            "config.json: `partial_rotary_factor` {factor} is not in (0, 1]"
        ))),
    }
}

/// Which Gemma `arch` is, if one.
fn gemma_of(arch: Architecture) -> Option<Gemma> {
    match arch {
        Architecture::Gemma2 => Some(Gemma::Two),
        Architecture::Gemma3 => Some(Gemma::Three),
        _ => None,
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "rope_tests.rs"]
mod rope_tests;

#[path = "config_gguf.rs"]
mod gguf;
