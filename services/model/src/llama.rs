//! The Llama family (Llama 2/3/3.1, SmolLM2 and 3, Mistral, Qwen2/2.5, Qwen3, Phi-3, Granite,
//! OLMo 2) and Gemma 2 and 3: one layer struct with `load` and `forward`, weights borrowed in
//! place from the checkpoint. Each family is the same forward with the options of
//! [`ModelConfig`] it sets (Gemma's GeGLU, scaled embeddings, norms after attention and MLP,
//! soft caps, sliding windows; SmolLM3's layers without rotation; Granite's multipliers; OLMo
//! 2's norms after and none before).
//!
//! A forward runs a batch of sequence chunks of different lengths (prefill chunks and single
//! decode tokens mixed) as one flat `[tokens, hidden]` activation matrix, so every projection is
//! one matmul over the whole batch; only attention looks at sequence boundaries, through each
//! sequence's block table in the paged KV cache.
//!
//! # Layer by layer, from outside
//!
//! The offline tools (calibration and `ferrite quantize`, the `ferrite-quantize` crate) drive
//! the model one decoder layer at a time, on weights of their own: [`Layer`] (its weights,
//! public to be rounded and rescaled), [`LayerAt`] and [`LayerBuffers`] (where and over what it
//! runs), [`LlamaModel::layer_forward`] with a tap on each [`Site`],
//! [`LlamaModel::embed_tokens`], the model's parts ([`LlamaModel::layers`] and the rest), and
//! [`ModelConfig::rope`]. They are public for those tools alone; serving runs [`LlamaModel::forward`].

use ferrite_kernels::cpu::attention::QueryToken;
use ferrite_kernels::cpu::matmul::MatmulOptions;
use ferrite_kernels::cpu::rope::Rope;
use ferrite_kernels::cpu::{rms_norm, soft_cap_in_place};

use std::ops::Range;

use ferrite_collective::Collective;
use ferrite_formats::{LoadQuantize, Matrix, TensorMap};

use crate::classify::Classifier;
use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::kv::KvCache;
use crate::lora::{LoraRows, LoraSet};
use crate::moe::{Ffn, Mlp, Moe};
pub use crate::naming::WeightNaming;
use crate::rope::RopeScaling;
use crate::schedule::decoder_layer;
use crate::step::{LogitsWanted, SeqChunk};
use crate::tp::{ShardRows, TpRank};

#[path = "llama_ops.rs"]
mod ops;
use ops::CpuLayer;

/// One decoder layer's weights. Public, fields and all, for the offline tools: calibration
/// quantizes a copy of each layer (its projections rounded, scales folded into its norms and
/// rows) and runs it with [`LlamaModel::layer_forward`]; `ferrite quantize` writes it out.
#[derive(Debug, Clone)]
pub struct Layer {
    /// The RMSNorm before attention (with Gemma's offset folded in); OLMo 2 has none.
    pub attn_norm: Option<Vec<f32>>,
    pub q: Matrix,
    pub k: Matrix,
    pub v: Matrix,
    pub qkv_bias: Option<[Vec<f32>; 3]>,
    /// The output projection's bias ([`ModelConfig::o_bias`]), on rank 0 only: the ranks'
    /// partial sums are added up after it.
    pub o_bias: Option<Vec<f32>>,
    /// gpt-oss: this rank's heads' sink logits ([`ModelConfig::attention_sinks`]).
    pub sinks: Option<Vec<f32>>,
    /// The RMSNorms of q and k: of each head (Qwen3, Gemma 3; `head_dim` weights), or of all
    /// heads together (OLMo 2; `q_dim` and `kv_dim` weights).
    pub qk_norm: Option<[Vec<f32>; 2]>,
    pub o: Matrix,
    /// Gemma 2 and 3, OLMo 2: the norms of the attention output and of the MLP output.
    pub post_norms: Option<[Vec<f32>; 2]>,
    /// The RMSNorm before the MLP; OLMo 2 has none.
    pub ffn_norm: Option<Vec<f32>>,
    pub mlp: Mlp,
}

