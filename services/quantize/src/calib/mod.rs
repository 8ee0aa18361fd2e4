//! Calibrated quantization of a whole model, one decoder layer at a time.
//!
//! # Layout
//!
//! - this file: the methods and schemes, the calibration text, and the layer-by-layer driver
//!   [`quantize_layers`];
//! - `stats`: what is kept of each projection input (Hessian, per-channel max and mean, a
//!   sample of rows);
//! - `scales`: SmoothQuant's and AWQ's per-channel scales and how they fold into the layer.
//!
//! # How a layer is quantized
//!
//! The hidden states of every calibration sequence entering layer `i` are held in memory
//! (`tokens × hidden` f32: 9 MB for 4096 tokens of the default model). Then:
//!
//! 1. the layer runs over them with its stored weights, and a tap on each projection input
//!    ([`Site`]) gathers [`stats::SiteStats`];
//! 2. SmoothQuant or AWQ scales are computed from those and folded in (the norm before q/k/v
//!    and before gate/up divided by them, the projections' columns multiplied), the
//!    statistics divided to match;
//! 3. each projection is rounded: RTN, or GPTQ with its input's Hessian;
//! 4. the *quantized* layer runs over the same hidden states to give layer `i + 1`'s inputs,
//!    so each layer is calibrated on what the quantized layers before it produce (GPTQ's
//!    sequential mode).
//!
//! Only one layer's f32 weights exist at a time (the checkpoint stays memory-mapped), so a
//! model larger than memory can be quantized as long as its hidden states fit.

mod clip;
mod scales;
mod stats;

use std::time::Instant;

use ferrite_kernels::fp8::{Fp8Scales, quantize_fp8_rtn};
use ferrite_kernels::w8a8::quantize_int8_rtn;
use ferrite_kernels::wq::{WqFormat, quantize_rtn};

use ferrite_engine::kv_cache::KvCache;
use ferrite_engine::model::LlamaModel;
use ferrite_engine::model::llama::{Layer, LayerAt, LayerBuffers, Site};
use ferrite_engine::model::moe::{Mlp, moe_unsupported};
use ferrite_engine::{EngineError, Result};
use ferrite_formats::Matrix;
use ferrite_kernels::cpu::attention::QueryToken;
use stats::SiteStats;

use crate::gptq::{GptqOptions, output_error, output_error_of, quantize_gptq, quantize_int8_gptq};

/// How a layer's weights are chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// Round to nearest, no calibration.
    Rtn,
    /// GPTQ: error feedback through the inverse Hessian of the calibration inputs.
    Gptq,
    /// AWQ: per-channel scales searched on the calibration inputs, then RTN.
    Awq,
    /// SmoothQuant: activation outliers migrated into the weights, then RTN or GPTQ.
    SmoothQuant,
}

/// What a projection is stored as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// Weight-only codes in groups (GPTQ format), activations stay float.
    WeightOnly(WqFormat),
    /// int8 weights per channel, activations int8 per token at run time (compressed-tensors
    /// `int-quantized`).
    W8A8,
    /// FP8 e4m3 weights (round to nearest) with scales per channel or per block, activations
    /// FP8 per token or per group at run time ([`Fp8Scales::dynamic_activations`];
    /// compressed-tensors `float-quantized`).
    Fp8(Fp8Scales),
    /// Not quantized: the projections in f32 (a GGUF file exported as a Hugging Face
    /// directory, the baseline of speed and quality tables).
    F32,
}

impl std::fmt::Display for Scheme {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Scheme::WeightOnly(w) => write!(f, "{w}"),
            Scheme::W8A8 => f.write_str("w8a8-int8"),
            Scheme::Fp8(Fp8Scales::Block { rows, cols }) => write!(f, "fp8-e4m3-b{rows}x{cols}"),
            Scheme::Fp8(_) => f.write_str("fp8-e4m3"),
            Scheme::F32 => f.write_str("f32"),
        }
    }
}

/// How SmoothQuant's weights are rounded once its scales are folded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SmoothWeights {
    Rtn,
    Gptq,
    /// AWQ's scale search and clipping on the smoothed layer (seed 003's `smooth_awq`).
    Awq,
}

/// Everything [`quantize_layers`] needs besides the model and the tokens.
#[derive(Debug, Clone, Copy)]
pub struct CalibOptions {
    pub method: Method,
    pub scheme: Scheme,
    pub gptq: GptqOptions,
    /// How SmoothQuant's smoothed weights are rounded.
    pub smooth_weights: SmoothWeights,
    /// SmoothQuant's migration strength α: `s = max|x|^α / max|w|^(1-α)`.
    pub alpha: f32,
    /// Tokens per calibration sequence.
    pub ctx: usize,
    /// AWQ: scale exponents tried (`0, 1/n, …, (n-1)/n`).
    pub awq_grid: usize,
    /// AWQ: activation rows per site its search multiplies.
    pub awq_rows: usize,
}

