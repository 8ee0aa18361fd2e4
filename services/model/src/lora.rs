//! LoRA adapters: for some projections `W` (`[out, in]`), two factors `A` (`[r, in]`) and `B`
//! (`[out, r]`). A request served with an adapter computes `W x + s · B (A x)` for each of
//! them. Read from a directory PEFT saved (`adapter_config.json`, `adapter_model.safetensors`;
//! `s = lora_alpha / r`, `/ √r` with rsLoRA) or from llama.cpp's GGUF adapter files
//! (`s = adapter.lora.alpha / r`, as llama.cpp applies them): `lora_load.rs`.
//!
//! Adapters are applied beside the base weights, never merged into them: one model serves the
//! base and any number of adapters in one batch, each row of a step's activations with its own
//! (or none), as vLLM's and LoRAX's multi-LoRA serving does. A step costs two thin products per
//! adapted projection for each adapter present in it.
//!
//! Tensor parallelism cuts the factors as it cuts `W` ([`crate::tp`]): for the column-parallel
//! projections (Q, K, V, gate, up) each rank holds `B`'s rows of its shard and all of `A`; for
//! the row-parallel ones (O, down) `A`'s columns of its shard and all of `B`, whose products
//! are partial sums that the layer's all-reduce adds up with the base's.
//!
//! What PEFT can save that is refused, by name: DoRA, trained biases, `modules_to_save`,
//! per-module ranks or alphas, `fan_in_fan_out`, and factors of any other module (embeddings,
//! the LM head, Phi-3's fused projections, a mixture's experts).

use std::ops::Range;
use std::path::Path;

use ferrite_kernels::cpu::matmul::{MatmulOptions, WeightView};
use ferrite_kernels::cpu::{add_in_place, dot_f32};
use ferrite_kernels::quant::GgmlType;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::step::SeqChunk;
use crate::tp::TpRank;

#[path = "lora_load.rs"]
mod load;

/// A projection an adapter may change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proj {
    Q,
    K,
    V,
    O,
    Gate,
    Up,
    Down,
}

impl Proj {
    const ALL: [Proj; 7] = [
        Proj::Q,
        Proj::K,
        Proj::V,
        Proj::O,
        Proj::Gate,
        Proj::Up,
        Proj::Down,
    ];

    /// The module's name in a PEFT checkpoint, after `layers.{i}.`.
    fn module(self) -> &'static str {
        match self {
            Proj::Q => "self_attn.q_proj",
            Proj::K => "self_attn.k_proj",
            Proj::V => "self_attn.v_proj",
            Proj::O => "self_attn.o_proj",
            Proj::Gate => "mlp.gate_proj",
            Proj::Up => "mlp.up_proj",
            Proj::Down => "mlp.down_proj",
        }
    }

    /// The projection's name in llama.cpp's files, before `.weight`.
    fn gguf(self) -> &'static str {
        match self {
            Proj::Q => "attn_q",
            Proj::K => "attn_k",
            Proj::V => "attn_v",
            Proj::O => "attn_output",
            Proj::Gate => "ffn_gate",
            Proj::Up => "ffn_up",
            Proj::Down => "ffn_down",
        }
    }

    /// `[out, in]` of the whole model's projection.
    fn shape(self, c: &ModelConfig) -> (usize, usize) {
        let (h, f) = (c.hidden_size, c.intermediate_size);
        match self {
            Proj::Q => (c.q_dim(), h),
            Proj::K | Proj::V => (c.kv_dim(), h),
            Proj::O => (h, c.q_dim()),
            Proj::Gate | Proj::Up => (f, h),
            Proj::Down => (h, f),
        }
    }

    fn in_mlp(self) -> bool {
        matches!(self, Proj::Gate | Proj::Up | Proj::Down)
    }
}

/// One projection's factors, as this rank computes them, in f32: `a` `[r, in]`, `b`
/// `[out, r]` with the adapter's scale folded in.
#[derive(Debug, Clone)]
struct Factors {
    r: usize,
    a: Vec<f32>,
    b: Vec<f32>,
}

/// Rows up to which an adapter's products run as plain dot products on the calling thread;
/// more go through the matmul kernels. Measured on the default model with a rank-16 adapter
/// on every projection (docs/performance.md): the kernels' setup costs a step ~1 ms more at
/// one row, their SIMD rows ~0.4 ms less per row after it.
const DOT_ROWS: usize = 3;

impl Factors {
    /// Adds `B (A x)` to each of the `n` rows of `out` for the same row of `x`.
    fn add(&self, (x, n): (&[f32], usize), out: &mut [f32], mm: MatmulOptions) {
        if n <= DOT_ROWS {
            return self.add_rows(x, out);
        }
        let mut ax = vec![0f32; n * self.r];
        mm.one(x, n, f32_weight(&self.a, self.r), &mut ax);
        let mut delta = vec![0f32; out.len()];
        mm.one(
            &ax,
            n,
            f32_weight(&self.b, self.b.len() / self.r),
            &mut delta,
        );
        add_in_place(out, &delta);
    }

