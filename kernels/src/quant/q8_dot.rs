//! The one-token int8 dot ([`Q8Row`] activations) in portable Rust, for every CPU without the
//! x86 kernels: ARM's (Apple's laptops, Graviton) and x86 below AVX2.
//!
//! Each group of 32 weights is unpacked to 32 small integer codes with a scale per half and
//! an offset (`w = scale·code + offset`); its products with the activation codes are summed
//! in `i32` (exact), scaled once, and the offset multiplies the activations' block sum. How
//! the 16-code sums are taken is the one part per CPU ([`Dot`]): plain loops the compiler
//! vectorizes, or, on ARM with the dot-product extension ([`rows`] checks the CPU), one `sdot`
//! per 16 bytes. The unpacking, written once, is compiled into both.

use super::q8::Q8Row;
use super::scalar::{MXFP4_DOUBLED, f16_at, mxfp4_half_scale, scale_min_k4};
use super::{GgmlType, QK_K};

/// A group of 32 weights: `w[i] = scale[i / 16] · codes[i] + offset`.
struct Group {
    codes: [i8; 32],
    scale: [f32; 2],
    offset: f32,
}

/// A block type read as groups of 32.
trait Blocks {
    /// Bytes per block.
    const BYTES: usize;
    /// Groups of 32 per block.
    const GROUPS: usize;
    /// Group `j` of `block` (exactly [`Self::BYTES`] long).
    fn group(block: &[u8], j: usize) -> Group;
}

/// `out[j] = row_j · x` for the `out.len()` contiguous rows of block type `ty` in `rows`; on
/// ARM with the dot-product extension (`sdot`) when the CPU has it and `dotprod` is true.
///
/// # Panics
/// If `ty` is a float type or `rows` is not `out.len()` rows of `x.blocks()` groups of 32.
#[allow(unsafe_code)] // one call of the `sdot` build, where the CPU has it
pub(crate) fn rows(ty: GgmlType, rows: &[u8], x: &Q8Row, out: &mut [f32], dotprod: bool) {
    assert!(ty.is_quantized(), "no int8-activation dot for {ty}");
    let rb = ty.row_bytes(32 * x.blocks()).expect("whole blocks");
    assert_eq!(rows.len(), rb * out.len(), "weight bytes");
    #[cfg(target_arch = "aarch64")]
    if dotprod && std::arch::is_aarch64_feature_detected!("dotprod") {
        // SAFETY: the CPU has the dot-product extension (detected just above).
        return unsafe { rows_dotprod(ty, rows, rb, x, out) };
    }
    let _ = dotprod;
    rows_of_type::<Portable>(ty, rows, rb, x, out);
}

/// [`rows_of_type`] with ARM's dot-product instruction.
#[cfg(target_arch = "aarch64")]
#[target_feature(enable = "dotprod")]
fn rows_dotprod(ty: GgmlType, rows: &[u8], rb: usize, x: &Q8Row, out: &mut [f32]) {
    rows_of_type::<arm::Sdot>(ty, rows, rb, x, out);
}

#[inline(always)]
fn rows_of_type<D: Dot>(ty: GgmlType, rows: &[u8], rb: usize, x: &Q8Row, out: &mut [f32]) {
    match ty {
        GgmlType::Q8_0 => rows_of::<Q8_0, D>(rows, rb, x, out),
        GgmlType::Q4_0 => rows_of::<Q4_0, D>(rows, rb, x, out),
        GgmlType::Q4_1 => rows_of::<Q4_1, D>(rows, rb, x, out),
        GgmlType::Q4_K => rows_of::<Q4K, D>(rows, rb, x, out),
        GgmlType::Q5_K => rows_of::<Q5K, D>(rows, rb, x, out),
        GgmlType::Q6_K => rows_of::<Q6K, D>(rows, rb, x, out),
        GgmlType::MXFP4 => rows_of::<Mxfp4, D>(rows, rb, x, out),
        GgmlType::F32 | GgmlType::F16 | GgmlType::BF16 => unreachable!("asserted quantized"),
    }
}

