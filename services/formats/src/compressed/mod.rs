//! compressed-tensors checkpoints (what llm-compressor writes and vLLM reads): the
//! `quantization_config` and its three forms ferrite runs.
//!
//! - `pack-quantized` ([`packed`]): weight-only integer codes (2, 3, 4 or 8 bits, symmetric or
//!   with zero points, in groups or one scale per channel) packed into i32 words, converted to a
//!   [`ferrite_kernels::wq::WqMatrix`];
//! - `int-quantized` ([`int8`]): W8A8, int8 weights per channel and int8 activations quantized
//!   per token at run time, an [`ferrite_kernels::w8a8::I8Matrix`];
//! - `float-quantized` ([`fp8`]): FP8 e4m3 weights (one scale per tensor, per channel, or per
//!   block as in llm-compressor's FP8_BLOCK) with FP8 activations (dynamic per token or per
//!   group of inputs, or a static per-tensor scale) or none, an
//!   [`ferrite_kernels::fp8::Fp8Matrix`]: on the CPU the weights are dequantized to f32 on first use
//!   and activations rounded through e4m3 (correct, not fast).
//!
//! Everything else is refused with the reason: other formats, act-order `g_idx`, static int8
//! activation scales, weight-only FP8 groups, 2:4 sparsity, transforms, a quantized KV cache,
//! and config groups with different schemes.

mod fp8;
mod int8;
mod packed;

use ferrite_kernels::fp8::Fp8Scales;
use ferrite_kernels::wq::{Bits, WqFormat};
use serde_json::{Value, json};

pub use fp8::Fp8Tensors;
pub(crate) use fp8::load_linear as load_fp8;
pub use packed::PackedTensors;

use super::{Matrix, TensorMap};
use crate::error::{FormatError, Result};

/// How FP8 activations are quantized.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fp8Act {
    /// Not quantized (FP8 weights, 16-bit activations).
    None,
    /// Per token at run time.
    DynamicPerToken,
    /// Per token and group of this many inputs at run time.
    DynamicPerGroup(usize),
    /// One static scale per layer (`<stem>.input_scale`).
    StaticPerTensor,
}

impl Fp8Act {
    /// The dynamic activations that go with weights scaled as `weights` says
    /// ([`Fp8Scales::dynamic_activations`]).
    pub fn dynamic(weights: Fp8Scales) -> Self {
        match weights.dynamic_activations() {
            ferrite_kernels::fp8::Fp8Activations::DynamicPerGroup(g) => Self::DynamicPerGroup(g),
            _ => Self::DynamicPerToken,
        }
    }
}

/// The one scheme all of a checkpoint's config groups share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompressedScheme {
    /// `int-quantized`: int8 weights per channel, int8 activations per token, dynamic.
    W8A8Int8,
    /// `pack-quantized`: integer codes packed into i32 words.
    Packed(IntCodes),
    /// `int-quantized` or `naive-quantized` other than W8A8's per-channel int8: one code per
    /// int8 (llm-compressor's W4A8 is written this way).
    Unpacked(IntCodes),
    /// `float-quantized`: FP8 e4m3 weights, scaled per tensor, channel or block.
    Fp8 { weights: Fp8Scales, act: Fp8Act },
}

/// Integer weight codes (run by the weight-only kernels) and what their inputs go through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IntCodes {
    pub bits: Bits,
    /// `None`: one scale per channel.
    pub group_size: Option<usize>,
    pub sym: bool,
    /// Inputs rounded to int8 per token at run time (W4A8), or left in float (W4A16).
    pub int8_activations: bool,
}

impl IntCodes {
    fn describe(&self) -> String {
        format!(
            "int{} {} {}{}",
            self.bits.get(),
            self.group_size
                .map_or("per channel".into(), |g| format!("groups of {g}")),
            if self.sym {
                "symmetric"
            } else {
                "with zero points"
            },
            if self.int8_activations {
                ", activations int8 per token"
            } else {
                ""
            }
        )
    }
}