impl Layer {
    /// Every matrix the layer multiplies by (a mixture's router included).
    pub fn matrices(&self) -> Vec<&Matrix> {
        let mut all = vec![&self.q, &self.k, &self.v, &self.o];
        all.extend(self.mlp.matrices());
        all
    }

    /// The projections (a mixture's router, kept as stored, left out).
    pub fn projections(&self) -> Vec<&Matrix> {
        let mut all = vec![&self.q, &self.k, &self.v, &self.o];
        all.extend(self.mlp.projections());
        all
    }

    /// The projections, each with its name in errors (`q`, …, `expert 3 down`), to be
    /// replaced by quantized copies (a mixture's router stays as stored).
    pub fn projections_mut(&mut self) -> Vec<(String, &mut Matrix)> {
        let attention = [&mut self.q, &mut self.k, &mut self.v, &mut self.o];
        let attention = (["q", "k", "v", "o"].into_iter().map(str::to_owned)).zip(attention);
        attention.chain(self.mlp.named_mut()).collect()
    }

    /// Layer `i` of a model of shape `c`, cut to `tp`'s shard (see [`crate::tp`]).
    fn load(t: &TensorMap, n: WeightNaming, i: usize, c: &ModelConfig, tp: TpRank) -> Result<Self> {
        let (h, q_dim, kv_dim, ffn) = (c.hidden_size, c.q_dim(), c.kv_dim(), c.intermediate_size);
        let ShardRows {
            q: q_rows,
            kv: kv_rows,
            ffn: ffn_part,
        } = tp.rows(c);
        let full = |gguf: &str, hf: &str, rows, cols| {
            let name = n.layer(i, gguf, hf);
            t.matrix(&name)?
                .expect_shape(&name, rows, cols)
                .map(|m| (name, m))
        };
        // Column-parallel: this rank's rows; row-parallel: its columns.
        let rows_of = |gguf: &str, hf: &str, rows, cols, part: &Range<usize>| {
            let (name, m) = full(gguf, hf, rows, cols)?;
            m.slice_rows(&name, part.clone())
        };
        let cols_of = |gguf: &str, hf: &str, rows, cols, part: &Range<usize>| {
            let (name, m) = full(gguf, hf, rows, cols)?;
            m.slice_cols(&name, part.clone())
        };
        // Phi-3's fused projections (Q|K|V in one matrix, gate|up in another): each part is
        // cut out, then to this rank's rows, as if it were stored alone.
        let has = |gguf: &str, hf: &str| t.contains(&n.layer(i, gguf, hf));
        let part_of = |(gguf, hf): (&str, &str), rows, at: usize, part: &Range<usize>| {
            let (name, m) = full(gguf, hf, rows, h)?;
            m.slice_rows(&name, at + part.start..at + part.end)
        };
        let vec = |gguf: &str, hf: &str, len| t.vector_of_len(&n.layer(i, gguf, hf), len);
        let norm = |gguf: &str, hf: &str, len| vec(gguf, hf, len).map(|w| offset_norm(w, c));
        let qkv_bias = if c.qkv_bias {
            Some([
                vec("attn_q.bias", "self_attn.q_proj.bias", q_dim)?[q_rows.clone()].to_vec(),
                vec("attn_k.bias", "self_attn.k_proj.bias", kv_dim)?[kv_rows.clone()].to_vec(),
                vec("attn_v.bias", "self_attn.v_proj.bias", kv_dim)?[kv_rows.clone()].to_vec(),
            ])
        } else {
            None
        };
        let o_bias = match c.o_bias && tp.rank == 0 {
            true => Some(vec("attn_output.bias", "self_attn.o_proj.bias", h)?),
            false => None,
        };
        let heads = q_rows.start / c.head_dim..q_rows.end / c.head_dim;
        let sinks = match c.attention_sinks {
            true => Some(vec("attn_sinks.weight", "self_attn.sinks", c.num_heads)?[heads].to_vec()),
            false => None,
        };
        // Norms over all heads are whole-model vectors (tensor parallelism refuses them).
        let (q_norm_len, k_norm_len) = c.qk_norm_lens();
        let qk_norm = if c.qk_norm {
            Some([
                norm("attn_q_norm.weight", "self_attn.q_norm.weight", q_norm_len)?,
                norm("attn_k_norm.weight", "self_attn.k_norm.weight", k_norm_len)?,
            ])
        } else {
            None
        };
        let pre_norm = |gguf: &str, hf: &str| match c.pre_norms {
            true => norm(gguf, hf, h).map(Some),
            false => Ok(None),
        };
        // Gemma 2's HF `post_attention_layernorm` normalizes the attention output; Llama's is
        // the norm before the MLP, which Gemma 2 calls `pre_feedforward_layernorm`.
        let (ffn_norm_hf, post_norms) = if c.post_norms {
            let post = [
                norm(
                    "post_attention_norm.weight",
                    "post_attention_layernorm.weight",
                    h,
                )?,
                norm(
                    "post_ffw_norm.weight",
                    "post_feedforward_layernorm.weight",
                    h,
                )?,
            ];
            ("pre_feedforward_layernorm.weight", Some(post))
        } else {
            ("post_attention_layernorm.weight", None)
        };
        let qkv = ("attn_qkv.weight", "self_attn.qkv_proj.weight");
        let (q, k, v) = if has(qkv.0, qkv.1) {
            let all = q_dim + 2 * kv_dim;
            (
                part_of(qkv, all, 0, &q_rows)?,
                part_of(qkv, all, q_dim, &kv_rows)?,
                part_of(qkv, all, q_dim + kv_dim, &kv_rows)?,
            )
        } else {
            (
                rows_of(
                    "attn_q.weight",
                    "self_attn.q_proj.weight",
                    q_dim,
                    h,
                    &q_rows,
                )?,
                rows_of(
                    "attn_k.weight",
                    "self_attn.k_proj.weight",
                    kv_dim,
                    h,
                    &kv_rows,
                )?,
                rows_of(
                    "attn_v.weight",
                    "self_attn.v_proj.weight",
                    kv_dim,
                    h,
                    &kv_rows,
                )?,
            )
        };
        // GGUF's fused gate|up is `ffn_up` with no `ffn_gate` beside it.
        let gate_up = ("ffn_up.weight", "mlp.gate_up_proj.weight");
        let fused_mlp =
            !has("ffn_gate.weight", "mlp.gate_proj.weight") && has(gate_up.0, gate_up.1);
        Ok(Layer {
            attn_norm: pre_norm("attn_norm.weight", "input_layernorm.weight")?,
            q,
            k,
            v,
            qkv_bias,
            o_bias,
            sinks,
            qk_norm,
            o: cols_of(
                "attn_output.weight",
                "self_attn.o_proj.weight",
                h,
                q_dim,
                &q_rows,
            )?,
            post_norms,
            ffn_norm: pre_norm(ffn_norm_gguf(c), ffn_norm_hf)?,
            mlp: match c.moe.as_ref().filter(|m| m.sparse_layers[i]) {
                Some(moe) => Mlp::Sparse(Moe::load(t, n, i, c, moe, tp)?),
                None if fused_mlp => Mlp::Dense(Ffn {
                    gate: part_of(gate_up, 2 * ffn, 0, &ffn_part)?,
                    up: part_of(gate_up, 2 * ffn, ffn, &ffn_part)?,
                    down: cols_of("ffn_down.weight", "mlp.down_proj.weight", h, ffn, &ffn_part)?,
                    bias: None,
                }),
                None => Mlp::Dense(Ffn {
                    gate: rows_of("ffn_gate.weight", "mlp.gate_proj.weight", ffn, h, &ffn_part)?,
                    up: rows_of("ffn_up.weight", "mlp.up_proj.weight", ffn, h, &ffn_part)?,
                    down: cols_of("ffn_down.weight", "mlp.down_proj.weight", h, ffn, &ffn_part)?,
                    bias: None,
                }),
            },
        })
    }
}

