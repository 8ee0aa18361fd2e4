//! Encoders: BERT, RoBERTa and XLM-RoBERTa (`BertModel`, `RobertaModel`, `XLMRobertaModel`
//! checkpoints, their `*ForMaskedLM` and `*ForPreTraining` ones, whose heads are not read,
//! and their `*ForSequenceClassification` ones), the models most text embeddings and
//! rerankers come from (sentence-transformers' all-MiniLM, bge, e5, gte, bge-m3, multilingual-e5; the
//! ms-marco cross-encoders, bge-reranker), served for embeddings and classification.
//!
//! Every token of an encoder sees the whole prompt (no causal mask), so a prompt runs in one
//! step, whole: the engine's scheduler never cuts it (its `whole_prompts`), nothing is kept
//! of it after (no KV cache: a later step never reads it), and no prefix of it is shared with
//! another prompt (a prefix's states depend on what follows it). The step pools each prompt
//! as its checkpoint says ([`PoolingMode`]: the mean of its tokens' final states, or the first
//! token's, `[CLS]`; a classifier's through its head's dense layer), and that row is what the
//! engine's embeddings (or a classifier's logits) are made of.
//!
//! A layer is post-norm with a bias on every projection: `x = LN(x + O·attn(x))`, then
//! `x = LN(x + Down·gelu(Up·x))`. The input is the token's embedding plus its position's
//! (learned, absolute) plus its token type's ([`EncoderModel::load`]), normalized. RoBERTa's
//! positions start after its padding index (transformers numbers an unpadded prompt's tokens
//! from `pad_token_id + 1`).

use ferrite_formats::{Matrix, TensorMap};
use ferrite_kernels::cpu::attention::softmax_rows;
use ferrite_kernels::cpu::matmul::{MatmulOptions, WeightView};
use ferrite_kernels::cpu::{add_bias, add_in_place, gelu_in_place, layer_norm};
use ferrite_kernels::quant::GgmlType;
use rayon::prelude::*;
use serde_json::Value;

use crate::classify::Classifier;
use crate::config::{Architecture, Dims, ModelConfig};
use crate::error::{ModelError, Result};
use crate::pooling::PoolingMode;
use crate::step::{LogitsWanted, SeqChunk};

/// What an encoder's `config.json` says beyond [`ModelConfig`]'s fields.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderShape {
    pub layer_norm_eps: f32,
    /// The position embedding of the prompt's first token (RoBERTa's `pad_token_id + 1`).
    pub position_offset: usize,
    /// Positions a prompt may take: the table's rows after the offset.
    pub positions: usize,
    /// Tokens a prompt may have: `positions`, or fewer where sentence-transformers'
    /// `max_seq_length` says (all-MiniLM-L6-v2 was trained on 256 of its 512).
    pub max_tokens: usize,
    pub type_vocab_size: usize,
}

/// The encoder family `arch` (a config's `architectures` or `model_type`) names, if one.
fn family(arch: &str) -> Option<&'static str> {
    let suffixes = [
        "ForMaskedLM",
        "ForPreTraining",
        "ForSequenceClassification",
        "Model",
    ];
    let base = suffixes
        .iter()
        .find_map(|suffix| arch.strip_suffix(suffix))
        .unwrap_or(arch);
    match base {
        "Bert" | "bert" => Some("bert"),
        "Roberta" | "roberta" => Some("roberta"),
        "XLMRoberta" | "xlm-roberta" => Some("xlm-roberta"),
        _ => None,
    }
}

/// The architecture `config.json` names: its first `architectures`, else its `model_type`.
fn arch_name(cfg: &Value) -> Option<&str> {
    (cfg.get("architectures").and_then(|a| a.get(0)))
        .or_else(|| cfg.get("model_type"))
        .and_then(Value::as_str)
}

/// Whether `config.json` describes an encoder this module runs.
pub fn is_encoder(cfg: &Value) -> bool {
    arch_name(cfg).and_then(family).is_some()
}

