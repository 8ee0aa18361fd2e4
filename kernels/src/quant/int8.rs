//! Which integer kernel multiplies GGUF block weights by int8 activations ([`Q8Row`],
//! [`Q8Tokens`]), and when steps take them ([`GgmlActivations`]): x86's AVX2 and AVX-512
//! one-token dots, the VNNI panels for batches, or the portable dot (`q8_dot.rs`, ARM's `sdot`).

use super::q8::{Q8Row, Q8Tokens};
use super::{GgmlType, Isa};

/// How block-quantized GGUF weights multiply the activations of a step.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub enum GgmlActivations {
    /// f32 activations times exactly dequantized weights (the default).
    #[default]
    F32,
    /// llama.cpp's arithmetic for block-quantized weights: activations rounded to int8 per
    /// block of 32, integer dot products per group of 32. One-token steps for every block
    /// type (Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K); batched ones where the panel kernel runs
    /// ([`has_panels`]), f32 elsewhere. Float weights keep f32.
    Int8,
    /// As close to exact as the fastest kernel allows: one-token steps exact; batched steps
    /// in two int8 terms ([`Q8Tokens`], within `max|x| / 64516` of each block) where the
    /// panel kernel runs ([`has_panels`]), f32 elsewhere. For prompts and the LM head, where
    /// one int8 term flips near-ties of what is sampled.
    Fine,
}

impl GgmlActivations {
    /// The int8 terms each token of a step of `m` tokens takes with weights of `ty` on `isa`:
    /// 0 for exact f32 activations.
    pub(crate) fn terms(self, isa: Isa, ty: GgmlType, m: usize) -> usize {
        match self {
            _ if !ty.is_quantized() => 0,
            Self::Int8 if m == 1 => 1,
            Self::Int8 if has_panels(isa, ty) => 1,
            // Not Q6_K: its two runs a group double the float work per term, and in two terms
            // the f32 tiles were as fast (a 128-token prompt of a 3B Q4_K_M file, 2026-11-30).
            Self::Fine if m > 1 && has_panels(isa, ty) && ty != GgmlType::Q6_K => 2,
            _ => 0,
        }
    }
}

/// `out[j] = row_j · x` for the `out.len()` contiguous rows of block type `ty` in `rows`, on
/// `isa` if this CPU has it (x86's kernels, else the portable one, with ARM's `sdot` for
/// [`Isa::Neon`]).
///
/// # Panics
/// If `ty` is a float type or `rows` is not `out.len()` rows of `x.blocks()` groups of 32.
pub(crate) fn rows(isa: Isa, ty: GgmlType, rows: &[u8], x: &Q8Row, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = isa.simd() {
        return simd.q8_rows(ty, rows, x, out);
    }
    super::q8_dot::rows(ty, rows, x, out, isa == Isa::Neon && isa.is_available());
}

/// Whether batched steps (several activation rows) with weights of `ty` take integer
/// activations ([`Q8Tokens`]) on `isa`: only where an integer kernel shares each decoded weight
/// across the rows (the panels: Q4_0, Q4_1 and the K-quants on every x86 CPU with AVX2, Q8_0
/// with VNNI, MXFP4 with AVX-512). Elsewhere (ARM) the f32 tiles, which share it too, are
/// faster than one integer dot per row and token, so batches keep f32 activations there.
pub(crate) fn has_panels(isa: Isa, ty: GgmlType) -> bool {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = isa.simd() {
        return super::vnni_panel::Panels::of(simd).has(ty);
    }
    let _ = (isa, ty);
    false
}

/// Which integer panels batched steps run on `isa` (for `ferrite doctor`), if any.
pub fn panels_name(isa: Isa) -> Option<&'static str> {
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = isa.simd() {
        return Some(super::vnni_panel::Panels::of(simd).name());
    }
    let _ = isa;
    None
}

/// `outs[i][j] = row_j · xs.token(i)` for the `nrows` contiguous rows of `ty` in `rows`,
/// where [`has_panels`] says so.
///
/// # Panics
/// If [`has_panels`] is false, or the lengths do not match.
pub(crate) fn panels(
    isa: Isa,
    ty: GgmlType,
    rows: &[u8],
    nrows: usize,
    xs: &Q8Tokens,
    outs: &mut [&mut [f32]],
) {
    #[cfg(target_arch = "x86_64")]
    if let Some(panels) = isa.simd().map(super::vnni_panel::Panels::of) {
        return panels.run(ty, rows, nrows, xs, outs);
    }
    let _ = (isa, ty, rows, nrows, xs, outs);
    panic!("no int8 panel kernel on this CPU");
}