/// A model, or one rank's shard of it: then `cfg` is the shard's shape (its heads, KV heads
/// and intermediate size; the vocabulary stays the model's) and `lm_head` holds the rank's
/// rows of the vocabulary.
#[derive(Debug)]
pub struct LlamaModel {
    pub(crate) cfg: ModelConfig,
    pub(crate) tp: TpRank,
    pub(crate) embed: Matrix,
    pub(crate) layers: Vec<Layer>,
    pub(crate) norm: Box<[f32]>,
    pub(crate) lm_head: Matrix,
    pub(crate) rope: Rope,
    /// Gemma 3's sliding layers' rotary embedding ([`ModelConfig::local_rope_theta`]).
    pub(crate) local_rope: Option<Box<Rope>>,
    /// How this model's matmuls run on the CPU (set after loading, from [`LoadOptions`]).
    ///
    /// [`LoadOptions`]: crate::load::LoadOptions
    pub(crate) matmul: MatmulOptions,
    /// The LoRA adapters requests may run with ([`SeqChunk::lora`] indexes them). Boxed:
    /// most models serve none.
    pub(crate) lora: Box<LoraSet>,
    /// A sequence classifier's head ([`ModelConfig::labels`]); `None` for a generative model.
    pub(crate) classifier: Option<Box<Classifier>>,
}