/// A compressed-tensors `quantization_config` ferrite can run.
#[derive(Debug, Clone, PartialEq)]
pub struct CompressedConfig {
    pub scheme: CompressedScheme,
}

/// One `QuantizationArgs` (weights or activations) of a config group.
#[derive(Debug, PartialEq)]
struct Args {
    bits: u64,
    float: bool,
    sym: bool,
    /// `tensor`, `channel`, `group`, `token`, `block`, ...
    strategy: String,
    group_size: Option<i64>,
    /// `block_structure` (rows, columns) of the `block` strategy.
    block: Option<[usize; 2]>,
    dynamic: bool,
    /// Activation ordering with a `g_idx` (`group`; `static`/`weight` leave none).
    g_idx: bool,
}

impl Args {
    fn parse(v: &Value) -> std::result::Result<Self, String> {
        let group_size = v.get("group_size").and_then(Value::as_i64);
        // compressed-tensors infers a missing strategy from the group size.
        let strategy = match v.get("strategy").and_then(Value::as_str) {
            Some(s) => s.to_ascii_lowercase(),
            None => match group_size {
                None => "tensor".into(),
                Some(-1) => "channel".into(),
                Some(_) => "group".into(),
            },
        };
        let ty = v.get("type").and_then(Value::as_str).unwrap_or("int");
        if ty != "int" && ty != "float" {
            return Err(format!("type `{ty}`"));
        }
        let g_idx = match v.get("actorder") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => matches!(s.as_str(), "group" | "dynamic"),
            Some(other) => return Err(format!("actorder {other}")),
        };
        Ok(Self {
            bits: v.get("num_bits").and_then(Value::as_u64).unwrap_or(8),
            float: ty == "float",
            sym: v.get("symmetric").and_then(Value::as_bool).unwrap_or(true),
            strategy,
            group_size,
            block: block_structure(v.get("block_structure")),
            // `true`, or a string (`local`) for the dynamic kinds ferrite does not run.
            dynamic: !matches!(v.get("dynamic"), None | Some(Value::Bool(false))),
            g_idx,
        })
    }

    fn is(&self, float: bool, bits: u64, strategy: &str, dynamic: bool) -> bool {
        self.float == float
            && self.bits == bits
            && self.sym
            && self.strategy == strategy
            && self.dynamic == dynamic
    }
}

/// `block_structure`: `[rows, cols]`, or the `"RxC"` string older versions wrote.
fn block_structure(v: Option<&Value>) -> Option<[usize; 2]> {
    let dims: Vec<usize> = match v? {
        Value::Array(a) => a
            .iter()
            .filter_map(Value::as_u64)
            .map(|d| d as usize)
            .collect(),
        Value::String(s) => s.split('x').filter_map(|d| d.trim().parse().ok()).collect(),
        _ => return None,
    };
    match dims[..] {
        [r, c] => Some([r, c]),
        _ => None,
    }
}

/// The scheme of one config group in `format`, or why ferrite cannot run it.
fn group_scheme(format: &str, g: &Value) -> std::result::Result<CompressedScheme, String> {
    let w = Args::parse(&g["weights"])?;
    let acts = match &g["input_activations"] {
        Value::Null => None,
        a => Some(Args::parse(a)?),
    };
    if !g["output_activations"].is_null() {
        return Err("output activation quantization is not supported".into());
    }
    if w.g_idx {
        return Err(
            "act-order (actorder `group`, a g_idx per layer) is not supported: its \
                    groups are not contiguous"
                .into(),
        );
    }
    match format {
        "pack-quantized" => int_codes(&w, acts.as_ref()).map(CompressedScheme::Packed),
        // naive-quantized stores codes in the smallest torch type that holds them: int8
        // codes as int-quantized does, FP8 as float-quantized does.
        "naive-quantized" if w.float => fp8_scheme(&w, acts.as_ref()),
        "int-quantized" | "naive-quantized" => match acts {
            Some(a) if w.is(false, 8, "channel", false) && a.is(false, 8, "token", true) => {
                Ok(CompressedScheme::W8A8Int8)
            }
            _ => int_codes(&w, acts.as_ref()).map(CompressedScheme::Unpacked),
        },
        "float-quantized" => fp8_scheme(&w, acts.as_ref()),
        other => Err(format!(
            "format `{other}` is not supported (pack-quantized, int-quantized, \
             naive-quantized and float-quantized are)"
        )),
    }
}