#[inline(always)]
fn rows_of<B: Blocks, D: Dot>(rows: &[u8], rb: usize, x: &Q8Row, out: &mut [f32]) {
    for (o, row) in out.iter_mut().zip(rows.chunks_exact(rb.max(1))) {
        *o = row_dot::<B, D>(row, x);
    }
}

#[inline(always)]
fn row_dot<B: Blocks, D: Dot>(row: &[u8], x: &Q8Row) -> f32 {
    let (mut acc, mut offsets) = (D::Acc::default(), 0f32);
    let groups = x.qs.chunks_exact(32).zip(x.d.iter().zip(&x.s));
    let mut groups = groups.enumerate();
    for block in row.chunks_exact(B::BYTES) {
        for (j, (q, (&d, &s))) in groups.by_ref().take(B::GROUPS) {
            let g = B::group(block, j % B::GROUPS);
            let q = q.try_into().expect("32 codes");
            D::add(&mut acc, &g.codes, q, [d * g.scale[0], d * g.scale[1]]);
            offsets += g.offset * s;
        }
    }
    D::total(acc) + offsets
}

/// How a group's 32 code products are summed into a row's accumulator.
trait Dot {
    type Acc: Default + Copy;
    /// `acc += scale[0]·Σ a[..16]·b[..16] + scale[1]·Σ a[16..]·b[16..]`, the sums exact.
    fn add(acc: &mut Self::Acc, a: &[i8; 32], b: &[i8; 32], scale: [f32; 2]);
    fn total(acc: Self::Acc) -> f32;
}

/// Plain Rust: the sums are loops the compiler vectorizes as it can.
struct Portable;
impl Dot for Portable {
    type Acc = f32;
    #[inline(always)]
    fn add(acc: &mut f32, a: &[i8; 32], b: &[i8; 32], scale: [f32; 2]) {
        let sum16 = |a: &[i8], b: &[i8]| -> i32 {
            a.iter()
                .zip(b)
                .map(|(&a, &b)| i32::from(a) * i32::from(b))
                .sum()
        };
        let (lo, hi) = (sum16(&a[..16], &b[..16]), sum16(&a[16..], &b[16..]));
        *acc += scale[0] * lo as f32 + scale[1] * hi as f32;
    }
    #[inline(always)]
    fn total(acc: f32) -> f32 {
        acc
    }
}

/// ARM's `sdot` (16 byte products into 4 lanes per instruction), its lanes scaled into four
/// f32 accumulators summed once per row. By `asm!`: Rust's `vdotq_s32` is not stable yet,
/// and LLVM forms `sdot` from the portable loop in some types' code and not in others'.
#[cfg(target_arch = "aarch64")]
#[allow(unsafe_code)]
mod arm {
    use std::arch::aarch64::*;
    use std::arch::asm;

    #[derive(Debug)]
    pub(super) struct Sdot;

    /// Four f32 lanes (`float32x4_t` has no `Default`).
    #[derive(Clone, Copy)]
    pub(super) struct Lanes(float32x4_t);

    impl Default for Lanes {
        #[inline(always)]
        fn default() -> Self {
            // SAFETY: NEON is part of aarch64.
            Self(unsafe { vdupq_n_f32(0.0) })
        }
    }

    /// `acc + Σ` of each lane's 4 byte products of `a` and `b`.
    ///
    /// # Safety
    /// The CPU has the dot-product extension.
    #[inline(always)]
    unsafe fn sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
        let mut acc = acc;
        // SAFETY: a register-only instruction the caller's CPU has.
        unsafe {
            asm!(
                ".arch_extension dotprod",
                "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
                acc = inout(vreg) acc,
                a = in(vreg) a,
                b = in(vreg) b,
                options(pure, nomem, nostack, preserves_flags),
            );
        }
        acc
    }

    impl super::Dot for Sdot {
        type Acc = Lanes;
        #[inline(always)]
        fn add(acc: &mut Lanes, a: &[i8; 32], b: &[i8; 32], scale: [f32; 2]) {
            // SAFETY: the arrays hold the 32 bytes read; `Sdot` runs only inside
            // `rows_dotprod`, which the dot-product extension's detection guards.
            unsafe {
                let zero = vdupq_n_s32(0);
                let (a0, a1) = (vld1q_s8(a.as_ptr()), vld1q_s8(a.as_ptr().add(16)));
                let (b0, b1) = (vld1q_s8(b.as_ptr()), vld1q_s8(b.as_ptr().add(16)));
                let lo = vcvtq_f32_s32(sdot(zero, a0, b0));
                let hi = vcvtq_f32_s32(sdot(zero, a1, b1));
                acc.0 = vfmaq_n_f32(vfmaq_n_f32(acc.0, lo, scale[0]), hi, scale[1]);
            }
        }
        #[inline(always)]
        fn total(acc: Lanes) -> f32 {
            // SAFETY: NEON is part of aarch64.
            unsafe { vaddvq_f32(acc.0) }
        }
    }
}

