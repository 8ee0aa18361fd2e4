//! Activations quantized to int8 per block of 32, for integer dot products with GGUF's block
//! types: llama.cpp's arithmetic for them (its `Q8_0`/`Q8_1`/`Q8_K` activation blocks), opted
//! into with [`super::GgmlActivations::Int8`]; which kernel takes them is `int8.rs`'s choice.
//!
//! A block of 32 activations becomes `d = max|x| / 127` and `q = round(x / d)` in −127..=127;
//! a group of 32 weights `w = dw·qw + m` then gives `Σ w·x ≈ dw·d·Σ qw·q + m·d·Σ q`, whose inner
//! sum is exact in integers. The only error is the activations' rounding (relative ~0.4% per
//! element, mostly cancelling in the sum): the library's default is the f32 path, which keeps
//! the golden tests' agreement with transformers; `ferrite`'s CPU default is int8.

use super::Isa;

/// One row of activations quantized per block of 32.
#[derive(Debug, Clone)]
pub(crate) struct Q8Row {
    /// Per block: the scale `d`.
    pub(crate) d: Vec<f32>,
    /// Per block: `d · Σ q` (the block's sum, for the weights' offsets).
    pub(crate) s: Vec<f32>,
    /// The codes, 32 per block.
    pub(crate) qs: Vec<i8>,
}

impl Q8Row {
    /// Quantizes `x`, whose length is a multiple of 32, in portable Rust: the reference the
    /// vector version of [`Self::new_with`] matches bit for bit (both round half to even).
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of 32.
    pub(crate) fn new(x: &[f32]) -> Self {
        let mut r = Self::zeroed(x.len());
        for (b, blk) in x.chunks_exact(32).enumerate() {
            let amax = blk.iter().fold(0f32, |m, v| m.max(v.abs()));
            let d = amax / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            let mut sum = 0i32;
            for (q, &v) in r.qs[32 * b..32 * b + 32].iter_mut().zip(blk) {
                // |v·id| <= 127 up to rounding, so the cast never saturates meaningfully.
                *q = (v * id).round_ties_even() as i8;
                sum += i32::from(*q);
            }
            r.d[b] = d;
            r.s[b] = d * sum as f32;
        }
        r
    }

    /// [`Self::new`] on `isa`'s vector units (AVX-512's or AVX2's version): the
    /// activations of every GGUF matmul of a step are quantized first, on one thread.
    ///
    /// # Panics
    /// If `x.len()` is not a multiple of 32.
    pub(crate) fn new_with(isa: Isa, x: &[f32]) -> Self {
        #[cfg(target_arch = "x86_64")]
        if let Some(simd) = isa.simd() {
            let mut r = Self::zeroed(x.len());
            match simd.wide() {
                Some(wide) => wide.quantize_q8(x, &mut r),
                None => simd.quantize_q8(x, &mut r),
            }
            return r;
        }
        let _ = isa;
        Self::new(x)
    }

    /// Panics unless `self` holds the blocks of `len` activations, as [`Self::zeroed`] makes
    /// them: what the vector quantizations write into.
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // x86's quantizations
    pub(crate) fn check_len(&self, len: usize) {
        let nb = len / 32;
        assert!(len.is_multiple_of(32), "whole blocks");
        assert!(
            self.d.len() == nb && self.s.len() == nb && self.qs.len() == len,
            "block counts"
        );
    }

    /// All-zero blocks for `len` activations.
    pub(crate) fn zeroed(len: usize) -> Self {
        assert!(
            len.is_multiple_of(32),
            "int8 activations need whole blocks of 32"
        );
        let nb = len / 32;
        Self {
            d: vec![0.0; nb],
            s: vec![0.0; nb],
            qs: vec![0; len],
        }
    }

    /// Blocks of 32.
    pub(crate) fn blocks(&self) -> usize {
        self.d.len()
    }

    /// `[d(g), s(g), d(g + 1), s(g + 1)]` (the last two zero when `last`): what the one-token
    /// dots multiply two weight groups' headers (`[scale, minimum]` each) by.
    ///
    /// # Safety
    /// Block `g` exists, and `g + 1` unless `last`.
    #[cfg(target_arch = "x86_64")]
    #[allow(unsafe_code)] // two unaligned loads the caller's contract bounds
    #[inline(always)]
    pub(crate) unsafe fn scales_sums(&self, g: usize, last: bool) -> std::arch::x86_64::__m128 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract bounds the loads; SSE2 is part of x86-64.
        unsafe {
            let two = |v: &[f32]| {
                let p = v.as_ptr().add(g);
                if last {
                    _mm_load_ss(p)
                } else {
                    _mm_castpd_ps(_mm_load_sd(p.cast()))
                }
            };
            _mm_unpacklo_ps(two(&self.d), two(&self.s))
        }
    }
}

