//! RMSNorm and the element-wise ops around it (residual adds, biases, gated activations, soft
//! caps).

/// `out = x / sqrt(mean(x²) + eps) * weight`, row by row (`x` is `[rows, weight.len()]`).
///
/// # Panics
/// If `x.len()` is not a multiple of `weight.len()` or `out.len() != x.len()`.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    assert!(
        dim > 0 && x.len().is_multiple_of(dim) && out.len() == x.len(),
        "rms_norm: shape mismatch"
    );
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let sum_sq: f32 = xr.iter().map(|v| v * v).sum();
        let inv = 1.0 / (sum_sq / dim as f32 + eps).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * inv * w;
        }
    }
}

/// In-place [`rms_norm`] (Qwen3 normalizes each head of Q and K this way).
pub fn rms_norm_in_place(x: &mut [f32], weight: &[f32], eps: f32) {
    let dim = weight.len();
    assert!(
        dim > 0 && x.len().is_multiple_of(dim),
        "rms_norm_in_place: shape mismatch"
    );
    for xr in x.chunks_exact_mut(dim) {
        let sum_sq: f32 = xr.iter().map(|v| v * v).sum();
        let inv = 1.0 / (sum_sq / dim as f32 + eps).sqrt();
        for (v, &w) in xr.iter_mut().zip(weight) {
            *v = *v * inv * w;
        }
    }
}

/// `out = (x − mean) / sqrt(var + eps) · weight + bias`, row by row (`x` is
/// `[rows, weight.len()]`): LayerNorm, as BERT-family encoders normalize. The moments are taken
/// in f64 (PyTorch's CPU kernel sums in f32 by cascades; f64 is at least as close to exact) and
/// the variance is the biased one, as PyTorch's.
///
/// # Panics
/// If `x.len()` is not a multiple of `weight.len()`, or the other lengths differ.
pub fn layer_norm(x: &[f32], weight: &[f32], bias: &[f32], eps: f32, out: &mut [f32]) {
    let dim = weight.len();
    assert!(
        dim > 0 && bias.len() == dim && x.len().is_multiple_of(dim) && out.len() == x.len(),
        "layer_norm: shape mismatch"
    );
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        let mean = xr.iter().map(|&v| v as f64).sum::<f64>() / dim as f64;
        let var = xr.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / dim as f64;
        let inv = 1.0 / (var + eps as f64).sqrt();
        for (((o, &v), &w), &b) in or.iter_mut().zip(xr).zip(weight).zip(bias) {
            *o = ((v as f64 - mean) * inv) as f32 * w + b;
        }
    }
}

/// `x = gelu(x) = x/2 · (1 + erf(x/√2))`, the exact GELU (transformers' `gelu`, BERT's
/// activation), in parallel over chunks of `x`. erf is Abramowitz and Stegun's 7.1.26 in f32
/// (within 1.5e-7 of it, a few ulp of GELU's values: libm's f64 erf took a third of an
/// encoder's forward).
pub fn gelu_in_place(x: &mut [f32]) {
    use rayon::prelude::*;
    x.par_chunks_mut(4096)
        .for_each(|chunk| chunk.iter_mut().for_each(|v| *v = gelu(*v)));
}

#[inline]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// erf by Abramowitz and Stegun's 7.1.26: absolute error below 1.5e-7.
#[inline]
fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_7,
        -1.453_152_1,
        1.061_405_4,
    ];
    let z = x.abs();
    let t = 1.0 / (1.0 + P * z);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let y = 1.0 - poly * (-z * z).exp();
    y.copysign(x)
}

/// `x += y`.
pub fn add_in_place(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "add_in_place: length mismatch");
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

/// Adds `bias` to every row of `x` (`[rows, bias.len()]`).
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    assert!(
        !bias.is_empty() && x.len().is_multiple_of(bias.len()),
        "add_bias: shape mismatch"
    );
    for row in x.chunks_exact_mut(bias.len()) {
        add_in_place(row, bias);
    }
}