/// Codes of 16 packed bytes: low nibbles first, then high (Q4_0's, Q4_1's and MXFP4's order).
#[inline(always)]
fn nibbles(qs: &[u8]) -> [i8; 32] {
    let mut c = [0i8; 32];
    let (lo, hi) = c.split_at_mut(16);
    for ((l, h), &q) in lo.iter_mut().zip(hi).zip(&qs[..16]) {
        *l = (q & 0xF) as i8;
        *h = (q >> 4) as i8;
    }
    c
}

/// One nibble of each of 32 bytes (`shift` 0: low, 4: high), as K-quants store a group.
#[inline(always)]
fn nibble_of(qs: &[u8], shift: u32) -> [i8; 32] {
    let mut c = [0i8; 32];
    for (c, &q) in c.iter_mut().zip(&qs[..32]) {
        *c = ((q >> shift) & 0xF) as i8;
    }
    c
}

struct Q8_0;
impl Blocks for Q8_0 {
    const BYTES: usize = GgmlType::Q8_0.block_bytes();
    const GROUPS: usize = 1;
    #[inline(always)]
    fn group(b: &[u8], _: usize) -> Group {
        let d = f16_at(b, 0);
        let mut codes = [0i8; 32];
        for (c, &q) in codes.iter_mut().zip(&b[2..34]) {
            *c = q as i8;
        }
        Group {
            codes,
            scale: [d; 2],
            offset: 0.0,
        }
    }
}

struct Q4_0;
impl Blocks for Q4_0 {
    const BYTES: usize = GgmlType::Q4_0.block_bytes();
    const GROUPS: usize = 1;
    #[inline(always)]
    fn group(b: &[u8], _: usize) -> Group {
        let d = f16_at(b, 0);
        // d·(u − 8): the codes stay unsigned, the −8 is an offset on the block sum.
        Group {
            codes: nibbles(&b[2..18]),
            scale: [d; 2],
            offset: -8.0 * d,
        }
    }
}

struct Q4_1;
impl Blocks for Q4_1 {
    const BYTES: usize = GgmlType::Q4_1.block_bytes();
    const GROUPS: usize = 1;
    #[inline(always)]
    fn group(b: &[u8], _: usize) -> Group {
        let d = f16_at(b, 0);
        Group {
            codes: nibbles(&b[4..20]),
            scale: [d; 2],
            offset: f16_at(b, 2),
        }
    }
}

struct Mxfp4;
impl Blocks for Mxfp4 {
    const BYTES: usize = GgmlType::MXFP4.block_bytes();
    const GROUPS: usize = 1;
    #[inline(always)]
    fn group(b: &[u8], _: usize) -> Group {
        let d = mxfp4_half_scale(b[0]);
        let mut codes = nibbles(&b[1..17]);
        for c in &mut codes {
            *c = MXFP4_DOUBLED[*c as usize];
        }
        Group {
            codes,
            scale: [d; 2],
            offset: 0.0,
        }
    }
}

/// Q4_K's and Q5_K's scale and offset of sub-block `j`: `d·sc` and `−dmin·m`.
#[inline(always)]
fn k_scale_offset(b: &[u8], j: usize) -> ([f32; 2], f32) {
    let (sc, m) = scale_min_k4(j, &b[4..16]);
    let d = f16_at(b, 0) * f32::from(sc);
    ([d; 2], -f16_at(b, 2) * f32::from(m))
}

