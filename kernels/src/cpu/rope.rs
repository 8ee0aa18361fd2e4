//! Rotary position embeddings.

/// How the rotated pairs are laid out in a head (see the engine's `RopeStyle`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopePairing {
    /// `(i, i + rope_dim/2)`: HF `rotate_half`, llama.cpp NEOX.
    Half,
    /// `(2i, 2i + 1)`: llama.cpp NORM.
    Adjacent,
}

/// Per-pair inverse frequencies, the position scale and the cos/sin scale, computed once per
/// model.
#[derive(Debug, Clone)]
pub struct Rope {
    /// `rope_dim / 2` inverse frequencies.
    pub inv_freq: Vec<f32>,
    /// Positions are multiplied by this (linear scaling: `1 / factor`).
    pub position_scale: f32,
    /// The rotation's cos and sin are multiplied by this (YaRN's and LongRoPE's attention
    /// factor; 1 otherwise), in f32 after they are computed, as transformers does.
    pub scale: f32,
    pub pairing: RopePairing,
    pub head_dim: usize,
}

impl Rope {
    /// `inv_freq[i] = theta^(-2i / rope_dim)`, computed in f32 as HF does.
    pub fn base_inv_freq(theta: f32, rope_dim: usize) -> Vec<f32> {
        (0..rope_dim / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / rope_dim as f32))
            .collect()
    }

    /// Rotates each head of `x` (`[tokens, n_heads * head_dim]`) by its token's position.
    ///
    /// # Panics
    /// If the shapes disagree.
    pub fn apply(&self, x: &mut [f32], positions: &[usize], n_heads: usize) {
        let hd = self.head_dim;
        let half = self.inv_freq.len();
        assert!(
            2 * half <= hd && x.len() == positions.len() * n_heads * hd,
            "rope: shape mismatch"
        );
        let mut cos = vec![0f32; half];
        let mut sin = vec![0f32; half];
        for (row, &pos) in x.chunks_exact_mut(n_heads * hd).zip(positions) {
            let p = pos as f32 * self.position_scale;
            for i in 0..half {
                let angle = p * self.inv_freq[i];
                cos[i] = angle.cos() * self.scale;
                sin[i] = angle.sin() * self.scale;
            }
            for head in row.chunks_exact_mut(hd) {
                for i in 0..half {
                    let (a, b) = match self.pairing {
                        RopePairing::Half => (i, i + half),
                        RopePairing::Adjacent => (2 * i, 2 * i + 1),
                    };
                    let (x0, x1) = (head[a], head[b]);
                    head[a] = x0 * cos[i] - x1 * sin[i];
                    head[b] = x0 * sin[i] + x1 * cos[i];
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_zero_is_identity_and_norm_is_kept() {
        let rope = Rope {
            inv_freq: Rope::base_inv_freq(10_000.0, 8),
            position_scale: 1.0,
            scale: 1.0,
            pairing: RopePairing::Half,
            head_dim: 8,
        };
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.1 - 0.7).collect();
        let mut x = orig.clone();
        rope.apply(&mut x, &[0, 5], 1);
        assert_eq!(&x[..8], &orig[..8]);
        let n0: f32 = orig[8..].iter().map(|v| v * v).sum();
        let n1: f32 = x[8..].iter().map(|v| v * v).sum();
        assert!((n0 - n1).abs() < 1e-5);
    }

    #[test]
    fn adjacent_equals_half_on_permuted_rows() {
        // llama.cpp's converter permutes HF Q/K rows so adjacent pairing gives the same result.
        let hd = 8;
        let mk = |pairing| Rope {
            inv_freq: Rope::base_inv_freq(10_000.0, hd),
            position_scale: 1.0,
            scale: 1.0,
            pairing,
            head_dim: hd,
        };
        let hf: Vec<f32> = (0..hd).map(|i| (i as f32).sin()).collect();
        // permuted[2i] = hf[i], permuted[2i+1] = hf[i + hd/2]
        let mut perm = vec![0f32; hd];
        for i in 0..hd / 2 {
            perm[2 * i] = hf[i];
            perm[2 * i + 1] = hf[i + hd / 2];
        }
        let mut a = hf.clone();
        mk(RopePairing::Half).apply(&mut a, &[7], 1);
        mk(RopePairing::Adjacent).apply(&mut perm, &[7], 1);
        for i in 0..hd / 2 {
            assert!((a[i] - perm[2 * i]).abs() < 1e-6);
            assert!((a[i + hd / 2] - perm[2 * i + 1]).abs() < 1e-6);
        }
    }
}