/// An encoder's [`ModelConfig`] (the engine's view: its sizes and vocabulary; no rotary
/// embedding, no KV heads of its own) and its own shape, from `config.json`, its prompts no
/// longer than `max_seq_length` where sentence-transformers' `sentence_bert_config.json` sets
/// one (as sentence-transformers and vLLM hold them).
pub fn config(cfg: &Value, max_seq_length: Option<usize>) -> Result<(ModelConfig, EncoderShape)> {
    let bad = |m: String| ModelError::BadConfig(format!("config.json: {m}"));
    let arch = arch_name(cfg).unwrap_or_default();
    let family = family(arch).ok_or_else(|| bad(format!("`{arch}` is not an encoder")))?;
    let uint = |k: &str| cfg.get(k).and_then(Value::as_u64).map(|v| v as usize);
    let req = |k: &str| uint(k).ok_or_else(|| bad(format!("`{k}` missing")));
    let text = |k: &str| cfg.get(k).and_then(Value::as_str);
    if let Some(act) = text("hidden_act").filter(|a| *a != "gelu") {
        return Err(bad(format!(
            "an encoder's activation `{act}` is not supported (supported: gelu)"
        )));
    }
    if let Some(kind) = text("position_embedding_type").filter(|k| *k != "absolute") {
        return Err(bad(format!(
            "position embeddings `{kind}` are not supported (supported: absolute)"
        )));
    }
    let table = req("max_position_embeddings")?;
    let position_offset = match family {
        "bert" => 0,
        _ => uint("pad_token_id").unwrap_or(1) + 1,
    };
    let positions = table.checked_sub(position_offset).filter(|&p| p > 0);
    let positions = positions.ok_or_else(|| {
        bad(format!(
            "{table} position embeddings leave none after the offset {position_offset}"
        ))
    })?;
    let (hidden, heads) = (req("hidden_size")?, req("num_attention_heads")?);
    if heads == 0 || !hidden.is_multiple_of(heads) {
        return Err(bad(format!("{hidden} is not a multiple of {heads} heads")));
    }
    let eps = cfg.get("layer_norm_eps").and_then(Value::as_f64);
    let shape = EncoderShape {
        layer_norm_eps: eps.unwrap_or(1e-12) as f32,
        position_offset,
        positions,
        max_tokens: max_seq_length
            .filter(|&n| n > 0)
            .map_or(positions, |n| n.min(positions)),
        type_vocab_size: uint("type_vocab_size").unwrap_or(2),
    };
    let num_layers = req("num_hidden_layers")?;
    let head_dim = hidden / heads;
    let dims = Dims {
        architecture: Architecture::Encoder,
        vocab_size: req("vocab_size")?,
        hidden_size: hidden,
        intermediate_size: req("intermediate_size")?,
        num_layers,
        num_heads: heads,
        num_kv_heads: heads,
        head_dim,
    };
    let model = ModelConfig {
        rms_norm_eps: shape.layer_norm_eps,
        rope_dim: head_dim - head_dim % 2,
        // One more than a prompt may hold: the token an embeddings request samples (and
        // never runs) counts against the context.
        max_position_embeddings: shape.max_tokens + 1,
        // The encoder's forward is its own ([`EncoderModel`]), biases and all.
        qkv_bias: true,
        labels: crate::config::classifier_labels(cfg, arch),
        ..ModelConfig::plain(dims)
    };
    Ok((model.validate()?, shape))
}

/// A projection with its bias.
#[derive(Debug)]
struct Linear {
    w: Matrix,
    b: Vec<f32>,
}

/// A LayerNorm's weight and bias.
#[derive(Debug)]
struct Norm {
    w: Vec<f32>,
    b: Vec<f32>,
}

#[derive(Debug)]
struct EncoderLayer {
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    attn_norm: Norm,
    up: Linear,
    down: Linear,
    out_norm: Norm,
}

/// An encoder's weights, on the CPU.
#[derive(Debug)]
pub struct EncoderModel {
    cfg: ModelConfig,
    shape: EncoderShape,
    pooling: PoolingMode,
    words: Matrix,
    /// `[positions table][hidden]` and `[types][hidden]`, in f32.
    positions: Vec<f32>,
    types: Vec<f32>,
    /// The token after which a prompt's second segment starts (BERT's first `[SEP]`), where
    /// the model has a second token type.
    segment_end: Option<u32>,
    embed_norm: Norm,
    layers: Vec<EncoderLayer>,
    /// A sequence classifier's head (`*ForSequenceClassification`).
    head: Option<Head>,
    mm: MatmulOptions,
}