/// Integer weights (2, 3, 4 or 8 bits, in groups or per channel) with int8 activations per
/// token or none.
fn int_codes(w: &Args, acts: Option<&Args>) -> std::result::Result<IntCodes, String> {
    let int8_activations = match acts {
        None => false,
        Some(a) if a.is(false, 8, "token", true) => true,
        Some(a) if !a.float && !a.dynamic => {
            return Err(
                "static int8 activation scales (input_scale) are not supported; \
                 ferrite quantizes activations per token at run time (quantize with dynamic \
                 per-token activations)"
                    .into(),
            );
        }
        Some(a) => {
            return Err(format!(
                "{}-bit {} activations by strategy `{}` with integer weights are not supported \
                 (int8 per token, dynamic, or none are)",
                a.bits,
                if a.float { "float" } else { "int" },
                a.strategy
            ));
        }
    };
    let bits = u32::try_from(w.bits)
        .ok()
        .and_then(|b| Bits::from_u32(b).ok())
        .filter(|_| !w.float)
        .ok_or_else(|| {
            format!(
                "{}-bit weights (2, 3, 4 or 8-bit integers are supported)",
                w.bits
            )
        })?;
    let group_size = match (w.strategy.as_str(), w.group_size) {
        ("group", Some(g)) if g > 0 => Some(g as usize),
        ("channel", _) => None,
        (s, g) => {
            return Err(format!(
                "weight strategy `{s}` (group size {g:?}): group or channel are supported"
            ));
        }
    };
    if w.dynamic {
        return Err("dynamic weight quantization is not supported".into());
    }
    Ok(IntCodes {
        bits,
        group_size,
        sym: w.sym,
        int8_activations,
    })
}

fn fp8_scheme(w: &Args, acts: Option<&Args>) -> std::result::Result<CompressedScheme, String> {
    let weights = match (w.strategy.as_str(), w.block) {
        ("channel", _) => Fp8Scales::Channel,
        ("tensor", _) => Fp8Scales::Tensor,
        ("block", Some([rows, cols])) if rows > 0 && cols > 0 => Fp8Scales::Block { rows, cols },
        ("block", b) => {
            return Err(format!(
                "FP8 block strategy with block_structure {b:?}: two sizes above 0 are needed"
            ));
        }
        (s, _) => {
            return Err(format!(
                "FP8 weight strategy `{s}` is not supported (tensor, channel or block are)"
            ));
        }
    };
    if !w.is(true, 8, &w.strategy, false) {
        return Err("float-quantized weights must be FP8 (8-bit float, symmetric, static)".into());
    }
    let act = match acts {
        None => Fp8Act::None,
        Some(a) if a.is(true, 8, "token", true) => Fp8Act::DynamicPerToken,
        Some(a) if a.is(true, 8, "tensor", false) => Fp8Act::StaticPerTensor,
        Some(a) if a.is(true, 8, "group", true) && a.group_size.is_some_and(|g| g > 0) => {
            Fp8Act::DynamicPerGroup(a.group_size.unwrap_or(1) as usize)
        }
        Some(a) => {
            return Err(format!(
                "FP8 activations by strategy `{}` (dynamic: {}) are not supported (dynamic per \
                 token or per group, or static per tensor, are)",
                a.strategy, a.dynamic
            ));
        }
    };
    Ok(CompressedScheme::Fp8 { weights, act })
}