impl LlamaModel {
    /// The whole model.
    pub fn load(t: &TensorMap, naming: WeightNaming, cfg: ModelConfig) -> Result<Self> {
        Self::load_shard(t, naming, cfg, TpRank::SOLO)
    }

    /// `tp`'s shard of the model of shape `cfg` (which must split: [`crate::tp::check_split`]).
    pub fn load_shard(
        t: &TensorMap,
        naming: WeightNaming,
        cfg: ModelConfig,
        tp: TpRank,
    ) -> Result<Self> {
        let n = naming;
        let embed_name = n.global("token_embd.weight", "model.embed_tokens.weight");
        let embed =
            t.matrix(&embed_name)?
                .expect_shape(&embed_name, cfg.vocab_size, cfg.hidden_size)?;
        let head_name = n.global("output.weight", "lm_head.weight");
        // A classifier's checkpoint has no LM head: the embeddings stand in ([`crate::classify`]).
        let tied = cfg.tie_word_embeddings || cfg.labels.is_some();
        let lm_head = if tied && !t.contains(&head_name) {
            embed.clone()
        } else {
            t.matrix(&head_name)?
                .expect_shape(&head_name, cfg.vocab_size, cfg.hidden_size)?
        };
        let lm_head = lm_head.slice_rows(&head_name, tp.vocab_part(cfg.vocab_size))?;
        let layers = (0..cfg.num_layers)
            .map(|i| Layer::load(t, n, i, &cfg, tp))
            .collect::<Result<Vec<_>>>()?;
        let norm = t.vector_of_len(
            &n.global("output_norm.weight", "model.norm.weight"),
            cfg.hidden_size,
        )?;
        let norm = offset_norm(norm, &cfg).into_boxed_slice();
        // Llama 3.1 GGUF files carry the scaled frequencies as per-pair divisors.
        let freq_factors = if t.contains("rope_freqs.weight") {
            Some(t.vector_of_len("rope_freqs.weight", cfg.rope_dim / 2)?)
        } else {
            None
        };
        let rope = cfg.rope(freq_factors.as_deref(), cfg.default_context());
        let local_rope = cfg.local_rope().map(Box::new);
        let classifier = Classifier::load(t, n, &cfg)?.map(Box::new);
        Ok(Self {
            cfg: cfg.shard(tp),
            tp,
            embed,
            layers,
            norm,
            lm_head,
            rope,
            local_rope,
            matmul: MatmulOptions::default(),
            lora: Box::new(LoraSet::new(cfg)),
            classifier,
        })
    }