    /// [`Self::add`] by dot products, row after row.
    fn add_rows(&self, x: &[f32], out: &mut [f32]) {
        let (w_in, w_out) = (self.a.len() / self.r, self.b.len() / self.r);
        let mut ax = vec![0f32; self.r];
        for (x, out) in x.chunks_exact(w_in).zip(out.chunks_exact_mut(w_out)) {
            for (t, a) in ax.iter_mut().zip(self.a.chunks_exact(w_in)) {
                *t = dot_f32(a, x);
            }
            for (o, b) in out.iter_mut().zip(self.b.chunks_exact(self.r)) {
                *o += dot_f32(b, &ax);
            }
        }
    }
}

/// Row-major f32 `w` of `rows` rows as the matmul kernels take a weight.
fn f32_weight(w: &[f32], rows: usize) -> WeightView<'_> {
    WeightView {
        ty: GgmlType::F32,
        rows,
        cols: w.len() / rows.max(1),
        bytes: bytemuck::cast_slice(w),
    }
}

/// A loaded adapter (this rank's shard of it).
#[derive(Debug, Clone)]
pub struct LoraAdapter {
    name: String,
    /// By layer, by [`Proj`] (in `Proj::ALL`'s order).
    layers: Vec<[Option<Factors>; 7]>,
}

/// Rows of a step's activations (its tokens, in order) that run with adapter `adapter` (an
/// index into the model's list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraRows {
    pub rows: Range<usize>,
    pub adapter: usize,
}

impl LoraAdapter {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Adds this adapter's change of projection `proj` of layer `layer` to `out` (`n` rows of
    /// the projection's output), for the `n` rows of its input `x`.
    pub fn add(
        &self,
        (layer, proj): (usize, Proj),
        x: (&[f32], usize),
        out: &mut [f32],
        mm: MatmulOptions,
    ) {
        if let Some(f) = self
            .layers
            .get(layer)
            .and_then(|l| l[proj as usize].as_ref())
        {
            f.add(x, out, mm);
        }
    }
}

/// A model's adapters, and the whole model's shape their factors are cut from.
#[derive(Debug, Clone)]
pub struct LoraSet {
    whole: ModelConfig,
    adapters: Vec<LoraAdapter>,
}

impl LoraSet {
    /// No adapters yet, for a model of shape `whole` (the whole model's, not a shard's).
    pub fn new(whole: ModelConfig) -> Self {
        Self {
            whole,
            adapters: Vec::new(),
        }
    }

    /// Loads the adapter saved in `dir` (`tp`'s shard of it) under `name`.
    pub fn load(&mut self, name: &str, dir: &Path, tp: TpRank) -> Result<()> {
        if self.adapters.iter().any(|a| a.name() == name) {
            return Err(ModelError::BadConfig(format!(
                "two LoRA adapters are named `{name}`"
            )));
        }
        let adapter = LoraAdapter::load(name, dir, &self.whole, tp)?;
        self.adapters.push(adapter);
        Ok(())
    }

    /// The adapters' names, in the order requests number them.
    pub fn names(&self) -> Vec<String> {
        self.adapters.iter().map(|a| a.name().to_owned()).collect()
    }

    /// The runs of `seqs`' tokens (in the order a forward lays them out) that run with an
    /// adapter, refusing a number with no adapter behind it.
    pub fn runs(&self, seqs: &[SeqChunk<'_>]) -> Result<Vec<LoraRows>> {
        let mut runs: Vec<LoraRows> = Vec::new();
        let mut t0 = 0;
        for seq in seqs {
            let rows = t0..t0 + seq.tokens.len();
            t0 = rows.end;
            let Some(i) = seq.lora else {
                continue;
            };
            let adapter = i as usize;
            if adapter >= self.adapters.len() {
                return Err(ModelError::Internal(format!(
                    "LoRA adapter {adapter} asked for, {} loaded",
                    self.adapters.len()
                )));
            }
            match runs.last_mut() {
                Some(last) if last.adapter == adapter && last.rows.end == rows.start => {
                    last.rows.end = rows.end;
                }
                _ => runs.push(LoraRows { rows, adapter }),
            }
        }
        Ok(runs)
    }

    /// Adds, for each run of rows in `runs`, its adapter's change of `proj` of layer
    /// `layer`: `x` holds the `n` rows of the projection's input, `out` those of its output.
    pub fn add(
        &self,
        runs: &[LoraRows],
        at: (usize, Proj),
        (x, n): (&[f32], usize),
        out: &mut [f32],
        mm: MatmulOptions,
    ) {
        if n == 0 {
            return;
        }
        let (w_in, w_out) = (x.len() / n, out.len() / n);
        for run in runs {
            let Some(a) = self.adapters.get(run.adapter) else {
                continue;
            };
            let r = &run.rows;
            let x = &x[r.start * w_in..r.end * w_in];
            a.add(
                at,
                (x, r.len()),
                &mut out[r.start * w_out..r.end * w_out],
                mm,
            );
        }
    }
}