/// The columns an FP8 layer's column shard must keep whole: its weight blocks' width and its
/// activation groups (the larger, when one divides the other; they always do in practice).
pub(crate) fn fp8_shard_cols(weights: Fp8Scales, act: Fp8Act) -> Option<usize> {
    let block = match weights {
        Fp8Scales::Block { cols, .. } => Some(cols),
        _ => None,
    };
    let group = match act {
        Fp8Act::DynamicPerGroup(g) => Some(g),
        _ => None,
    };
    block.max(group)
}

pub(crate) fn describe_fp8_scales(s: Fp8Scales) -> String {
    match s {
        Fp8Scales::Tensor => "per tensor".into(),
        Fp8Scales::Channel => "per channel".into(),
        Fp8Scales::Block { rows, cols } => format!("in blocks of {rows}x{cols}"),
    }
}

pub(crate) fn describe_fp8_act(act: Fp8Act) -> String {
    match act {
        Fp8Act::None => "not quantized".into(),
        Fp8Act::DynamicPerToken => "dynamic per token".into(),
        Fp8Act::DynamicPerGroup(g) => format!("dynamic per group of {g}"),
        Fp8Act::StaticPerTensor => "static per tensor".into(),
    }
}

/// Whether `v` (an optional config object) is absent, null or empty.
fn absent(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => true,
        Some(Value::Object(o)) => o.is_empty(),
        Some(_) => false,
    }
}

impl CompressedConfig {
    /// Reads a `quantization_config` whose `quant_method` is `compressed-tensors`.
    pub fn from_json(q: &Value) -> Result<Self> {
        let bad = |m: String| {
            FormatError::BadConfig(format!("quantization_config (compressed-tensors): {m}"))
        };
        let status = q.get("quantization_status").and_then(Value::as_str);
        if !matches!(status, None | Some("compressed")) {
            return Err(bad(format!(
                "quantization_status {status:?}: ferrite reads compressed checkpoints"
            )));
        }
        let sparsity = q.get("sparsity_config");
        let sparse_format = sparsity
            .and_then(|s| s.get("format"))
            .and_then(Value::as_str);
        if !absent(sparsity) && sparse_format != Some("dense") {
            return Err(bad(format!(
                "sparsity_config format {sparse_format:?}: sparse (2:4) weights are not \
                 supported"
            )));
        }
        if !absent(q.get("transform_config")) {
            return Err(bad("transforms (transform_config) are not supported".into()));
        }
        if !absent(q.get("kv_cache_scheme")) {
            return Err(bad(
                "a quantized KV cache (kv_cache_scheme) is not supported".into(),
            ));
        }
        let top_format = q.get("format").and_then(Value::as_str).unwrap_or("");
        let groups = q
            .get("config_groups")
            .and_then(Value::as_object)
            .filter(|g| !g.is_empty())
            .ok_or_else(|| bad("no config_groups".into()))?;
        let mut scheme = None;
        for (name, g) in groups {
            let format = g
                .get("format")
                .and_then(Value::as_str)
                .unwrap_or(top_format);
            let s = group_scheme(format, g).map_err(|m| bad(format!("group `{name}`: {m}")))?;
            if scheme.is_some_and(|first| first != s) {
                return Err(bad(
                    "config groups with different schemes are not supported".into(),
                ));
            }
            scheme = Some(s);
        }
        scheme
            .map(|scheme| Self { scheme })
            .ok_or_else(|| bad("no config_groups".into()))
    }

    /// The group length (what a column shard must keep whole): of weight-only groups, or of
    /// FP8 blocks and activation groups.
    pub fn group_size(&self) -> Option<usize> {
        match self.scheme {
            CompressedScheme::Packed(c) | CompressedScheme::Unpacked(c) => c.group_size,
            CompressedScheme::Fp8 { weights, act } => fp8_shard_cols(weights, act),
            CompressedScheme::W8A8Int8 => None,
        }
    }

    /// The row run a row shard must keep whole (FP8 blocks' height).
    pub fn row_block(&self) -> Option<usize> {
        match self.scheme {
            CompressedScheme::Fp8 {
                weights: Fp8Scales::Block { rows, .. },
                ..
            } => Some(rows),
            _ => None,
        }
    }