    pub fn config(&self) -> &ModelConfig {
        &self.cfg
    }

    /// Which shard of the model this is.
    pub fn tp(&self) -> TpRank {
        self.tp
    }

    /// Bytes of weights this model reads per forward (all matrices, once; every expert of a
    /// mixture, as a step of many tokens does).
    pub fn weight_bytes(&self) -> usize {
        let per_layer: usize = self
            .layers
            .iter()
            .flat_map(Layer::matrices)
            .map(Matrix::bytes_len)
            .sum();
        per_layer + self.lm_head.bytes_len()
    }

    /// Brings the pages of this model's (shard's) matrices into memory: what a rank of a pool
    /// reads of the checkpoint. The embedding is left to page in row by row as tokens use it
    /// (every rank maps it whole; each reads only the rows it meets). Returns the bytes.
    pub fn load_pages(&self) -> usize {
        let layers: usize = self
            .layers
            .iter()
            .flat_map(Layer::matrices)
            .map(Matrix::load_pages)
            .sum();
        layers + self.lm_head.load_pages()
    }

    /// Replaces every layer's projections with round-to-nearest quantized copies as `format`
    /// says; the embeddings and the LM head stay as they are (as in GPTQ checkpoints).
    pub fn quantize_linear(&mut self, format: LoadQuantize) -> Result<()> {
        for (i, l) in self.layers.iter_mut().enumerate() {
            for (name, m) in l.projections_mut() {
                *m = m.quantize_rtn(&format!("layer {i} {name}"), format)?;
            }
        }
        Ok(())
    }

    /// How the layers' projections are stored (`Q4_1`, `F16`, `w4g128`; mixed types joined).
    pub fn linear_storage(&self) -> String {
        let mut names: Vec<String> = self
            .layers
            .iter()
            .flat_map(Layer::projections)
            .map(Matrix::storage_name)
            .collect();
        names.sort();
        names.dedup();
        names.join("+")
    }