impl CalibOptions {
    pub fn new(method: Method, scheme: Scheme) -> Self {
        Self {
            method,
            scheme,
            gptq: GptqOptions::default(),
            smooth_weights: SmoothWeights::Rtn,
            alpha: 0.8,
            ctx: 512,
            awq_grid: 20,
            awq_rows: 1024,
        }
    }

    /// Whether the weights are rounded by GPTQ (else to nearest).
    fn uses_gptq(&self) -> bool {
        self.method == Method::Gptq
            || (self.method == Method::SmoothQuant && self.smooth_weights == SmoothWeights::Gptq)
    }

    /// Whether calibration collects `H = Σ x xᵀ`: GPTQ's error feedback, AWQ's clipping.
    fn uses_hessian(&self) -> bool {
        self.uses_gptq() || self.uses_awq()
    }

    /// Whether AWQ's search and clipping run (alone, or after SmoothQuant's scales).
    fn uses_awq(&self) -> bool {
        self.method == Method::Awq
            || (self.method == Method::SmoothQuant && self.smooth_weights == SmoothWeights::Awq)
    }

    /// A name for reports: `gptq`, `awq`, `smoothquant+gptq`, ...
    pub fn method_name(&self) -> String {
        match self.method {
            Method::Rtn => "rtn".into(),
            Method::Gptq if self.gptq.act_order => "gptq-act-order".into(),
            Method::Gptq => "gptq".into(),
            Method::Awq => "awq".into(),
            Method::SmoothQuant => match self.smooth_weights {
                SmoothWeights::Rtn => "smoothquant+rtn".into(),
                SmoothWeights::Gptq => "smoothquant+gptq".into(),
                SmoothWeights::Awq => "smoothquant+awq".into(),
            },
        }
    }
}

/// Refuses the method and scheme pairs that make no sense.
pub(crate) fn check_options(opts: &CalibOptions) -> Result<()> {
    let refuse = |m: &str| Err(EngineError::InvalidRequest(m.into()));
    match (opts.scheme, opts.method) {
        (Scheme::F32, m) if m != Method::Rtn => {
            refuse("--scheme f32 writes the weights unquantized: use --method rtn")
        }
        (Scheme::W8A8 | Scheme::Fp8(_), _) if opts.uses_awq() => refuse(
            "AWQ searches weight-only grids; for W8A8 or FP8 use smoothquant with --weights rtn \
             or gptq (or rtn, gptq)",
        ),
        (Scheme::Fp8(_), Method::Gptq | Method::Awq) => refuse(
            "FP8 weights are rounded to nearest (as llm-compressor's FP8 schemes do): use \
             --method rtn or smoothquant",
        ),
        (Scheme::Fp8(_), Method::SmoothQuant) if opts.smooth_weights == SmoothWeights::Gptq => {
            refuse("FP8 weights are rounded to nearest: use smoothquant with --weights rtn")
        }
        _ => Ok(()),
    }
}

/// The calibration half and the held-out half of a text's tokens: calibration reads the
/// first, `bench perplexity --split held-out` scores the second, so no row is scored on
/// text it was calibrated on.
pub fn split_tokens(tokens: &[u32]) -> (&[u32], &[u32]) {
    tokens.split_at(tokens.len() / 2)
}

/// What one layer's quantization did (for the progress bar and the report).
#[derive(Debug, Clone)]
pub struct LayerReport {
    pub index: usize,
    pub layers: usize,
    pub seconds: f64,
    /// Σ over the layer's projections of GPTQ's output error `(w − q)ᵀ H (w − q)` (0 without
    /// GPTQ), and the same for round-to-nearest weights: GPTQ's gain on this layer.
    pub gptq_error: f64,
    pub rtn_error: f64,
}

/// The projections a site's input feeds, by index into [`projections`]'s order.
fn site_members(site: Site) -> &'static [usize] {
    match site {
        Site::Qkv => &[0, 1, 2],
        Site::O => &[3],
        Site::GateUp => &[4, 5],
        Site::Down => &[6],
    }
}

const SITES: [Site; 4] = [Site::Qkv, Site::O, Site::GateUp, Site::Down];

/// What the calibration refuses in place of a dense MLP.
const NOT_MOE: &str = "ferrite quantize";

fn projections(l: &Layer) -> Result<[&Matrix; 7]> {
    let f = l.mlp.dense().ok_or_else(|| moe_unsupported(NOT_MOE))?;
    Ok([&l.q, &l.k, &l.v, &l.o, &f.gate, &f.up, &f.down])
}