struct Q4K;
impl Blocks for Q4K {
    const BYTES: usize = GgmlType::Q4_K.block_bytes();
    const GROUPS: usize = QK_K / 32;
    #[inline(always)]
    fn group(b: &[u8], j: usize) -> Group {
        // Groups 2p and 2p + 1 are the low and high nibbles of the same 32 bytes.
        let qs = &b[16 + 32 * (j / 2)..][..32];
        let (scale, offset) = k_scale_offset(b, j);
        Group {
            codes: nibble_of(qs, 4 * (j as u32 % 2)),
            scale,
            offset,
        }
    }
}

struct Q5K;
impl Blocks for Q5K {
    const BYTES: usize = GgmlType::Q5_K.block_bytes();
    const GROUPS: usize = QK_K / 32;
    #[inline(always)]
    fn group(b: &[u8], j: usize) -> Group {
        let qs = &b[48 + 32 * (j / 2)..][..32];
        let qh = &b[16..48];
        let mut codes = nibble_of(qs, 4 * (j as u32 % 2));
        // The fifth bit of group j's element l is bit j of qh[l].
        for (c, &h) in codes.iter_mut().zip(qh) {
            *c |= (((h >> j) & 1) << 4) as i8;
        }
        let (scale, offset) = k_scale_offset(b, j);
        Group {
            codes,
            scale,
            offset,
        }
    }
}

struct Q6K;
impl Blocks for Q6K {
    const BYTES: usize = GgmlType::Q6_K.block_bytes();
    const GROUPS: usize = QK_K / 32;
    #[inline(always)]
    fn group(b: &[u8], j: usize) -> Group {
        // Half n of the block holds groups 4n..4n + 4: group 4n + i takes its low four bits
        // from the 32 bytes of ql at (i % 2)·32, nibble i / 2, and its top two from qh's
        // bits 2i, with a signed scale per 16 elements.
        let (n, i) = (j / 4, j % 4);
        let ql = &b[64 * n + 32 * (i % 2)..][..32];
        let qh = &b[128 + 32 * n..][..32];
        let mut codes = nibble_of(ql, 4 * (i as u32 / 2));
        for (c, &h) in codes.iter_mut().zip(qh) {
            *c = (*c | (((h >> (2 * i)) & 3) << 4) as i8) - 32;
        }
        let d = f16_at(b, 208);
        let sc = &b[192 + 8 * n + 2 * i..][..2];
        Group {
            codes,
            scale: [d * f32::from(sc[0] as i8), d * f32::from(sc[1] as i8)],
            offset: 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::{self, tests::random_row};

    /// Every type equals the portable reference (the dequantized weights times the codes, in
    /// f64), with and without the dot-product instructions, on rows of one to nine blocks with
    /// extreme codes (Q8_0's −128), a zero activation block and an outlier.
    #[test]
    fn matches_the_portable_reference() {
        for ty in GgmlType::ALL.into_iter().filter(|t| t.is_quantized()) {
            for blocks in [1, 2, 5, 9] {
                let k = ty.block_elems() * blocks;
                let nrows = 3;
                let mut rows: Vec<u8> = (0..nrows)
                    .flat_map(|r| random_row(ty, k, 29 + r as u32))
                    .collect();
                if ty == GgmlType::Q8_0 {
                    rows[2..34].fill(0x80);
                }
                let mut x: Vec<f32> = (0..k)
                    .map(|i| ((i * 41 % 103) as f32 - 51.0) / 9.0)
                    .collect();
                x[..32].fill(0.0);
                x[k - 3] = -250.0;
                let acts = Q8Row::new(&x);
                let rb = rows.len() / nrows;
                for dotprod in [false, true] {
                    let mut out = vec![0f32; nrows];
                    super::rows(ty, &rows, &acts, &mut out, dotprod);
                    for (j, got) in out.iter().enumerate() {
                        let want = q8::dot(ty, &rows[j * rb..(j + 1) * rb], &acts);
                        let tol = 1e-4 * want.abs().max(1.0);
                        assert!(
                            (got - want).abs() <= tol,
                            "{ty} k{k} row{j} dotprod {dotprod}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
}