    /// Runs `seqs` through the model (this rank's shard, meeting the other ranks in `comm`),
    /// writing their keys and values into `kv`. Returns the logits each chunk asked for, in
    /// order, as rows of `vocab_size`.
    pub fn forward(
        &self,
        seqs: &[SeqChunk<'_>],
        kv: &mut KvCache,
        comm: &mut dyn Collective,
    ) -> Result<Vec<f32>> {
        Ok(self.forward_with_hidden(seqs, kv, comm)?.0)
    }

    /// [`Self::forward`], and the final hidden state (after the last norm) of each row of
    /// logits, in the same order, as rows of `hidden_size`: what an embedding is pooled from.
    /// Every rank has them whole.
    pub fn forward_with_hidden(
        &self,
        seqs: &[SeqChunk<'_>],
        kv: &mut KvCache,
        comm: &mut dyn Collective,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        // The whole step runs on a thread of the pool, so each of its ~5 parallel regions per
        // layer starts from there. Called from outside the pool, every region was injected
        // into it while the caller slept on a latch: two thread wake-ups per region, a large
        // share of a one-token step on a 2-core machine. The pool is the caller's (rayon's
        // global one unless inside `ThreadPool::install`): ranks of a pool that share a process
        // need one each, or one rank's forward waits on the pool while another holds it
        // waiting in a collective.
        rayon::scope(|_| self.forward_on_pool(seqs, kv, comm))
    }

    fn forward_on_pool(
        &self,
        seqs: &[SeqChunk<'_>],
        kv: &mut KvCache,
        comm: &mut dyn Collective,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let c = &self.cfg;
        let h = c.hidden_size;
        let mut positions = Vec::new();
        let mut owner = Vec::new();
        for (s, seq) in seqs.iter().enumerate() {
            let needed = (seq.start_pos + seq.tokens.len()).div_ceil(kv.block_size);
            if seq.block_table.len() < needed {
                return Err(ModelError::Internal(format!(
                    "block table holds {} blocks, {needed} needed",
                    seq.block_table.len()
                )));
            }
            positions.extend(seq.start_pos..seq.start_pos + seq.tokens.len());
            owner.extend(std::iter::repeat_n(s, seq.tokens.len()));
        }
        let n_tok = positions.len();
        let x = self.embed_tokens(seqs.iter().flat_map(|s| s.tokens.iter().copied()), n_tok);
        let query_tokens: Vec<QueryToken<'_>> = positions
            .iter()
            .zip(&owner)
            .map(|(&pos, &s)| QueryToken {
                block_table: seqs[s].block_table,
                pos,
            })
            .collect();
        let mut bufs = LayerBuffers::new(c, x);
        let prompt = seqs.iter().any(|s| s.prompt);
        let lora = self.lora.runs(seqs)?;
        for (li, layer) in self.layers.iter().enumerate() {
            let at = LayerAt {
                index: li,
                positions: &positions,
                query_tokens: &query_tokens,
                prompt,
                lora: &lora,
            };
            self.layer_forward(layer, &at, &mut bufs, kv, comm, &mut |_, _| {})?;
        }
        let x = bufs.x;
        // Only the rows someone asked for go through the final norm and the LM head.
        let mut picked = Vec::new();
        let mut t0 = 0;
        for seq in seqs {
            let len = seq.tokens.len();
            let rows = match seq.logits {
                LogitsWanted::None => 0..0,
                LogitsWanted::Last => t0 + len - 1..t0 + len,
                LogitsWanted::All => t0..t0 + len,
            };
            for r in rows {
                picked.extend_from_slice(&x[r * h..(r + 1) * h]);
            }
            t0 += len;
        }
        let n_out = picked.len() / h;
        let mut normed = vec![0f32; picked.len()];
        rms_norm(&picked, &self.norm, c.rms_norm_eps, &mut normed);
        let mut logits = self.lm_head_logits(&normed, n_out, comm)?;
        if c.logits_divisor != 1.0 {
            logits.iter_mut().for_each(|l| *l /= c.logits_divisor);
        }
        if let Some(cap) = c.final_logit_softcap {
            soft_cap_in_place(&mut logits, cap);
        }
        Ok((logits, normed))
    }
}

/// A projection input [`LlamaModel::layer_forward`] shows its tap (calibration gathers its
/// statistics there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Site {
    /// The normed hidden state q, k and v read.
    Qkv,
    /// The attention output o reads.
    O,
    /// The normed hidden state gate and up read.
    GateUp,
    /// The activated product down reads.
    Down,
}

/// Where a layer runs: its index and the tokens' positions and KV blocks. Public for the
/// offline tools, which run the layers one at a time ([`LlamaModel::layer_forward`]).
#[derive(Debug)]
pub struct LayerAt<'a> {
    pub index: usize,
    pub positions: &'a [usize],
    pub query_tokens: &'a [QueryToken<'a>],
    /// Whether the tokens include a prompt's ([`SeqChunk::prompt`]). Such steps take
    /// activations exact or nearly so ([`MatmulOptions::fine`]) whatever `--cpu-activations`
    /// says: at one int8 term, a prompt's rounding flips the first pick of near-ties (the
    /// README question's "The" became "L'Étoile"). Steps of one decode token per sequence
    /// take the model's setting, alone or batched: llama.cpp's arithmetic for generated
    /// tokens, at half the integer work of two terms.
    pub prompt: bool,
    /// The runs of tokens that run with a LoRA adapter (the others run with none).
    pub lora: &'a [LoraRows],
}