/// `gate = silu(gate) * up`, the SwiGLU activation (`silu(x) = x * sigmoid(x)`), 16 at a time
/// on AVX-512 (the same formula, with [`super::exp16`]'s `exp` within 2 ulp of libm's).
pub fn silu_mul_in_place(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: length mismatch");
    let silu = |g: &mut f32, u: f32| *g = *g / (1.0 + (-*g).exp()) * u;
    #[cfg(target_arch = "x86_64")]
    if crate::quant::Avx512::detect().is_some() {
        let whole = gate.len() - gate.len() % 16;
        // SAFETY: AVX-512F detected; `whole` elements of each slice, 16 at a time.
        #[allow(unsafe_code)]
        unsafe {
            x86::silu_mul16(&mut gate[..whole], &up[..whole])
        };
        gate[whole..]
            .iter_mut()
            .zip(&up[whole..])
            .for_each(|(g, &u)| silu(g, u));
        return;
    }
    gate.iter_mut().zip(up).for_each(|(g, &u)| silu(g, u));
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    use super::super::exp16::exp16;

    /// [`super::silu_mul_in_place`] over whole vectors of 16.
    ///
    /// # Safety
    /// AVX-512F available; the lengths are equal multiples of 16.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub(super) unsafe fn silu_mul16(gate: &mut [f32], up: &[f32]) {
        let one = _mm512_set1_ps(1.0);
        for (g, u) in gate.chunks_exact_mut(16).zip(up.chunks_exact(16)) {
            // SAFETY: 16 f32s in each chunk.
            unsafe {
                let x = _mm512_loadu_ps(g.as_ptr());
                let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
                let s = _mm512_div_ps(x, _mm512_add_ps(one, e));
                _mm512_storeu_ps(
                    g.as_mut_ptr(),
                    _mm512_mul_ps(s, _mm512_loadu_ps(u.as_ptr())),
                );
            }
        }
    }
}

/// `gate = gelu_tanh(gate) * up`, the GeGLU activation of Gemma (HF `gelu_pytorch_tanh`):
/// `gelu_tanh(x) = x/2 * (1 + tanh(sqrt(2/π) * (x + 0.044715 x³)))`, in the order PyTorch's CPU
/// kernel computes it.
pub fn gelu_tanh_mul_in_place(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "gelu_tanh_mul: length mismatch");
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    const KAPPA: f32 = 0.044_715;
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        let cube = x * x * x;
        let inner = SQRT_2_OVER_PI * (x + KAPPA * cube);
        *g = 0.5 * x * (1.0 + inner.tanh()) * u;
    }
}

/// `gate = (clamp(up, ±limit) + 1) · g · sigmoid(alpha · g)` with `g = min(gate, limit)`:
/// gpt-oss's experts' activation (OpenAI's reference and transformers' `_apply_gate`, with
/// `alpha` 1.702 and `limit` 7). The clamps bound what an expert passes on; the `+ 1` is part
/// of the trained function.
pub fn clamped_swiglu_in_place(gate: &mut [f32], up: &[f32], alpha: f32, limit: f32) {
    assert_eq!(gate.len(), up.len(), "clamped_swiglu: length mismatch");
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = g.min(limit);
        let glu = x / (1.0 + (-(x * alpha)).exp());
        *g = (u.clamp(-limit, limit) + 1.0) * glu;
    }
}

/// `x = tanh(x / cap) * cap`: squashes values smoothly into `(-cap, cap)` (Gemma 2 caps its
/// final logits this way; attention scores get the same cap inside
/// [`super::attention::paged_attention`]). Divides rather than multiplying by `1 / cap`, as
/// transformers does: once a value goes through tanh its last bit can tip a near-tie.
pub fn soft_cap_in_place(x: &mut [f32], cap: f32) {
    for v in x {
        *v = soft_cap(*v, cap);
    }
}