    /// Whether the CPU runs this scheme by dequantizing (FP8).
    pub fn dequantizes_on_cpu(&self) -> bool {
        matches!(self.scheme, CompressedScheme::Fp8 { .. })
    }

    /// A one-line description for logs.
    pub fn describe(&self) -> String {
        match self.scheme {
            CompressedScheme::W8A8Int8 => "compressed-tensors int-quantized W8A8".into(),
            CompressedScheme::Packed(c) => {
                format!("compressed-tensors pack-quantized {}", c.describe())
            }
            CompressedScheme::Unpacked(c) => {
                format!("compressed-tensors int-quantized {}", c.describe())
            }
            CompressedScheme::Fp8 { weights, act } => format!(
                "compressed-tensors float-quantized FP8 (weights {}, activations {})",
                describe_fp8_scales(weights),
                describe_fp8_act(act)
            ),
        }
    }

    /// Converts layer `<stem>` to the matrix ferrite computes with.
    pub(super) fn load_linear(&self, t: &TensorMap, stem: &str) -> Result<Matrix> {
        match self.scheme {
            CompressedScheme::W8A8Int8 => int8::load_linear(t, stem).map(Matrix::from_i8),
            CompressedScheme::Packed(c) => {
                packed::load_linear(t, stem, c.bits, c.group_size, c.sym)
                    .map(|m| Matrix::from_wq(m.with_int8_activations(c.int8_activations)))
            }
            CompressedScheme::Unpacked(c) => int8::load_codes(t, stem, c)
                .map(|m| Matrix::from_wq(m.with_int8_activations(c.int8_activations))),
            CompressedScheme::Fp8 { weights, act } => {
                fp8::load_linear(t, stem, "weight_scale", weights, act).map(Matrix::from_fp8)
            }
        }
    }

    /// The config for weight-only `format` written as `pack-quantized`.
    pub fn packed(format: WqFormat) -> Self {
        Self {
            scheme: CompressedScheme::Packed(IntCodes {
                bits: format.bits,
                group_size: format.group_size,
                sym: !format.zero_point,
                int8_activations: false,
            }),
        }
    }