/// The activations of one layer's forward, sized for a number of tokens. Public for the
/// offline tools, which carry the hidden states `x` from one layer to the next themselves.
#[derive(Debug)]
pub struct LayerBuffers {
    /// The hidden states, `[tokens, hidden]`: a layer's input, then its output.
    pub x: Vec<f32>,
    xn: Vec<f32>,
    q: Vec<f32>,
    k: Vec<f32>,
    v: Vec<f32>,
    attn: Vec<f32>,
    proj: Vec<f32>,
    gate: Vec<f32>,
    up: Vec<f32>,
}

impl LayerBuffers {
    /// Buffers around the hidden states `x` (`[tokens, hidden]`).
    pub fn new(c: &ModelConfig, x: Vec<f32>) -> Self {
        let (h, q_dim, kv_dim) = (c.hidden_size, c.q_dim(), c.kv_dim());
        let n_tok = x.len() / h.max(1);
        Self {
            x,
            xn: vec![0f32; n_tok * h],
            q: vec![0f32; n_tok * q_dim],
            k: vec![0f32; n_tok * kv_dim],
            v: vec![0f32; n_tok * kv_dim],
            attn: vec![0f32; n_tok * q_dim],
            proj: vec![0f32; n_tok * h],
            gate: vec![0f32; n_tok * c.intermediate_size],
            up: vec![0f32; n_tok * c.intermediate_size],
        }
    }
}

impl LlamaModel {
    /// The embeddings of `n_tok` token ids (in the vocabulary: the engine admits only such
    /// prompts and samples only such ids), scaled as the model wants: the first layer's input.
    pub fn embed_tokens(&self, ids: impl Iterator<Item = u32>, n_tok: usize) -> Vec<f32> {
        let h = self.cfg.hidden_size;
        let mut x = vec![0f32; n_tok * h];
        for (row, id) in x.chunks_exact_mut(h).zip(ids) {
            self.embed.dequantize_row(id as usize, row);
            if self.cfg.embedding_scale != 1.0 {
                row.iter_mut().for_each(|v| *v *= self.cfg.embedding_scale);
            }
        }
        x
    }

    /// One decoder layer over the hidden states `x` (updated in place), with `layer`'s weights
    /// (this model's own, or calibration's stand-ins). `tap` sees each projection's input.
    pub fn layer_forward(
        &self,
        layer: &Layer,
        at: &LayerAt<'_>,
        b: &mut LayerBuffers,
        kv: &mut KvCache,
        comm: &mut dyn Collective,
        tap: &mut dyn FnMut(Site, &[f32]),
    ) -> Result<()> {
        let mm = if at.prompt {
            self.matmul.fine()
        } else {
            self.matmul
        };
        let mut ops = CpuLayer {
            model: self,
            at,
            b,
            kv,
            comm,
            tap,
            mm,
        };
        decoder_layer(&mut ops, at.index, layer)
    }
}

/// LoRA adapters ([`crate::lora`]).
impl LlamaModel {
    /// Loads the adapter saved in `dir` (this model's shard of it), to be asked for as
    /// adapter number [`Self::lora_names`]`().len()` before it, under `name`.
    pub fn load_lora(&mut self, name: &str, dir: &std::path::Path) -> Result<()> {
        self.lora.load(name, dir, self.tp)
    }

    /// The adapters' names, in the order requests number them.
    pub fn lora_names(&self) -> Vec<String> {
        self.lora.names()
    }

    /// A sequence classifier's head; `None` for a generative model.
    pub fn classifier(&self) -> Option<&Classifier> {
        self.classifier.as_deref()
    }
}

/// The model's parts, for the offline tools: calibration runs [`Self::layers`] one by one,
/// `ferrite quantize` writes them all out. (The engine reads the fields.)
impl LlamaModel {
    /// The decoder layers, in order.
    pub fn layers(&self) -> &[Layer] {
        &self.layers
    }

    /// The token embeddings, `[vocab, hidden]`.
    pub fn embed(&self) -> &Matrix {
        &self.embed
    }

    /// The final RMSNorm's weight (with Gemma's offset folded in).
    pub fn norm(&self) -> &[f32] {
        &self.norm
    }