/// The activations of a batched step for the panel kernels: each token as one or two
/// [`Q8Row`]s whose sum stands for it. One term is llama.cpp's int8 rounding. Two are that
/// rounding plus the int8 rounding of what it left over, a token within `max|x| / 64516` per
/// block of its exact value (about 16 bits, where f16 keeps 11) for twice the integer work.
#[derive(Debug, Clone)]
pub(crate) struct Q8Tokens {
    /// Token `t`'s terms: `rows[t·terms..(t + 1)·terms]`.
    rows: Vec<Q8Row>,
    terms: usize,
}

#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))] // read by x86's panels
impl Q8Tokens {
    /// The tokens of `x` (rows of `k`, a multiple of 32) in `terms` (1 or 2) terms each.
    ///
    /// # Panics
    /// If `k` is not a multiple of 32 or `x` not whole rows of it, or `terms` is not 1 or 2.
    pub(crate) fn new(isa: Isa, x: &[f32], k: usize, terms: usize) -> Self {
        assert!(matches!(terms, 1 | 2), "1 or 2 terms");
        assert!(k > 0 && x.len().is_multiple_of(k), "whole rows");
        let mut rows = Vec::with_capacity(x.len() / k * terms);
        let mut rest = vec![0f32; k];
        for x in x.chunks_exact(k) {
            let hi = Q8Row::new_with(isa, x);
            if terms == 2 {
                // Block by block, so the compiler vectorizes the 32 subtractions.
                let blocks = rest.chunks_exact_mut(32).zip(x.chunks_exact(32));
                for (b, (r, v)) in blocks.enumerate() {
                    let (d, q) = (hi.d[b], &hi.qs[32 * b..32 * b + 32]);
                    for ((r, v), q) in r.iter_mut().zip(v).zip(q) {
                        *r = v - d * f32::from(*q);
                    }
                }
                rows.push(hi);
                rows.push(Q8Row::new_with(isa, &rest));
            } else {
                rows.push(hi);
            }
        }
        Self { rows, terms }
    }

    /// Tokens.
    pub(crate) fn tokens(&self) -> usize {
        self.rows.len() / self.terms
    }

    /// Terms per token.
    pub(crate) fn terms(&self) -> usize {
        self.terms
    }

    /// Blocks of 32 per token.
    pub(crate) fn blocks(&self) -> usize {
        self.rows.first().map_or(0, Q8Row::blocks)
    }

    /// The terms of `tokens`, token by token.
    pub(crate) fn terms_of(&self, tokens: std::ops::Range<usize>) -> &[Q8Row] {
        &self.rows[tokens.start * self.terms..tokens.end * self.terms]
    }
}

