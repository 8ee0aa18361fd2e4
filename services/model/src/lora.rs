//! LoRA adapters, as PEFT saves them: a directory with `adapter_config.json` and
//! `adapter_model.safetensors`, holding for some projections `W` (`[out, in]`) two factors
//! `A` (`[r, in]`) and `B` (`[out, r]`). A request served with an adapter computes
//! `W x + s · B (A x)` for each of them, `s` being `lora_alpha / r` (`/ √r` with rsLoRA).
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

use ferrite_formats::{Matrix, TensorMap};
use ferrite_kernels::cpu::matmul::{MatmulOptions, WeightView};
use ferrite_kernels::cpu::{add_in_place, dot_f32};
use ferrite_kernels::quant::GgmlType;
use serde_json::Value;

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::step::SeqChunk;
use crate::tp::TpRank;

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

/// Every row of `m` as f32, each times `scale`.
fn f32_rows(m: &Matrix, scale: f32) -> Vec<f32> {
    let mut out = vec![0f32; m.rows * m.cols];
    for (i, row) in out.chunks_exact_mut(m.cols.max(1)).enumerate() {
        m.dequantize_row(i, row);
        row.iter_mut().for_each(|v| *v *= scale);
    }
    out
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

/// What of `adapter_config.json` the forward depends on, checked.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Scaling {
    r: usize,
    scale: f32,
}

fn bad(dir: &Path, why: String) -> ModelError {
    ModelError::BadConfig(format!("LoRA adapter {}: {why}", dir.display()))
}

/// The scale of the adapter whose config is `cfg`, refusing what ferrite does not apply.
fn scaling(dir: &Path, cfg: &Value) -> Result<Scaling> {
    let refuse = |why: &str| Err(bad(dir, format!("{why}, which ferrite does not apply")));
    let set = |key: &str| match cfg.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Object(m)) => !m.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => s != "none",
        Some(_) => true,
    };
    if cfg
        .get("peft_type")
        .and_then(Value::as_str)
        .unwrap_or("LORA")
        != "LORA"
    {
        return refuse("it is not a LoRA adapter (peft_type)");
    }
    for (key, what) in [
        ("use_dora", "it is a DoRA adapter (use_dora)"),
        ("bias", "it trains biases (bias)"),
        ("lora_bias", "it trains biases (lora_bias)"),
        (
            "modules_to_save",
            "it replaces whole modules (modules_to_save)",
        ),
        ("rank_pattern", "it sets ranks per module (rank_pattern)"),
        ("alpha_pattern", "it sets alphas per module (alpha_pattern)"),
        (
            "fan_in_fan_out",
            "its factors are stored transposed (fan_in_fan_out)",
        ),
        (
            "target_parameters",
            "it adapts parameters, not modules (target_parameters)",
        ),
    ] {
        if set(key) {
            return refuse(what);
        }
    }
    let number = |key: &str| {
        cfg.get(key)
            .and_then(Value::as_f64)
            .filter(|v| *v > 0.0)
            .ok_or_else(|| bad(dir, format!("adapter_config.json has no positive `{key}`")))
    };
    let (r, alpha) = (number("r")?, number("lora_alpha")?);
    let rs = cfg.get("use_rslora").and_then(Value::as_bool) == Some(true);
    let scale = if rs { alpha / r.sqrt() } else { alpha / r };
    Ok(Scaling {
        r: r as usize,
        scale: scale as f32,
    })
}

/// `(layer, projection, is A)` of a PEFT tensor name, if it is a projection's factor.
fn parse_name(name: &str) -> Option<(usize, Proj, bool)> {
    let rest = name.strip_prefix("base_model.model.model.layers.")?;
    let (layer, rest) = rest.split_once('.')?;
    let (module, factor) = rest.rsplit_once(".lora_")?;
    let is_a = match factor {
        "A.weight" => true,
        "B.weight" => false,
        _ => return None,
    };
    let proj = Proj::ALL.into_iter().find(|p| p.module() == module)?;
    Some((layer.parse().ok()?, proj, is_a))
}