fn projections_mut(l: &mut Layer) -> Result<[&mut Matrix; 7]> {
    let Mlp::Dense(f) = &mut l.mlp else {
        return Err(moe_unsupported(NOT_MOE).into());
    };
    Ok([
        &mut l.q,
        &mut l.k,
        &mut l.v,
        &mut l.o,
        &mut f.gate,
        &mut f.up,
        &mut f.down,
    ])
}

/// A layer's projections as f32 `[rows, cols]` matrices, in [`projections`]'s order.
pub(crate) struct F32Weights {
    pub(crate) w: Vec<Vec<f32>>,
    pub(crate) shape: Vec<(usize, usize)>,
}

impl F32Weights {
    fn of(l: &Layer) -> Result<Self> {
        let ms = projections(l)?;
        Ok(Self {
            w: ms.iter().map(|m| m.to_f32()).collect(),
            shape: ms.iter().map(|m| (m.rows, m.cols)).collect(),
        })
    }
}

/// `w` (`[rows, cols]`) rounded to the nearest of `scheme`'s values, as a matrix.
fn rtn_matrix(scheme: Scheme, w: &[f32], rows: usize, cols: usize) -> Result<Matrix, String> {
    let e = |e: &dyn std::fmt::Display| e.to_string();
    Ok(match scheme {
        Scheme::WeightOnly(f) => {
            Matrix::from_wq(quantize_rtn(w, rows, cols, f).map_err(|x| e(&x))?)
        }
        Scheme::W8A8 => Matrix::from_i8(quantize_int8_rtn(w, rows, cols).map_err(|x| e(&x))?),
        Scheme::Fp8(layout) => Matrix::from_fp8(
            quantize_fp8_rtn(w, rows, cols, layout, layout.dynamic_activations())
                .map_err(|x| e(&x))?,
        ),
        Scheme::F32 => Matrix::from_f32(rows, cols, w),
    })
}

/// A mixture of experts' layers by round-to-nearest: every projection (each expert's, and a
/// shared expert's) rounded on its own; the routers stay as stored. Calibration would need
/// each expert's own inputs (the tokens routed to it), which is not built: other methods are
/// refused, naming `--method rtn`.
fn rtn_experts(
    model: &LlamaModel,
    opts: &CalibOptions,
    progress: &mut dyn FnMut(&LayerReport),
) -> Result<Vec<Layer>> {
    if opts.method != Method::Rtn {
        return Err(EngineError::InvalidRequest(format!(
            "--method {} calibrates a dense model's layers; a mixture of experts is quantized \
             with --method rtn",
            opts.method_name()
        )));
    }
    let mut out = Vec::with_capacity(model.layers().len());
    for (li, base) in model.layers().iter().enumerate() {
        let start = Instant::now();
        let mut layer = base.clone();
        for (name, m) in layer.projections_mut() {
            let (rows, cols) = (m.rows, m.cols);
            *m = rtn_matrix(opts.scheme, &m.to_f32(), rows, cols).map_err(|e| {
                EngineError::BadTensor {
                    name: format!("layer {li} {name}"),
                    reason: format!("cannot quantize to {}: {e}", opts.scheme),
                }
            })?;
        }
        out.push(layer);
        progress(&LayerReport {
            index: li,
            layers: model.layers().len(),
            seconds: start.elapsed().as_secs_f64(),
            gptq_error: 0.0,
            rtn_error: 0.0,
        });
    }
    Ok(out)
}