#[inline]
pub(crate) fn soft_cap(v: f32, cap: f32) -> f32 {
    (v / cap).tanh() * cap
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clamped_swiglu_clamps_gate_above_and_up_both_ways() {
        let mut gate = [-3.0f32, 0.5, 9.0, 2.0];
        let up = [0.25f32, -9.0, 1.0, 8.0];
        clamped_swiglu_in_place(&mut gate, &up, 1.702, 7.0);
        let f = |g: f64, u: f64| {
            let g = g.min(7.0);
            (u.clamp(-7.0, 7.0) + 1.0) * g / (1.0 + (-1.702 * g).exp())
        };
        let want = [f(-3.0, 0.25), f(0.5, -9.0), f(9.0, 1.0), f(2.0, 8.0)];
        for (g, w) in gate.iter().zip(want) {
            assert!(
                (*g as f64 - w).abs() < 1e-5 * w.abs().max(1.0),
                "{g} vs {w}"
            );
        }
        // The clamps bind: 9 acts as 7, and up of -9 as -7 (so the product's sign flips).
        assert!((gate[2] as f64 - 2.0 * 7.0 / (1.0 + (-11.914f64).exp())).abs() < 1e-4);
        assert!(gate[1] < 0.0);
    }

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5, 4.0, -1.0];
        let w = [0.5f32, 1.0, 2.0];
        let mut out = [0f32; 6];
        rms_norm(&x, &w, 1e-5, &mut out);
        for r in 0..2 {
            let row = &x[r * 3..r * 3 + 3];
            let ms = row.iter().map(|v| v * v).sum::<f32>() / 3.0;
            for i in 0..3 {
                let want = row[i] / (ms + 1e-5).sqrt() * w[i];
                assert!((out[r * 3 + i] - want).abs() < 1e-6);
            }
        }
        let mut y = x;
        rms_norm_in_place(&mut y, &w, 1e-5);
        assert_eq!(y, out);
    }

    #[test]
    fn silu_mul_values() {
        let mut g = [0.0f32, 1.0, -1.0];
        silu_mul_in_place(&mut g, &[2.0, 2.0, 2.0]);
        assert_eq!(g[0], 0.0);
        assert!((g[1] - 2.0 * 0.731_058_6).abs() < 1e-6);
        assert!((g[2] + 2.0 * 0.268_941_4).abs() < 1e-6);
    }

    /// The vector SiLU (and its scalar tail) gives the f64 value within a few ulp, from deep
    /// in the negatives, where it underflows, to large positives; NaN stays NaN.
    #[test]
    fn silu_mul_matches_f64_over_its_range() {
        let x: Vec<f32> = (0..1000).map(|i| (i as f32 - 600.0) * 0.17).collect();
        let up: Vec<f32> = (0..1000).map(|i| 0.5 + (i % 7) as f32 * 0.25).collect();
        let mut g = x.clone();
        silu_mul_in_place(&mut g, &up);
        for ((&x, &u), &got) in x.iter().zip(&up).zip(&g) {
            let (x64, u64) = (f64::from(x), f64::from(u));
            let want = x64 / (1.0 + (-x64).exp()) * u64;
            let tol = 4.0 * f64::from(f32::EPSILON) * want.abs() + 1e-30;
            assert!(
                (f64::from(got) - want).abs() <= tol,
                "silu({x}) * {u}: {got} vs {want}"
            );
        }
        let mut nan = [f32::NAN; 17];
        silu_mul_in_place(&mut nan, &[1.0; 17]);
        assert!(nan.iter().all(|v| v.is_nan()));
    }

    #[test]
    fn gelu_tanh_mul_matches_pytorch() {
        // torch.nn.functional.gelu(x, approximate="tanh") at these points.
        let x = [0.0f32, 1.0, -1.0, 2.5, -3.0, 0.3];
        let want = [
            0.0f32,
            0.841_192,
            -0.158_808,
            2.484_915_7,
            -0.003_637_433,
            0.185_370_94,
        ];
        let mut g = x;
        gelu_tanh_mul_in_place(&mut g, &[1.0; 6]);
        for (got, want) in g.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        let mut g = x;
        gelu_tanh_mul_in_place(&mut g, &[-2.0; 6]);
        assert!((g[1] + 2.0 * 0.841_192).abs() < 1e-6);
    }

    #[test]
    fn layer_norm_centres_scales_and_shifts_each_row() {
        let x = [1.0f32, 2.0, 3.0, 4.0, -2.0, -2.0, -2.0, -2.0];
        let mut out = [0f32; 8];
        layer_norm(
            &x,
            &[1.0, 2.0, 1.0, 1.0],
            &[0.0, 0.0, 0.5, 0.0],
            1e-5,
            &mut out,
        );
        // Row 1: mean 2.5, variance 1.25.
        let inv = 1.0 / (1.25f64 + 1e-5).sqrt();
        let want = [-1.5 * inv, -0.5 * inv * 2.0, 0.5 * inv + 0.5, 1.5 * inv];
        for (got, want) in out[..4].iter().zip(want) {
            assert!((*got as f64 - want).abs() < 1e-6, "{got} vs {want}");
        }
        // A constant row has no variance: only the bias is left.
        assert_eq!(out[4..], [0.0, 0.0, 0.5, 0.0]);
    }

    #[test]
    fn exact_gelu_matches_its_values() {
        // gelu(x) = x Φ(x), Φ the standard normal CDF.
        let mut x = [0.0f32, 1.0, -1.0, 3.0, -3.0, 0.5, -0.25];
        gelu_in_place(&mut x);
        let want = [
            0.0,
            0.841_344_7,
            -0.158_655_3,
            2.995_950_3,
            -0.004_049_7,
            0.345_731_4,
            -0.100_323_4,
        ];
        for (got, want) in x.iter().zip(want) {
            assert!((got - want).abs() < 1e-6, "{got} vs {want}");
        }
        // erf against its values at 0.1 .. 2.
        for (x, want) in [
            (0.1f32, 0.112_462_9),
            (0.5, 0.520_499_9),
            (1.0, 0.842_700_8),
            (2.0, 0.995_322_3),
        ] {
            let got = erf(x);
            assert!(
                (got - want).abs() < 3e-7 && erf(-x) == -got,
                "erf({x}) = {got}"
            );
        }
    }

    #[test]
    fn soft_cap_is_odd_near_identity_small_and_bounded() {
        let mut x = [0.0f32, 0.01, -0.01, 3.0, -3.0, 1e6, -1e6];
        soft_cap_in_place(&mut x, 3.0);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 0.01).abs() < 1e-7 && x[2] == -x[1]);
        assert!((x[3] - 3.0 * 1f32.tanh()).abs() < 1e-6 && x[4] == -x[3]);
        assert_eq!((x[5], x[6]), (3.0, -3.0));
    }
}