/// A sequence classifier's head over the first token's final state: a dense layer and tanh
/// (BERT's pooler, RoBERTa's `classifier.dense`), then a projection to the labels.
#[derive(Debug)]
struct Head {
    dense: Linear,
    out: Classifier,
}

impl Head {
    /// BERT's (`pooler.dense`, `classifier`) or RoBERTa's (`classifier.dense`,
    /// `classifier.out_proj`), as `t` names them.
    fn load(t: &TensorMap, cfg: &ModelConfig) -> Result<Option<Self>> {
        let Some(labels) = &cfg.labels else {
            return Ok(None);
        };
        let (h, n) = (cfg.hidden_size, labels.len());
        let (dense, out) = match t.contains("classifier.out_proj.weight") {
            true => ("classifier.dense", "classifier.out_proj"),
            false => ("pooler.dense", "classifier"),
        };
        let out = linear(t, out, n, h)?;
        Ok(Some(Self {
            dense: linear(t, dense, h, h)?,
            out: Classifier::new(labels.clone(), out.w.to_f32(), out.b),
        }))
    }
}

/// The tensors' names under the base model's (a `*ForMaskedLM` checkpoint's start with
/// `bert.` or `roberta.`; its head, unread, keeps its own).
pub fn base_names(t: &mut TensorMap) {
    for prefix in ["bert.", "roberta."] {
        if t.contains(&format!("{prefix}embeddings.word_embeddings.weight")) {
            t.rename_prefix(prefix, "");
        }
    }
}

fn linear(t: &TensorMap, name: &str, rows: usize, cols: usize) -> Result<Linear> {
    let w = t.matrix(&format!("{name}.weight"))?;
    Ok(Linear {
        w: w.expect_shape(name, rows, cols)?,
        b: t.vector_of_len(&format!("{name}.bias"), rows)?,
    })
}

/// A LayerNorm's parameters, under today's names or the original BERT checkpoints'
/// (`gamma`, `beta`).
fn norm(t: &TensorMap, name: &str, dim: usize) -> Result<Norm> {
    let (w, b) = match t.contains(&format!("{name}.weight")) {
        true => ("weight", "bias"),
        false => ("gamma", "beta"),
    };
    Ok(Norm {
        w: t.vector_of_len(&format!("{name}.{w}"), dim)?,
        b: t.vector_of_len(&format!("{name}.{b}"), dim)?,
    })
}

impl EncoderLayer {
    fn load(t: &TensorMap, i: usize, c: &ModelConfig) -> Result<Self> {
        let (h, f) = (c.hidden_size, c.intermediate_size);
        let at = |rest: &str| format!("encoder.layer.{i}.{rest}");
        Ok(Self {
            q: linear(t, &at("attention.self.query"), h, h)?,
            k: linear(t, &at("attention.self.key"), h, h)?,
            v: linear(t, &at("attention.self.value"), h, h)?,
            o: linear(t, &at("attention.output.dense"), h, h)?,
            attn_norm: norm(t, &at("attention.output.LayerNorm"), h)?,
            up: linear(t, &at("intermediate.dense"), f, h)?,
            down: linear(t, &at("output.dense"), h, f)?,
            out_norm: norm(t, &at("output.LayerNorm"), h)?,
        })
    }
}

