//! Dispatch of the [`I8Matrix`] product to the fastest kernel the CPU has, and the portable
//! reference kernel.

use super::{I8Activations, I8Matrix};
use crate::quant::Isa;

impl I8Matrix {
    /// `outs[i][j] = row(r0 + j) · x_i` for the quantized activation rows `x`, on the fastest
    /// kernel `isa` allows (VNNI when the CPU has it).
    ///
    /// # Panics
    /// If `x` does not have `outs.len()` rows of this matrix's width, or rows run past it.
    pub fn matmul_rows(&self, isa: Isa, r0: usize, x: &I8Activations, outs: &mut [&mut [f32]]) {
        assert_eq!(x.padded_cols, self.padded_cols(), "activation width");
        assert_eq!(x.m, outs.len(), "one output per activation row");
        let n = outs.first().map_or(0, |o| o.len());
        assert!(
            r0 + n <= self.rows,
            "rows {r0}..{} of {}",
            r0 + n,
            self.rows
        );
        #[cfg(target_arch = "x86_64")]
        if isa.has_avx2() {
            if std::arch::is_x86_feature_detected!("avxvnni") {
                // SAFETY: the CPU has AVX2 and AVX-VNNI (checked); sizes checked above.
                unsafe { super::avx2::rows_vnni(self, r0, n, x, outs) };
            } else {
                // SAFETY: the CPU has AVX2 (checked); sizes checked above.
                unsafe { super::avx2::rows_maddubs(self, r0, n, x, outs) };
            }
            return;
        }
        let _ = isa;
        let kp = self.padded_cols();
        for (i, o) in outs.iter_mut().enumerate() {
            let xq = &x.q[i * kp..(i + 1) * kp];
            for (j, o) in o.iter_mut().enumerate() {
                let r = r0 + j;
                let w = &self.codes[r * kp..(r + 1) * kp];
                let dot: i32 = w
                    .iter()
                    .zip(xq)
                    .map(|(&a, &b)| i32::from(a) * i32::from(b))
                    .sum::<i32>()
                    - self.minus128_fix(r, xq);
                *o = x.scales[i] * self.scales[r] * dot as f32;
            }
        }
    }
}