    /// The `quantization_config` ferrite writes (the shape llm-compressor's presets take).
    pub fn to_json(&self) -> Value {
        let args = |bits: u32, ty: &str, sym: bool, strategy: &str, group: Option<usize>| {
            json!({
                "num_bits": bits, "type": ty, "symmetric": sym, "strategy": strategy,
                "dynamic": strategy == "token", "group_size": group, "block_structure": null,
                "actorder": null,
                "observer": if strategy == "token" { Value::Null } else { "minmax".into() },
                "observer_kwargs": {}
            })
        };
        let (format, weights, acts) = match self.scheme {
            CompressedScheme::W8A8Int8 => (
                "int-quantized",
                args(8, "int", true, "channel", None),
                args(8, "int", true, "token", None),
            ),
            CompressedScheme::Packed(c) | CompressedScheme::Unpacked(c) => (
                if matches!(self.scheme, CompressedScheme::Packed(_)) {
                    "pack-quantized"
                } else {
                    "int-quantized"
                },
                args(
                    c.bits.get(),
                    "int",
                    c.sym,
                    if c.group_size.is_some() {
                        "group"
                    } else {
                        "channel"
                    },
                    c.group_size,
                ),
                if c.int8_activations {
                    args(8, "int", true, "token", None)
                } else {
                    Value::Null
                },
            ),
            CompressedScheme::Fp8 { weights, act } => {
                let mut w = match weights {
                    Fp8Scales::Tensor => args(8, "float", true, "tensor", None),
                    Fp8Scales::Channel => args(8, "float", true, "channel", None),
                    Fp8Scales::Block { .. } => args(8, "float", true, "block", None),
                };
                if let Fp8Scales::Block { rows, cols } = weights {
                    w["block_structure"] = json!([rows, cols]);
                }
                let a = match act {
                    Fp8Act::None => Value::Null,
                    Fp8Act::DynamicPerToken => args(8, "float", true, "token", None),
                    Fp8Act::StaticPerTensor => args(8, "float", true, "tensor", None),
                    Fp8Act::DynamicPerGroup(g) => {
                        let mut a = args(8, "float", true, "group", Some(g));
                        a["dynamic"] = true.into();
                        a["observer"] = Value::Null;
                        a
                    }
                };
                ("float-quantized", w, a)
            }
        };
        json!({
            "quant_method": "compressed-tensors",
            "format": format,
            "quantization_status": "compressed",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": weights,
                    "input_activations": acts,
                    "output_activations": null
                }
            },
            "ignore": ["lm_head"],
            "kv_cache_scheme": null,
            "sparsity_config": {},
            "global_compression_ratio": null
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(format: &str, weights: Value, acts: Value) -> Value {
        json!({"quant_method": "compressed-tensors", "format": format,
               "config_groups": {"g": {"targets": ["Linear"], "weights": weights,
                                       "input_activations": acts}}})
    }

    #[test]
    fn what_ferrite_writes_it_reads() {
        for scheme in [
            CompressedScheme::W8A8Int8,
            CompressedScheme::Packed(IntCodes {
                bits: Bits::B4,
                group_size: Some(32),
                sym: false,
                int8_activations: false,
            }),
            CompressedScheme::Packed(IntCodes {
                bits: Bits::B8,
                group_size: None,
                sym: true,
                int8_activations: false,
            }),
            CompressedScheme::Unpacked(IntCodes {
                bits: Bits::B4,
                group_size: Some(128),
                sym: true,
                int8_activations: true,
            }),
            CompressedScheme::Fp8 {
                weights: Fp8Scales::Channel,
                act: Fp8Act::DynamicPerToken,
            },
            CompressedScheme::Fp8 {
                weights: Fp8Scales::Block {
                    rows: 128,
                    cols: 128,
                },
                act: Fp8Act::DynamicPerGroup(128),
            },
        ] {
            let c = CompressedConfig { scheme };
            assert_eq!(CompressedConfig::from_json(&c.to_json()).expect("reads"), c);
        }
    }

    #[test]
    fn unsupported_forms_are_refused_with_the_reason() {
        let int4 = json!({"num_bits": 4, "type": "int", "symmetric": true, "strategy": "group",
                          "group_size": 128});
        let cases = [
            (
                config(
                    "pack-quantized",
                    json!({"num_bits": 4, "strategy": "group", "group_size": 128,
                           "actorder": "group"}),
                    Value::Null,
                ),
                "act-order",
            ),
            (
                config(
                    "int-quantized",
                    json!({"num_bits": 8, "strategy": "channel"}),
                    json!({"num_bits": 8, "strategy": "tensor", "dynamic": false}),
                ),
                "static int8 activation",
            ),
            (
                config(
                    "float-quantized",
                    json!({"num_bits": 8, "type": "float", "strategy": "group",
                           "group_size": 128}),
                    Value::Null,
                ),
                "strategy `group`",
            ),
            (
                config(
                    "float-quantized",
                    json!({"num_bits": 8, "type": "float", "strategy": "block"}),
                    Value::Null,
                ),
                "block_structure None",
            ),
            (
                config("marlin-24", int4.clone(), Value::Null),
                "format `marlin-24`",
            ),
            (
                config(
                    "pack-quantized",
                    int4.clone(),
                    json!({"num_bits": 4, "strategy": "token", "dynamic": true}),
                ),
                "4-bit int activations by strategy `token`",
            ),
        ];
        for (cfg, want) in cases {
            let e = CompressedConfig::from_json(&cfg).expect_err(want);
            assert!(e.to_string().contains(want), "{e}");
        }
        let mut sparse = config("pack-quantized", int4, Value::Null);
        sparse["sparsity_config"] = json!({"format": "sparse-24-bitmask"});
        let e = CompressedConfig::from_json(&sparse).expect_err("2:4");
        assert!(e.to_string().contains("2:4"), "{e}");
    }
}