/// Quantizes every decoder layer of `model` (a whole model, not a shard) with `opts`,
/// calibrating on `tokens` (cut into sequences of `opts.ctx`); `progress` hears of each layer
/// as it is done. Returns the layers: quantized projections, norms with any folded scales.
pub(crate) fn quantize_layers(
    model: &LlamaModel,
    tokens: &[u32],
    opts: &CalibOptions,
    progress: &mut dyn FnMut(&LayerReport),
) -> Result<Vec<Layer>> {
    let c = model.config();
    if c.moe.is_some() {
        check_options(opts)?;
        return rtn_experts(model, opts, progress);
    }
    let calibrate = opts.method != Method::Rtn;
    let ctx = opts.ctx.clamp(4, c.max_position_embeddings);
    let seqs: Vec<&[u32]> = if calibrate {
        tokens.chunks_exact(ctx).collect()
    } else {
        Vec::new()
    };
    if calibrate && seqs.is_empty() {
        return Err(EngineError::InvalidRequest(format!(
            "{} calibration tokens are fewer than one sequence of {ctx}",
            tokens.len()
        )));
    }
    check_options(opts)?;
    if let Some(&bad) = tokens.iter().find(|&&t| t as usize >= c.vocab_size) {
        return Err(EngineError::InvalidRequest(format!(
            "calibration token {bad} is outside the vocabulary"
        )));
    }
    let h = c.hidden_size;
    // The hidden states entering the current layer, one Vec per sequence.
    let mut hidden: Vec<Vec<f32>> = seqs
        .iter()
        .map(|s| model.embed_tokens(s.iter().copied(), s.len()))
        .collect();
    let block = 16;
    let mut kv = KvCache::new(
        c.num_layers,
        ctx.div_ceil(block),
        block,
        c.num_kv_heads,
        c.head_dim,
    );
    let table: Vec<u32> = (0..ctx.div_ceil(block) as u32).collect();
    let positions: Vec<usize> = (0..ctx).collect();
    let query_tokens: Vec<QueryToken<'_>> = positions
        .iter()
        .map(|&pos| QueryToken {
            block_table: &table,
            pos,
        })
        .collect();
    let cols_of = |site: Site| match site {
        Site::Qkv | Site::GateUp => h,
        Site::O => c.q_dim(),
        Site::Down => c.intermediate_size,
    };
    let mut out = Vec::with_capacity(c.num_layers);
    for li in 0..c.num_layers {
        let start = Instant::now();
        let at = LayerAt {
            index: li,
            positions: &positions,
            query_tokens: &query_tokens,
            prompt: true,
            lora: &[],
        };
        let base = &model.layers()[li];
        let mut stats: Vec<SiteStats> = SITES
            .iter()
            .map(|&s| SiteStats::new(cols_of(s), opts.uses_hessian(), opts.awq_rows))
            .collect();
        for x in &hidden {
            let mut bufs = LayerBuffers::new(c, x.clone());
            let mut tap = |site: Site, xs: &[f32]| {
                if let Some(i) = SITES.iter().position(|&s| s == site) {
                    stats[i].add(xs);
                }
            };
            model.layer_forward(
                base,
                &at,
                &mut bufs,
                &mut kv,
                &mut ferrite_collective::Solo,
                &mut tap,
            )?;
        }
        let mut layer = base.clone();
        let mut wf = F32Weights::of(&layer)?;
        match opts.method {
            Method::SmoothQuant => scales::smooth(c, &mut layer, &mut wf, &mut stats, opts.alpha)?,
            Method::Awq | Method::Rtn | Method::Gptq => {}
        }
        if opts.uses_awq() {
            scales::awq(c, &mut layer, &mut wf, &mut stats, opts)?;
        }
        let (mut gptq_error, mut rtn_error) = (0.0, 0.0);
        for (si, &site) in SITES.iter().enumerate() {
            for &p in site_members(site) {
                let (rows, cols) = wf.shape[p];
                let name = format!(
                    "layer {li} {}",
                    ["q", "k", "v", "o", "gate", "up", "down"][p]
                );
                let bad = |e: String| EngineError::BadTensor {
                    name: name.clone(),
                    reason: format!("cannot quantize to {}: {e}", opts.scheme),
                };
                let hessian = stats[si].hessian.as_deref().filter(|_| opts.uses_gptq());
                let w = &wf.w[p];
                let m = match (opts.scheme, hessian) {
                    (scheme, None) | (scheme @ (Scheme::Fp8(_) | Scheme::F32), _) => {
                        rtn_matrix(scheme, w, rows, cols).map_err(bad)?
                    }
                    (Scheme::WeightOnly(f), Some(hm)) => {
                        let (q, st) = quantize_gptq(w, rows, cols, hm, f, opts.gptq)
                            .map_err(|e| bad(e.to_string()))?;
                        let rtn = quantize_rtn(w, rows, cols, f).map_err(|e| bad(e.to_string()))?;
                        gptq_error += st.output_error;
                        rtn_error += output_error(w, &rtn, hm);
                        Matrix::from_wq(q)
                    }
                    (Scheme::W8A8, Some(hm)) => {
                        let (q, st) = quantize_int8_gptq(w, rows, cols, hm, opts.gptq)
                            .map_err(|e| bad(e.to_string()))?;
                        let rtn =
                            quantize_int8_rtn(w, rows, cols).map_err(|e| bad(e.to_string()))?;
                        gptq_error += st.output_error;
                        rtn_error += output_error_of(w, &rtn.dequantize(), rows, cols, hm);
                        Matrix::from_i8(q)
                    }
                };
                *projections_mut(&mut layer)?[p] = m;
            }
        }
        if li + 1 < c.num_layers {
            for x in &mut hidden {
                let mut bufs = LayerBuffers::new(c, std::mem::take(x));
                model.layer_forward(
                    &layer,
                    &at,
                    &mut bufs,
                    &mut kv,
                    &mut ferrite_collective::Solo,
                    &mut |_, _| {},
                )?;
                *x = bufs.x;
            }
        }
        out.push(layer);
        progress(&LayerReport {
            index: li,
            layers: c.num_layers,
            seconds: start.elapsed().as_secs_f64(),
            gptq_error,
            rtn_error,
        });
    }
    Ok(out)
}
