//! One row of `bench kernels`' table (seed 004's columns), made by both of its modes: the
//! single-kernel rows (`bench_kernels`) and the whole-model ones (`bench_kernels_model`).

use ferrite_kernels::wq::WqFormat;

/// One measured row.
pub(crate) struct Row {
    pub stage: &'static str,
    pub mode: &'static str,
    pub a_dtype: &'static str,
    pub model: String,
    pub backend: &'static str,
    pub b_dtype: String,
    pub bs: usize,
    pub tokens: usize,
    pub group_size: i64,
    pub latency_ms: f64,
    pub gb_per_s: f64,
}

/// `ferrite` for a weight format, `ferrite-f16` for the baseline.
pub(crate) fn backend_of(format: &Option<WqFormat>) -> &'static str {
    if format.is_some() {
        "ferrite"
    } else {
        "ferrite-f16"
    }
}

/// The seed's name of a weight type: `float16`, `uint8`, `uint4b`, `uint2b`.
pub(crate) fn b_dtype_of(format: &Option<WqFormat>) -> String {
    match format {
        None => "float16".into(),
        Some(f) if f.bits.get() == 8 => "uint8".into(),
        Some(f) => format!("uint{}b", f.bits.get()),
    }
}