impl LoraAdapter {
    /// The adapter saved in `dir`, called `name`, for `tp`'s shard of a model of shape `c` (the
    /// whole model's).
    pub fn load(name: &str, dir: &Path, c: &ModelConfig, tp: TpRank) -> Result<Self> {
        let cfg_path = dir.join("adapter_config.json");
        let raw = std::fs::read(&cfg_path)
            .map_err(|e| bad(dir, format!("cannot read adapter_config.json: {e}")))?;
        let cfg: Value = serde_json::from_slice(&raw)
            .map_err(|e| bad(dir, format!("adapter_config.json: {e}")))?;
        let scaling = scaling(dir, &cfg)?;
        let t = ferrite_formats::safetensors::open_file(&dir.join("adapter_model.safetensors"))?;
        let mut layers = vec![<[Option<Factors>; 7]>::default(); c.num_layers];
        let mut names: Vec<&str> = t.names().collect();
        names.sort();
        for n in names {
            let Some((layer, proj, true)) = parse_name(n) else {
                if parse_name(n).is_none() {
                    return Err(bad(
                        dir,
                        format!(
                            "tensor `{n}`: ferrite applies adapters to the q, k, v, o, gate, up \
                             and down projections of the decoder layers only"
                        ),
                    ));
                }
                continue;
            };
            if layer >= c.num_layers {
                return Err(bad(
                    dir,
                    format!("tensor `{n}`: the model has {} layers", c.num_layers),
                ));
            }
            if proj.in_mlp() && c.moe.as_ref().is_some_and(|m| m.sparse_layers[layer]) {
                return Err(bad(
                    dir,
                    format!("tensor `{n}`: layer {layer}'s MLP is a mixture of experts"),
                ));
            }
            let f = Factors::load(&t, n, proj, c, tp, scaling).map_err(|e| bad(dir, e))?;
            layers[layer][proj as usize] = Some(f);
        }
        if layers.iter().flatten().all(Option::is_none) {
            return Err(bad(dir, "it holds no factors".into()));
        }
        Ok(Self {
            name: name.to_owned(),
            layers,
        })
    }

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

impl Factors {
    /// The factors of `proj` whose A is tensor `a_name`, cut to `tp`'s shard.
    fn load(
        t: &TensorMap,
        a_name: &str,
        proj: Proj,
        c: &ModelConfig,
        tp: TpRank,
        s: Scaling,
    ) -> std::result::Result<Self, String> {
        let b_name = a_name.replace(".lora_A.", ".lora_B.");
        let (out, inp) = proj.shape(c);
        let read = |name: &str, rows, cols| {
            t.matrix(name)
                .and_then(|m| m.expect_shape(name, rows, cols))
                .map_err(|e| e.to_string())
        };
        let a = read(a_name, s.r, inp)?;
        let b = read(&b_name, out, s.r)?;
        let rows = tp.rows(c);
        let cut = |r: std::result::Result<Matrix, ferrite_formats::error::FormatError>| {
            r.map_err(|e| e.to_string())
        };
        let (a, b) = match proj {
            Proj::Q => (a, cut(b.slice_rows(&b_name, rows.q))?),
            Proj::K | Proj::V => (a, cut(b.slice_rows(&b_name, rows.kv))?),
            Proj::Gate | Proj::Up => (a, cut(b.slice_rows(&b_name, rows.ffn))?),
            Proj::O => (cut(a.slice_cols(a_name, rows.q))?, b),
            Proj::Down => (cut(a.slice_cols(a_name, rows.ffn))?, b),
        };
        Ok(Self {
            r: s.r,
            a: f32_rows(&a, 1.0),
            b: f32_rows(&b, s.scale),
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_of_peft_factors_parse_and_others_do_not() {
        let n = "base_model.model.model.layers.12.mlp.down_proj.lora_B.weight";
        assert_eq!(parse_name(n), Some((12, Proj::Down, false)));
        let n = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
        assert_eq!(parse_name(n), Some((0, Proj::Q, true)));
        for other in [
            "base_model.model.model.embed_tokens.lora_embedding_A",
            "base_model.model.lm_head.lora_A.weight",
            "base_model.model.model.layers.0.self_attn.qkv_proj.lora_A.weight",
            "base_model.model.model.layers.0.mlp.experts.0.w1.lora_A.weight",
        ] {
            assert_eq!(parse_name(other), None, "{other}");
        }
    }

    #[test]
    fn the_scale_is_alpha_over_r_or_its_root_and_the_unsupported_is_named() {
        let dir = Path::new("a");
        let s = scaling(dir, &json!({"r": 8, "lora_alpha": 16, "bias": "none"})).expect("accepted");
        assert_eq!(s, Scaling { r: 8, scale: 2.0 });
        let s =
            scaling(dir, &json!({"r": 4, "lora_alpha": 6, "use_rslora": true})).expect("accepted");
        assert_eq!(s, Scaling { r: 4, scale: 3.0 });
        let base = json!({"r": 4, "lora_alpha": 8, "modules_to_save": null, "rank_pattern": {}});
        assert!(scaling(dir, &base).is_ok());
        for (key, value, named) in [
            ("use_dora", json!(true), "DoRA"),
            ("bias", json!("lora_only"), "biases"),
            ("modules_to_save", json!(["lm_head"]), "modules_to_save"),
            ("rank_pattern", json!({"q_proj": 16}), "rank_pattern"),
            ("fan_in_fan_out", json!(true), "fan_in_fan_out"),
            ("peft_type", json!("IA3"), "not a LoRA"),
        ] {
            let mut cfg = base.clone();
            cfg[key] = value;
            let err = scaling(dir, &cfg).expect_err("refused").to_string();
            assert!(err.contains(named), "{key}: {err}");
        }
        let no_r = json!({"lora_alpha": 8});
        let err = scaling(dir, &no_r).expect_err("no r").to_string();
        assert!(err.contains("`r`"), "{err}");
    }
}