impl EncoderModel {
    /// The encoder `cfg` and `shape` describe, over `t` (names as [`base_names`] leaves them),
    /// pooled by `pooling`.
    ///
    /// A second token type, where the model has one, starts after the first `sep` token that
    /// is not a prompt's last: what BERT's tokenizer gives a pair (`[CLS] A [SEP] B [SEP]`,
    /// B and its `[SEP]` of type 1) and a single text (all of type 0), which is all a prompt
    /// can be here (the engine carries no type ids). A sequence classifier pools the first
    /// token, whatever `pooling` says, and its head applies to that.
    pub fn load(
        t: &TensorMap,
        cfg: ModelConfig,
        shape: EncoderShape,
        pooling: PoolingMode,
        sep: Option<u32>,
    ) -> Result<Self> {
        let h = cfg.hidden_size;
        let table = shape.positions + shape.position_offset;
        let emb = |name: &str, rows: usize| -> Result<Vec<f32>> {
            let name = format!("embeddings.{name}.weight");
            Ok(t.matrix(&name)?.expect_shape(&name, rows, h)?.to_f32())
        };
        let words = t.matrix("embeddings.word_embeddings.weight")?;
        let words = words.expect_shape("embeddings.word_embeddings.weight", cfg.vocab_size, h)?;
        let types = emb("token_type_embeddings", shape.type_vocab_size.max(1))?;
        let layers = (0..cfg.num_layers)
            .map(|i| EncoderLayer::load(t, i, &cfg))
            .collect::<Result<_>>()?;
        let head = Head::load(t, &cfg)?;
        Ok(Self {
            positions: emb("position_embeddings", table)?,
            segment_end: sep.filter(|_| shape.type_vocab_size > 1),
            types,
            embed_norm: norm(t, "embeddings.LayerNorm", h)?,
            words,
            layers,
            pooling: if head.is_some() {
                PoolingMode::Cls
            } else {
                pooling
            },
            head,
            shape,
            cfg,
            mm: MatmulOptions::default().exact(),
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    pub fn shape(&self) -> &EncoderShape {
        &self.shape
    }

    pub fn pooling(&self) -> PoolingMode {
        self.pooling
    }

    /// A sequence classifier's labels and their projection; `None` for an embedding model.
    pub fn classifier(&self) -> Option<&Classifier> {
        self.head.as_ref().map(|h| &h.out)
    }

    /// Each of `seqs` (a whole prompt, from its first token, whose last row of logits is
    /// asked for) through the encoder, pooled: one row of `hidden_size` per sequence, in
    /// order.
    pub fn forward(&self, seqs: &[SeqChunk<'_>]) -> Result<Vec<f32>> {
        for s in seqs {
            let whole = s.start_pos == 0 && s.logits == LogitsWanted::Last && s.prompt;
            if !whole || s.tokens.is_empty() || s.lora.is_some() {
                return Err(ModelError::Internal(format!(
                    "an encoder runs whole prompts only (a chunk of {} tokens from position {})",
                    s.tokens.len(),
                    s.start_pos
                )));
            }
            if s.tokens.len() > self.shape.max_tokens {
                return Err(ModelError::Internal(format!(
                    "a prompt of {} tokens; the encoder takes {}",
                    s.tokens.len(),
                    self.shape.max_tokens
                )));
            }
        }
        let lens: Vec<usize> = seqs.iter().map(|s| s.tokens.len()).collect();
        let mut x = self.embed(seqs);
        // On a thread of the pool, as the decoder's forward runs (see `LlamaModel`'s).
        rayon::scope(|_| {
            (self.layers.iter()).try_for_each(|layer| self.layer(layer, &lens, &mut x))
        })?;
        Ok(self.pool(&x, &lens))
    }

    /// The layers' input: word, position and type embeddings, summed and normalized.
    fn embed(&self, seqs: &[SeqChunk<'_>]) -> Vec<f32> {
        let h = self.cfg.hidden_size;
        let n: usize = seqs.iter().map(|s| s.tokens.len()).sum();
        let mut x = vec![0f32; n * h];
        let rows = seqs.iter().flat_map(|s| {
            let types = self.token_types(s.tokens);
            s.tokens.iter().enumerate().zip(types)
        });
        for (row, ((pos, &id), ty)) in x.chunks_exact_mut(h).zip(rows) {
            self.words.dequantize_row(id as usize, row);
            let p = (pos + self.shape.position_offset) * h;
            add_in_place(row, &self.positions[p..p + h]);
            add_in_place(row, &self.types[ty * h..(ty + 1) * h]);
        }
        let mut out = vec![0f32; x.len()];
        let Norm { w, b } = &self.embed_norm;
        layer_norm(&x, w, b, self.shape.layer_norm_eps, &mut out);
        out
    }

    /// The token type of each of a prompt's `tokens` (see [`Self::load`]).
    fn token_types(&self, tokens: &[u32]) -> Vec<usize> {
        let last = tokens.len().saturating_sub(1);
        let first_end = self
            .segment_end
            .and_then(|sep| (tokens.iter().position(|&t| t == sep)).filter(|&i| i < last));
        match first_end {
            Some(end) => (0..tokens.len()).map(|i| usize::from(i > end)).collect(),
            None => vec![0; tokens.len()],
        }
    }

    /// `x` (the sequences of `lens` tokens, one after another) through `layer`, in place.
    /// `l` applied to the `n` rows of `x`: `x · Wᵀ + b`.
    fn project(&self, l: &Linear, x: &[f32], n: usize) -> Vec<f32> {
        let mut out = vec![0f32; n * l.w.rows];
        self.mm.one(x, n, l.w.view(), &mut out);
        add_bias(&mut out, &l.b);
        out
    }

    fn layer(&self, layer: &EncoderLayer, lens: &[usize], x: &mut [f32]) -> Result<()> {
        let n = x.len() / self.cfg.hidden_size;
        let proj = |l: &Linear, input: &[f32]| self.project(l, input, n);
        let (q, k, v) = (proj(&layer.q, x), proj(&layer.k, x), proj(&layer.v, x));
        let attn = self.attention(&q, &k, &v, lens)?;
        let mut sum = proj(&layer.o, &attn);
        add_in_place(&mut sum, x);
        let eps = self.shape.layer_norm_eps;
        layer_norm(&sum, &layer.attn_norm.w, &layer.attn_norm.b, eps, x);
        let mut up = proj(&layer.up, x);
        gelu_in_place(&mut up);
        let mut sum = proj(&layer.down, &up);
        add_in_place(&mut sum, x);
        layer_norm(&sum, &layer.out_norm.w, &layer.out_norm.b, eps, x);
        Ok(())
    }

    /// Each token's attention over every token of its own sequence, one task per sequence
    /// and head, each two matrix products: a whole prompt's queries against its keys at once
    /// (the decoder's kernel, which reads the keys once per query, took a third of the
    /// forward at 128 tokens).
    fn attention(&self, q: &[f32], k: &[f32], v: &[f32], lens: &[usize]) -> Result<Vec<f32>> {
        let c = &self.cfg;
        let (h, d) = (c.hidden_size, c.head_dim);
        let mut tasks = Vec::new();
        let mut start = 0;
        for &len in lens {
            tasks.extend((0..c.num_heads).map(|head| (start, len, head)));
            start += len;
        }
        let heads: Vec<Vec<f32>> = tasks
            .par_iter()
            .map(|&(start, len, head)| {
                let rows = (start..start + len).map(|t| t * h + head * d..t * h + (head + 1) * d);
                self.head_attention(rows.map(|r| (&q[r.clone()], &k[r.clone()], &v[r])), len)
            })
            .collect::<Result<_>>()?;
        let mut out = vec![0f32; q.len()];
        for (&(start, len, head), o) in tasks.iter().zip(&heads) {
            for (t, row) in o.chunks_exact(d).enumerate().take(len) {
                out[(start + t) * h + head * d..][..d].copy_from_slice(row);
            }
        }
        Ok(out)
    }

    /// `softmax(Q·Kᵀ·scale)·V` for one head of one sequence of `len` tokens, given each
    /// token's query, key and value rows: `[len][head_dim]`.
    fn head_attention<'r>(
        &self,
        rows: impl Iterator<Item = (&'r [f32], &'r [f32], &'r [f32])>,
        len: usize,
    ) -> Result<Vec<f32>> {
        let d = self.cfg.head_dim;
        let (mut q, mut k, mut vt) = (
            Vec::with_capacity(len * d),
            Vec::with_capacity(len * d),
            vec![0f32; d * len],
        );
        for (t, (qr, kr, vr)) in rows.enumerate() {
            q.extend_from_slice(qr);
            k.extend_from_slice(kr);
            vr.iter()
                .enumerate()
                .for_each(|(j, &x)| vt[j * len + t] = x);
        }
        let mut scores = vec![0f32; len * len];
        self.mm.one(&q, len, f32_view(&k, len, d)?, &mut scores);
        let scale = self.cfg.attention_scale;
        scores.iter_mut().for_each(|s| *s *= scale);
        softmax_rows(&mut scores, len);
        let mut out = vec![0f32; len * d];
        self.mm.one(&scores, len, f32_view(&vt, d, len)?, &mut out);
        Ok(out)
    }

    /// One row per sequence: its tokens' final states pooled (a classifier's through its
    /// head's dense layer: its labels' projection is the engine's to apply).
    fn pool(&self, x: &[f32], lens: &[usize]) -> Vec<f32> {
        let h = self.cfg.hidden_size;
        let mut out = Vec::with_capacity(lens.len() * h);
        let mut start = 0;
        for &len in lens {
            let rows = &x[start * h..(start + len) * h];
            match self.pooling {
                PoolingMode::Cls => match &self.head {
                    Some(head) => {
                        let pooled = self.project(&head.dense, &rows[..h], 1);
                        out.extend(pooled.iter().map(|v| v.tanh()));
                    }
                    None => out.extend_from_slice(&rows[..h]),
                },
                PoolingMode::LastToken => out.extend_from_slice(&rows[(len - 1) * h..]),
                PoolingMode::Mean => {
                    // Summed in f64, as the order of an f32 sum would show in the last bits.
                    let mut sum = vec![0f64; h];
                    for row in rows.chunks_exact(h) {
                        sum.iter_mut().zip(row).for_each(|(s, &v)| *s += v as f64);
                    }
                    out.extend(sum.iter().map(|s| (s / len as f64) as f32));
                }
            }
            start += len;
        }
        out
    }
}

/// `w`, `[rows][cols]` f32, as a matrix the matmul takes.
fn f32_view(w: &[f32], rows: usize, cols: usize) -> Result<WeightView<'_>> {
    WeightView::new(GgmlType::F32, rows, cols, bytemuck::cast_slice(w))
        .map_err(|e| ModelError::Internal(format!("attention: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bert(extra: Value) -> Value {
        let mut c = serde_json::json!({"architectures": ["BertModel"], "hidden_size": 64,
            "num_attention_heads": 4, "num_hidden_layers": 2, "intermediate_size": 128,
            "vocab_size": 100, "max_position_embeddings": 512, "hidden_act": "gelu"});
        c.as_object_mut()
            .expect("object")
            .extend(extra.as_object().expect("object").clone());
        c
    }

    /// BERT's positions start at 0, RoBERTa's after its padding index; sentence-transformers'
    /// `max_seq_length` holds a prompt shorter; the context is one more (the sampled token).
    #[test]
    fn an_encoders_config_gives_its_positions_and_context() {
        let (cfg, shape) = config(&bert(serde_json::json!({})), None).expect("bert");
        assert_eq!((shape.position_offset, shape.max_tokens), (0, 512));
        assert_eq!((cfg.max_position_embeddings, cfg.head_dim), (513, 16));
        let (cfg, shape) = config(&bert(serde_json::json!({})), Some(256)).expect("capped");
        assert_eq!(
            (
                shape.positions,
                shape.max_tokens,
                cfg.max_position_embeddings
            ),
            (512, 256, 257)
        );
        let roberta = bert(
            serde_json::json!({"architectures": ["XLMRobertaForSequenceClassification"],
            "max_position_embeddings": 514, "pad_token_id": 1, "num_labels": 3}),
        );
        let (cfg, shape) = config(&roberta, None).expect("xlm-r");
        assert_eq!((shape.position_offset, shape.positions), (2, 512));
        assert_eq!(cfg.labels.map(|l| l.len()), Some(3));
        for (extra, says) in [
            (serde_json::json!({"hidden_act": "relu"}), "`relu`"),
            (
                serde_json::json!({"position_embedding_type": "relative_key"}),
                "`relative_key`",
            ),
            (
                serde_json::json!({"architectures": ["BertForQuestionAnswering"]}),
                "not an encoder",
            ),
        ] {
            let e = config(&bert(extra), None).expect_err(says);
            assert!(e.to_string().contains(says), "{e}");
        }
    }
}