    /// The LM head (this rank's rows of the vocabulary): the embeddings' storage when tied.
    pub fn lm_head(&self) -> &Matrix {
        &self.lm_head
    }

    /// Fits the rotary embedding to contexts of up to `max_model_len` tokens: LongRoPE's
    /// factors are the long ones past the original length (the model is loaded for
    /// [`ModelConfig::default_context`]). Other scalings do not depend on it.
    pub fn fit_context(&mut self, max_model_len: usize) {
        if matches!(self.cfg.rope_scaling, RopeScaling::LongRope { .. }) {
            self.rope = self.cfg.rope(None, max_model_len);
        }
    }

    /// The rotary embedding the layers apply (the full-attention layers, where the
    /// sliding ones have their own: [`Self::rope_of`]).
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// Gemma 3's sliding layers' rotary embedding, if the model has one.
    pub fn local_rope(&self) -> Option<&Rope> {
        self.local_rope.as_deref()
    }

    /// The rotary embedding of layer `index`.
    pub fn rope_of(&self, index: usize) -> &Rope {
        match &self.local_rope {
            Some(local) if self.cfg.local_rope_at(index) => local,
            _ => &self.rope,
        }
    }
}

impl LlamaModel {
    /// The LM head's logits of the `n` rows of `x`, as rows of the whole vocabulary, on rank
    /// 0 (the leader, which samples): each rank computes its part of the vocabulary and the
    /// parts are gathered there (padded to equal lengths when the vocabulary does not
    /// divide). The other ranks get no logits: they would only throw them away.
    ///
    /// The head never takes activations rounded to one int8 term, even where the layers do
    /// (`--cpu-activations int8`): its logits are what a request samples from, and rounding
    /// its input flips near ties. The default model's first word after "What is the capital
    /// of France?" is one (0.08 apart): rounded, it turns from "The" to "L'" and the answer
    /// wanders off, as llama.cpp's does on the same file. One-token steps take exact
    /// activations (measured no slower on this CPU); batched ones two int8 terms where that
    /// kernel runs (within 1/64516 of each block's largest activation, and several times
    /// faster than f32 for the 8-sequence decode steps of the default model's 49k-row head).
    fn lm_head_logits(&self, x: &[f32], n: usize, comm: &mut dyn Collective) -> Result<Vec<f32>> {
        let vocab = self.cfg.vocab_size;
        let mine = self.lm_head.rows;
        let mut local = vec![0f32; n * mine];
        if n > 0 {
            let fine = self.matmul.fine();
            fine.one(x, n, self.lm_head.view(), &mut local);
        }
        // `n` is the same on every rank (one plan), so all skip the gather together.
        if self.tp.is_solo() || n == 0 {
            return Ok(local);
        }
        let each = vocab.div_ceil(self.tp.world);
        let mut padded = vec![0f32; n * each];
        for (dst, src) in padded.chunks_exact_mut(each).zip(local.chunks_exact(mine)) {
            dst[..mine].copy_from_slice(src);
        }
        Ok(crate::tp::gather_logits(self.tp, vocab, &padded, n, comm)?.unwrap_or_default())
    }
}

/// GGUF's name of the norm before the MLP: llama.cpp's converter names gpt-oss's (transformers'
/// `post_attention_layernorm`, as Llama's) `post_attention_norm`.
fn ffn_norm_gguf(c: &ModelConfig) -> &'static str {
    match c.architecture {
        crate::config::Architecture::GptOss => "post_attention_norm.weight",
        _ => "ffn_norm.weight",
    }
}

/// `w + cfg.norm_weight_offset`: Gemma's `x * (1 + w)` RMSNorm as a plain `x * w'` one.
fn offset_norm(mut w: Vec<f32>, cfg: &ModelConfig) -> Vec<f32> {
    if cfg.norm_weight_offset != 0.0 {
        for v in &mut w {
            *v += cfg.norm_weight_offset;
        }
    }
    w
}
