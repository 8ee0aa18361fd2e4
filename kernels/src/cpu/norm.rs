//! RMSNorm and the element-wise ops around it.

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

/// `gate = silu(gate) * up`, the SwiGLU activation (`silu(x) = x * sigmoid(x)`).
pub fn silu_mul_in_place(gate: &mut [f32], up: &[f32]) {
    assert_eq!(gate.len(), up.len(), "silu_mul: length mismatch");
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = *g / (1.0 + (-*g).exp()) * u;
    }
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
}
