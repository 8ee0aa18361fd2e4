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
    fn soft_cap_is_odd_near_identity_small_and_bounded() {
        let mut x = [0.0f32, 0.01, -0.01, 3.0, -3.0, 1e6, -1e6];
        soft_cap_in_place(&mut x, 3.0);
        assert_eq!(x[0], 0.0);
        assert!((x[1] - 0.01).abs() < 1e-7 && x[2] == -x[1]);
        assert!((x[3] - 3.0 * 1f32.tanh()).abs() < 1e-6 && x[4] == -x[3]);
        assert_eq!((x[5], x[6]), (3.0, -3.0));
    }
}