/// `Σ row · x` for one stored row of block type `ty` and quantized activations, in portable
/// Rust: the exactly dequantized weights times the activations' codes times their scales. The
/// integer kernels compute the same sum up to float rounding, and are tested against it.
///
/// # Panics
/// If `ty` is a float type or `row` does not hold `x.blocks()` groups of 32.
#[cfg(test)]
pub(crate) fn dot(ty: super::GgmlType, row: &[u8], x: &Q8Row) -> f32 {
    assert!(ty.is_quantized(), "no int8-activation dot for {ty}");
    let k = 32 * x.blocks();
    assert_eq!(Some(row.len()), ty.row_bytes(k).ok(), "weight bytes");
    let mut w = vec![0f32; k];
    super::scalar::dequantize(ty, row, &mut w);
    let mut acc = 0f64;
    for (g, (wg, qg)) in w.chunks_exact(32).zip(x.qs.chunks_exact(32)).enumerate() {
        let sum: f64 = wg
            .iter()
            .zip(qg)
            .map(|(&w, &q)| f64::from(w) * f64::from(q))
            .sum();
        acc += sum * f64::from(x.d[g]);
    }
    acc as f32
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::quant::{GgmlType, dequantize};

    /// A row of `k` elements of block type `ty`: random bytes, with every f16 scale (and
    /// minimum) of each block set to a small normal value (MXFP4's exponents likewise).
    pub(crate) fn random_row(ty: GgmlType, k: usize, seed: u32) -> Vec<u8> {
        let mut state = seed.wrapping_mul(747796405).wrapping_add(1);
        let mut byte = move || {
            state = state.wrapping_mul(1664525).wrapping_add(1013904223);
            (state >> 24) as u8
        };
        let bb = ty.block_bytes();
        let mut row: Vec<u8> = (0..k / ty.block_elems() * bb).map(|_| byte()).collect();
        let f16_fields: &[usize] = match ty {
            GgmlType::Q8_0 | GgmlType::Q4_0 => &[0],
            GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
            GgmlType::Q6_K => &[208],
            _ => &[],
        };
        for block in row.chunks_exact_mut(bb) {
            for &at in f16_fields {
                let v = half::f16::from_f32(0.002 + f32::from(block[at]) / 4000.0);
                block[at..at + 2].copy_from_slice(&v.to_le_bytes());
            }
            // MXFP4's exponent: scales from 2^-10 to 2^-3.
            if ty == GgmlType::MXFP4 {
                block[0] = 118 + block[0] % 8;
            }
        }
        row
    }

    fn sample(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (((i as u32).wrapping_mul(2654435761) ^ seed) % 2001) as f32 / 1000.0 - 1.0)
            .collect()
    }

    /// Codes and scales reproduce the activations within half a step per element.
    #[test]
    fn quantized_activations_are_within_half_a_step() {
        let mut x = sample(96, 7);
        x[40] = 9.0; // an outlier sets its block's scale
        x[64..96].fill(0.0); // an all-zero block
        let r = Q8Row::new(&x);
        for (i, &v) in x.iter().enumerate() {
            let back = r.d[i / 32] * f32::from(r.qs[i]);
            assert!(
                (back - v).abs() <= r.d[i / 32] * 0.5 + 1e-6,
                "{i}: {v} vs {back}"
            );
        }
        assert_eq!(r.qs[40], 127);
        assert_eq!(r.d[2], 0.0);
        let sum: i32 = r.qs[..32].iter().map(|&q| i32::from(q)).sum();
        assert!((r.s[0] - r.d[0] * sum as f32).abs() < 1e-6);
    }

    /// The vector quantization is the portable one, bit for bit, ties and zero blocks too.
    #[test]
    fn vector_quantization_is_the_portable_one() {
        let mut x = sample(32 * 40, 5);
        x[3] = 62.5; // with max 127 in its block, d = 1: a tie
        x[7] = 127.0;
        x[64..96].fill(0.0);
        x[100] = -300.0; // a block whose largest magnitude is negative
        let a = Q8Row::new(&x);
        assert_eq!(a.qs[3], 62, "ties round to even");
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        for isa in [Isa::Avx2, Isa::Avx512] {
            let b = Q8Row::new_with(isa, &x);
            assert_eq!(a.qs, b.qs, "{isa}");
            assert_eq!(bits(&a.d), bits(&b.d), "{isa}");
            assert_eq!(bits(&a.s), bits(&b.s), "{isa}");
        }
    }

    /// The int8 dot is within the activations' rounding of the exact product of the
    /// dequantized weights and the f32 activations.
    #[test]
    fn int8_dot_is_close_to_the_exact_product() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q6_K,
        ] {
            let k = 256;
            let row = random_row(ty, k, 3);
            let mut wd = vec![0f32; k];
            dequantize(ty, &row, &mut wd).expect("whole blocks");
            let x = sample(k, 11);
            let got = dot(ty, &row, &Q8Row::new(&x));
            let exact: f64 = wd.iter().zip(&x).map(|(a, b)| f64::from(a * b)).sum();
            // Each activation moves by at most half a step, d/2 = max|x|/254 in its block: a
            // bound on the error, relative to Σ|w|·max|x|, of 1/254; the errors mostly cancel.
            let scale: f64 = wd.iter().map(|w| f64::from(w.abs())).sum();
            let err = (f64::from(got) - exact).abs();
            assert!(err < scale / 254.0, "{ty}: {got} vs exact {exact}");
            assert!(
                err < scale / 2000.0,
                "{ty}: {got} vs exact {exact}: no cancellation"
            );
        }
    }
}
