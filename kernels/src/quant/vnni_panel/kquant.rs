//! The K-quants in the panels: each super-block (256 weights, eight groups of 32 under one
//! header) decoded whole, its header once. Q4_K's and Q5_K's group `s` is `d·sc_s·u − dmin·m_s`,
//! so the panel's scale is `d·sc_s` and its offset `−dmin·m_s`, with unsigned codes `u` of 4 bits
//! (Q4_K) or 5 (Q5_K): the same form as Q4_1's. Q6_K's weights are `d·sc_r·(u − 32)` with a
//! scale per run `r` of 16 (two runs a group: `runs` in `mod.rs`), `u` of 6 bits.

use super::{Groups, PanelGroup, Rows, Width, words};
use crate::quant::GgmlType;

pub(super) struct Q4K;
pub(super) struct Q5K;
pub(super) struct Q6K;

/// The rows' header at `at` (f16 `d` and `dmin`, then the eight 6-bit scales and minima in 12
/// bytes, ggml's `get_scale_min_k4`): scale and offset per group.
///
/// # Safety
/// `W`'s features; 16 bytes at `rows[r] + at` readable for every row.
#[inline(always)]
unsafe fn k4_header<W: Width>(rows: &Rows, at: usize, scale: &mut [W::F], offset: &mut [W::F]) {
    // SAFETY: forwarded; the words are of the rows' headers, one row per lane.
    unsafe {
        let [dm, q0, q1, q2] = words::<W>(rows, at);
        let d = W::f16_lanes(dm, false);
        let dmin = W::mul(W::f16_lanes(dm, true), W::splat(-1.0));
        // Groups 0-3 take the low six bits of bytes 0-3 (scales) and 4-7 (minima); groups 4-7
        // the nibbles of bytes 8-11 with the top two bits of bytes 0-3 and 4-7 above.
        let (low6, nibble) = (W::splat_i(0x3f3f_3f3f), W::splat_i(0x0f0f_0f0f));
        let high = |q| W::and(W::shr(q, 2), W::splat_i(0x3030_3030));
        let sc = [W::and(q0, low6), W::or(W::and(q2, nibble), high(q0))];
        let m = [
            W::and(q1, low6),
            W::or(W::and(W::shr(q2, 4), nibble), high(q1)),
        ];
        for s in 0..8 {
            let byte = |v: [W::I; 2]| {
                W::to_f32(W::and(
                    W::shr(v[s / 4], 8 * (s as u32 % 4)),
                    W::splat_i(0xff),
                ))
            };
            scale[s] = W::mul(d, byte(sc));
            offset[s] = W::mul(dmin, byte(m));
        }
    }
}

/// The low four bits of the rows' codes at `at`: 128 bytes, four runs of 32, whose low nibbles
/// are group `2j`'s codes and high nibbles group `2j + 1`'s (run `j`).
///
/// # Safety
/// As [`words`], for the 128 bytes.
#[inline(always)]
unsafe fn k4_codes<W: Width>(rows: &Rows, at: usize, codes: &mut [W::I]) {
    for j in 0..4 {
        for half in 0..2 {
            // SAFETY: forwarded.
            let w = unsafe { words::<W>(rows, at + 32 * j + 16 * half) };
            for (i, v) in w.into_iter().enumerate() {
                // SAFETY: the caller's features.
                unsafe {
                    codes[8 * (2 * j) + 4 * half + i] = W::low_nibbles(v, false);
                    codes[8 * (2 * j + 1) + 4 * half + i] = W::low_nibbles(v, true);
                }
            }
        }
    }
}

impl<W: Width> PanelGroup<W> for Q4K {
    const BYTES: usize = GgmlType::Q4_K.block_bytes();
    const GROUPS: usize = 8;

    #[inline(always)]
    unsafe fn block(rows: &Rows, blk: usize, out: Groups<'_, W>) {
        let at = blk * <Self as PanelGroup<W>>::BYTES;
        // SAFETY: a 144-byte block per row at `at` (the caller's contract): the 16-byte header,
        // then 128 code bytes.
        unsafe {
            k4_header::<W>(rows, at, out.scale, out.offset);
            k4_codes::<W>(rows, at + 16, out.codes);
        }
    }
}

impl<W: Width> PanelGroup<W> for Q5K {
    const BYTES: usize = GgmlType::Q5_K.block_bytes();
    const GROUPS: usize = 8;

    #[inline(always)]
    unsafe fn block(rows: &Rows, blk: usize, out: Groups<'_, W>) {
        let at = blk * <Self as PanelGroup<W>>::BYTES;
        // SAFETY: a 176-byte block per row at `at` (the caller's contract): the 16-byte header,
        // 32 bytes of fifth bits (bit s of byte l is group s's element l), 128 as Q4_K's.
        unsafe {
            k4_header::<W>(rows, at, out.scale, out.offset);
            k4_codes::<W>(rows, at + 48, out.codes);
            for half in 0..2 {
                let qh = words::<W>(rows, at + 16 + 16 * half);
                for s in 0..8 {
                    for (i, &v) in qh.iter().enumerate() {
                        // Bit s of each byte to bit 4.
                        let v = if s <= 4 {
                            W::shl(v, 4 - s as u32)
                        } else {
                            W::shr(v, s as u32 - 4)
                        };
                        let c = &mut out.codes[8 * s + 4 * half + i];
                        *c = W::or(*c, W::and(v, W::splat_i(0x1010_1010)));
                    }
                }
            }
        }
    }
}

impl<W: Width> PanelGroup<W> for Q6K {
    const BYTES: usize = GgmlType::Q6_K.block_bytes();
    const GROUPS: usize = 8;

    #[inline(always)]
    unsafe fn block(rows: &Rows, blk: usize, out: Groups<'_, W>) {
        let at = blk * <Self as PanelGroup<W>>::BYTES;
        // SAFETY: a 210-byte block per row at `at` (the caller's contract): ql 128 (low four
        // bits), qh 64 (the top two), 16 i8 scales (one per run), f16 d. Every 16 bytes read
        // are inside it.
        unsafe {
            // d is the high half of the last word of bytes 194..210.
            let d = W::f16_lanes(words::<W>(rows, at + 194)[3], true);
            let sc = words::<W>(rows, at + 192);
            for r in 0..16 {
                // Scale r, byte r % 4 of word r / 4, sign-extended.
                let byte = W::sra(W::shl(sc[r / 4], 24 - 8 * (r as u32 % 4)), 24);
                out.scale[r] = W::mul(d, W::to_f32(byte));
                out.offset[r] = W::mul(out.scale[r], W::splat(-32.0));
            }
            // Group s = 4·half + q: the low (q < 2) or high nibbles of ql's 32 bytes at
            // 64·half + 32·(q % 2), and bits 2q, 2q + 1 of qh's 32 bytes at 128 + 32·half.
            for half in 0..2 {
                for sixteen in 0..2 {
                    let qh = words::<W>(rows, at + 128 + 32 * half + 16 * sixteen);
                    for run in 0..2 {
                        let ql = words::<W>(rows, at + 64 * half + 32 * run + 16 * sixteen);
                        for q in [run, run + 2] {
                            for i in 0..4 {
                                let low = W::low_nibbles(ql[i], q >= 2);
                                let high = W::shl(W::shr(qh[i], 2 * q as u32), 4);
                                let high = W::and(high, W::splat_i(0x3030_3030));
                                out.codes[8 * (4 * half + q) + 4 * sixteen + i] = W::or(low, high);
                            }
                        }
                    }
                }
            }
        }
    }
}
