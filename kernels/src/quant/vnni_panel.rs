//! Block-quantized weights times several rows of activations in integers (prefill, batched
//! decode) with AVX-512 VNNI, each weight decoded once for all the tokens. Each token comes as
//! one or two int8 terms ([`Q8Tokens`]): one is llama.cpp's arithmetic, two are close to exact.
//!
//! The single-token dot ([`super::avx512`]'s `q8_rows`) lays a row's codes along the lanes. Here
//! a *panel* of 16 weight rows lies across the lanes instead: lane `r` of a code vector holds
//! four consecutive codes of row `r`, so one `vpdpbusd` against four activation codes
//! broadcast from memory adds four products to each of 16 rows at once, and eight of them sum a
//! whole group of 32 for 16 rows. The per-group float work (scale, offset) is then one vector
//! per 16 rows and token, not one per row and token: the reason this beats the f32 tiles,
//! whose every multiply-add is a float one.
//!
//! Every type is read as unsigned codes `u` with a scale `d` and an offset `o` per group, so
//! that `Σ w·x = d·dx·Σ u·q + o·(dx·Σ q)`: Q4_1 is `d·u + m` (`o = m`); Q4_0 is `d·(u − 8)`
//! (`o = −8d`); Q8_0's signed codes are stored as `u = q + 128` (`o = −128d`). The integer
//! sums are exact (at most 32 · 255 · 127 per group), so the result is the portable
//! [`super::q8::dot`] up to float rounding.
//!
//! A panel's codes and scales come by plain 16-byte loads, four rows per 128-bit lane, put in
//! order by a 4×4 word transpose within each lane. (Gathering the codes took 55% of an
//! 8-sequence decode step on the development machine; the loads and transposes about a
//! quarter of that.)
//!
//! The unsafe code is the AVX-512 module's: `#[target_feature]` calls justified by the
//! [`Avx512`] token, and loads through raw pointers, justified by [`Avx512::q8_panels`]'s
//! length checks.

use std::arch::x86_64::*;

use super::GgmlType;
use super::avx512::Avx512;
use super::q8::{Q8Row, Q8Tokens};

/// Weight rows per panel: one per 32-bit lane.
const LANES: usize = 16;

/// Tokens whose accumulators stay in registers at once.
const TOKENS: usize = 8;

/// One panel of up to 16 rows, decoded: per group, 8 vectors of codes (chunk `c` holds codes
/// `4c..4c + 4` of every row), the rows' scales and offsets.
struct Panel {
    codes: Vec<__m512i>,
    scale: Vec<__m512>,
    offset: Vec<__m512>,
}

impl Panel {
    /// Room for exactly `ng` groups (the kernels read the group count from `scale`).
    fn resize(&mut self, ng: usize) {
        self.codes.resize(8 * ng, _mm512_setzero_si512_const());
        self.scale.resize(ng, _mm512_setzero_ps_const());
        self.offset.resize(ng, _mm512_setzero_ps_const());
    }
}

thread_local! {
    /// Each thread's panel, kept from call to call: a fresh one per call (zeroed, 30 KiB for
    /// the default model's down projection) put `calloc` and `free` at 7% of a prefill.
    static PANEL: std::cell::RefCell<Panel> = const {
        std::cell::RefCell::new(Panel {
            codes: Vec::new(),
            scale: Vec::new(),
            offset: Vec::new(),
        })
    };
}

// `_mm512_setzero_*` need the target feature to be called; an all-zero bit pattern is the same
// value and needs none.
fn _mm512_setzero_si512_const() -> __m512i {
    // SAFETY: every bit pattern is a valid __m512i.
    unsafe { std::mem::zeroed() }
}

fn _mm512_setzero_ps_const() -> __m512 {
    // SAFETY: all zero bits are 16 × 0.0f32.
    unsafe { std::mem::zeroed() }
}

impl Avx512 {
    /// Whether [`Self::q8_panels`] takes weights of `ty`.
    pub(crate) fn has_panels(ty: GgmlType) -> bool {
        matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0 | GgmlType::MXFP4
        )
    }

    /// `outs[i][j] = row_j · xs.token(i)` for the `nrows` contiguous rows of `ty` (see
    /// [`Self::has_panels`]) in `rows`.
    ///
    /// # Panics
    /// If `ty` has no panel kernel, the rows are not `nrows` rows of the activations' groups,
    /// or an output is shorter than `nrows`.
    pub(crate) fn q8_panels(
        self,
        ty: GgmlType,
        rows: &[u8],
        nrows: usize,
        xs: &Q8Tokens,
        outs: &mut [&mut [f32]],
    ) {
        assert!(Self::has_panels(ty), "no int8 panel kernel for {ty}");
        assert_eq!(xs.tokens(), outs.len(), "one output per token");
        let ng = xs.blocks();
        let rb = ng * ty.block_bytes();
        assert_eq!(rows.len(), rb * nrows, "weight bytes");
        assert!(outs.iter().all(|o| o.len() >= nrows), "output length");
        PANEL.with_borrow_mut(|panel| {
            panel.resize(ng);
            for j0 in (0..nrows).step_by(LANES) {
                let n = LANES.min(nrows - j0);
                // SAFETY: `self` proves the features; rows j0..j0 + n hold ng blocks each (asserted
                // above).
                unsafe {
                    let at = rows.as_ptr().add(j0 * rb);
                    match ty {
                        GgmlType::Q4_0 => decode::<Q4_0>(at, rb, n, panel),
                        GgmlType::Q4_1 => decode::<Q4_1>(at, rb, n, panel),
                        GgmlType::MXFP4 => decode::<Mxfp4>(at, rb, n, panel),
                        _ => decode::<Q8_0>(at, rb, n, panel),
                    }
                }
                let mask: __mmask16 = ((1u32 << n) - 1) as u16;
                let mut i = 0;
                while i < outs.len() {
                    let t = [TOKENS, 4, 2, 1]
                        .into_iter()
                        .find(|&t| t <= outs.len() - i)
                        .unwrap_or(1);
                    let o = &mut outs[i..i + t];
                    // SAFETY: `self` proves the features; the panel holds ng groups, as does every
                    // term of tokens i..i + t; each output has lanes j0..j0 + n under `mask`.
                    unsafe {
                        match xs.terms() {
                            1 => panel.dots::<1>(xs.terms_of(i..i + t), o, j0, mask),
                            _ => panel.dots::<2>(xs.terms_of(i..i + t), o, j0, mask),
                        }
                    }
                    i += t;
                }
            }
        });
    }
}

impl Panel {
    /// [`dots`] for `outs.len()` (1, 2, 4 or [`TOKENS`]) tokens of `N` terms each.
    ///
    /// # Safety
    /// As [`dots`].
    #[inline(always)]
    unsafe fn dots<const N: usize>(
        &self,
        xs: &[Q8Row],
        outs: &mut [&mut [f32]],
        j0: usize,
        mask: __mmask16,
    ) {
        // SAFETY: forwarded.
        unsafe {
            match outs.len() {
                TOKENS => dots::<TOKENS, N>(self, xs, outs, j0, mask),
                4 => dots::<4, N>(self, xs, outs, j0, mask),
                2 => dots::<2, N>(self, xs, outs, j0, mask),
                _ => dots::<1, N>(self, xs, outs, j0, mask),
            }
        }
    }
}

/// The 16 rows of a panel: each one's block `g` is at `row[r] + g · BYTES` (rows past the
/// panel's end repeat its last row; their lanes are never stored).
type Rows = [*const u8; LANES];

/// A storage type as a panel reads it.
trait PanelGroup {
    /// Block bytes.
    const BYTES: usize;

    /// The rows' scales and offsets for group `g`, and its 8 code vectors into `codes`.
    ///
    /// # Safety
    /// AVX-512 as [`Avx512`]; block `g` of every row readable.
    unsafe fn group(rows: &Rows, g: usize, codes: &mut [__m512i]) -> (__m512, __m512);
}

/// The 16 bytes at `rows[r] + at` of every row, four rows per 128-bit lane: lane `L` of
/// vector `i` holds row `4L + i`.
///
/// # Safety
/// AVX-512; 16 bytes at `rows[r] + at` readable for every row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn lanes(rows: &Rows, at: usize) -> [__m512i; 4] {
    // SAFETY: forwarded.
    let ld = |r: usize| unsafe { _mm_loadu_si128(rows[r].add(at).cast()) };
    std::array::from_fn(|i| {
        let v = _mm512_castsi128_si512(ld(i));
        let v = _mm512_inserti32x4::<1>(v, ld(4 + i));
        let v = _mm512_inserti32x4::<2>(v, ld(8 + i));
        _mm512_inserti32x4::<3>(v, ld(12 + i))
    })
}

/// The first 32-bit word at `rows[r] + at` (a block's scales) of every row, in lane `r`: the
/// first column of [`words`]' transpose. (A gather of the same words cost 40% of a panel's
/// decoding, most of it waiting for the gather.)
///
/// # Safety
/// As [`words`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn header(rows: &Rows, at: usize) -> __m512i {
    // SAFETY: forwarded.
    let z = unsafe { lanes(rows, at) };
    _mm512_unpacklo_epi64(
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpacklo_epi32(z[2], z[3]),
    )
}

/// The 16 bytes at `rows[r] + at` of every row, transposed: vector `w` holds word `w` (bytes
/// `4w..4w + 4`) of row `r` in lane `r`. A 4×4 word transpose within each 128-bit lane of
/// [`lanes`] puts them in order.
///
/// # Safety
/// AVX-512; 16 bytes at `rows[r] + at` readable for every row.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn words(rows: &Rows, at: usize) -> [__m512i; 4] {
    // SAFETY: forwarded.
    let z = unsafe { lanes(rows, at) };
    let t0 = _mm512_unpacklo_epi32(z[0], z[1]);
    let t1 = _mm512_unpackhi_epi32(z[0], z[1]);
    let t2 = _mm512_unpacklo_epi32(z[2], z[3]);
    let t3 = _mm512_unpackhi_epi32(z[2], z[3]);
    [
        _mm512_unpacklo_epi64(t0, t2),
        _mm512_unpackhi_epi64(t0, t2),
        _mm512_unpacklo_epi64(t1, t3),
        _mm512_unpackhi_epi64(t1, t3),
    ]
}

/// The 16-bit halves of each lane of `v` (low or high) as f32, reading them as f16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
fn f16_lanes(v: __m512i, high: bool) -> __m512 {
    let v = if high { _mm512_srli_epi32(v, 16) } else { v };
    _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
}

/// A 4-bit block's 32 codes from its 16 code bytes at `at`: word `w`'s low nibbles are codes
/// `4w..4w + 4`, its high nibbles codes `16 + 4w..16 + 4w + 4`.
///
/// # Safety
/// As [`words`].
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[inline]
unsafe fn nibble_codes(rows: &Rows, at: usize, codes: &mut [__m512i]) {
    let m4 = _mm512_set1_epi8(0x0f);
    // SAFETY: forwarded.
    let w = unsafe { words(rows, at) };
    for (i, v) in w.into_iter().enumerate() {
        codes[i] = _mm512_and_si512(v, m4);
        codes[4 + i] = _mm512_and_si512(_mm512_srli_epi32(v, 4), m4);
    }
}

struct Q4_0;
struct Q4_1;
struct Q8_0;
struct Mxfp4;

impl PanelGroup for Q4_0 {
    const BYTES: usize = GgmlType::Q4_0.block_bytes();
    #[inline(always)]
    unsafe fn group(rows: &Rows, g: usize, codes: &mut [__m512i]) -> (__m512, __m512) {
        let at = g * Self::BYTES;
        // SAFETY: an 18-byte block per row at `at` (the caller's contract): the f16 scale (its
        // word also holds two code bytes), then 16 code bytes.
        unsafe {
            let d = f16_lanes(header(rows, at), false);
            nibble_codes(rows, at + 2, codes);
            (d, _mm512_mul_ps(d, _mm512_set1_ps(-8.0)))
        }
    }
}

impl PanelGroup for Q4_1 {
    const BYTES: usize = GgmlType::Q4_1.block_bytes();
    #[inline(always)]
    unsafe fn group(rows: &Rows, g: usize, codes: &mut [__m512i]) -> (__m512, __m512) {
        let at = g * Self::BYTES;
        // SAFETY: a 20-byte block per row at `at` (the caller's contract): f16 scale and
        // minimum, then 16 code bytes.
        unsafe {
            let dm = header(rows, at);
            nibble_codes(rows, at + 4, codes);
            (f16_lanes(dm, false), f16_lanes(dm, true))
        }
    }
}

impl PanelGroup for Q8_0 {
    const BYTES: usize = GgmlType::Q8_0.block_bytes();
    #[inline(always)]
    unsafe fn group(rows: &Rows, g: usize, codes: &mut [__m512i]) -> (__m512, __m512) {
        let at = g * Self::BYTES;
        // SAFETY: a 34-byte block per row at `at` (the caller's contract): the f16 scale, then
        // 32 signed codes.
        unsafe {
            let d = f16_lanes(header(rows, at), false);
            // Signed codes + 128 as unsigned bytes: flipping the top bit.
            let flip = _mm512_set1_epi8(-128);
            for half in 0..2 {
                let w = words(rows, at + 2 + 16 * half);
                for (i, v) in w.into_iter().enumerate() {
                    codes[4 * half + i] = _mm512_xor_si512(v, flip);
                }
            }
            (d, _mm512_mul_ps(d, _mm512_set1_ps(-128.0)))
        }
    }
}

impl PanelGroup for Mxfp4 {
    const BYTES: usize = GgmlType::MXFP4.block_bytes();
    #[inline(always)]
    unsafe fn group(rows: &Rows, g: usize, codes: &mut [__m512i]) -> (__m512, __m512) {
        let at = g * Self::BYTES;
        // SAFETY: a 17-byte block per row at `at` (the caller's contract): the exponent (its
        // word also holds three code bytes), then 16 code bytes.
        unsafe {
            let e = _mm512_and_si512(header(rows, at), _mm512_set1_epi32(0xff));
            // 2^(e − 128), subnormals included (vscalefps).
            let exp = _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(128)));
            let d = _mm512_scalef_ps(_mm512_set1_ps(1.0), exp);
            nibble_codes(rows, at + 1, codes);
            // Signed doubled values + 128 as unsigned bytes: flipping the top bit.
            let flip = _mm512_set1_epi8(-128);
            for c in codes.iter_mut().take(8) {
                *c = _mm512_xor_si512(super::avx512::mxfp4_lookup(*c), flip);
            }
            (d, _mm512_mul_ps(d, _mm512_set1_ps(-128.0)))
        }
    }
}

/// How far ahead in each of a panel's rows [`decode`] asks for the bytes it will read. The
/// 16 rows are 16 short runs through memory at once, which the hardware prefetcher follows
/// badly: 8 sequences of a 3B Q4_0 model decoded at 55 tok/s with the panels' decoding half of
/// the time, 66 with this hint (128 to 320 bytes measured alike; 512 and more as none).
const PREFETCH: usize = 256;

/// Decodes the `n` rows (of `rb` bytes) at `rows` into `panel`.
///
/// # Safety
/// AVX-512 as [`Avx512`]; `rows` holds `1 <= n <= 16` rows of the panel's groups of `G`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
unsafe fn decode<G: PanelGroup>(rows: *const u8, rb: usize, n: usize, panel: &mut Panel) {
    // SAFETY: rows 0..n exist; the padding lanes read row n - 1 again.
    let ptrs: Rows = std::array::from_fn(|r| unsafe { rows.add(r.min(n - 1) * rb) });
    for g in 0..panel.scale.len() {
        for p in &ptrs {
            // A hint (it never faults, past the rows too).
            _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(g * G::BYTES + PREFETCH).cast());
        }
        // SAFETY: block g of each row (g < the rows' groups).
        let (d, o) = unsafe { G::group(&ptrs, g, &mut panel.codes[8 * g..8 * g + 8]) };
        panel.scale[g] = d;
        panel.offset[g] = o;
    }
}

/// `outs[t][j0 + r] = Σ_g Σ_n d·dx_n·Σ u·q_n + o·Σ_n s_n` for the `T` tokens of `xs` (token
/// `t` is the `N` terms `xs[t·N..t·N + N]`) and the panel's rows in `mask`: per group, 8
/// `vpdpbusd` per token and term (its 4 codes broadcast), then one multiply-add per term, one
/// for the scale and one for the offset.
///
/// # Safety
/// AVX-512 as [`Avx512`]; `xs` holds `T·N` rows of the panel's groups; each output has the
/// lanes of `mask` at `j0`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")]
#[allow(clippy::needless_range_loop)] // index loops read clearest in a register-blocked kernel
unsafe fn dots<const T: usize, const N: usize>(
    panel: &Panel,
    xs: &[Q8Row],
    outs: &mut [&mut [f32]],
    j0: usize,
    mask: __mmask16,
) {
    let mut acc = [_mm512_setzero_ps(); T];
    let q: [[*const i32; N]; T] =
        std::array::from_fn(|t| std::array::from_fn(|n| xs[t * N + n].qs.as_ptr().cast()));
    for g in 0..panel.scale.len() {
        let mut sums = [[_mm512_setzero_si512(); N]; T];
        for c in 0..8 {
            let w = panel.codes[8 * g + c];
            for t in 0..T {
                for n in 0..N {
                    // SAFETY: the term's codes 32g + 4c..32g + 4c + 4 exist (g < its blocks).
                    let x = unsafe { q[t][n].add(8 * g + c).read_unaligned() };
                    sums[t][n] = _mm512_dpbusd_epi32(sums[t][n], w, _mm512_set1_epi32(x));
                }
            }
        }
        for t in 0..T {
            let x = &xs[t * N..t * N + N];
            let mut f = _mm512_mul_ps(_mm512_cvtepi32_ps(sums[t][0]), _mm512_set1_ps(x[0].d[g]));
            let mut s = x[0].s[g];
            for n in 1..N {
                let d = _mm512_set1_ps(x[n].d[g]);
                f = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[t][n]), d, f);
                s += x[n].s[g];
            }
            acc[t] = _mm512_fmadd_ps(f, panel.scale[g], acc[t]);
            acc[t] = _mm512_fmadd_ps(panel.offset[g], _mm512_set1_ps(s), acc[t]);
        }
    }
    for t in 0..T {
        // SAFETY: the lanes of `mask` are within outs[t] at j0 (the caller's contract).
        unsafe { _mm512_mask_storeu_ps(outs[t].as_mut_ptr().add(j0), mask, acc[t]) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::q8::{dot, tests::random_row};
    use crate::quant::{Isa, scalar};

    /// `Σ |w|·|x|`: the size float rounding of the sum is relative to.
    fn magnitude(ty: GgmlType, row: &[u8], x: &Q8Row) -> f32 {
        let mut w = vec![0f32; 32 * x.blocks()];
        scalar::dequantize(ty, row, &mut w);
        w.iter()
            .enumerate()
            .map(|(e, v)| v.abs() * x.d[e / 32] * f32::from(x.qs[e]).abs())
            .sum()
    }

    /// Every type, row counts around the panel width, token counts through each register
    /// block, one and two terms: the panels give the portable reference's sums up to float
    /// rounding.
    #[test]
    fn panels_match_the_portable_reference() {
        let Some(avx) = Avx512::detect() else {
            eprintln!("skipped: this CPU has no AVX-512 VNNI");
            return;
        };
        for k in [96, 576] {
            for ty in [
                GgmlType::Q4_0,
                GgmlType::Q4_1,
                GgmlType::Q8_0,
                GgmlType::MXFP4,
            ] {
                for nrows in [1, 15, 16, 17, 40] {
                    let rows: Vec<u8> = (0..nrows)
                        .flat_map(|j| random_row(ty, k, 5 + j as u32))
                        .collect();
                    for (m, terms) in [1, 2, 3, 5, 8, 13]
                        .into_iter()
                        .flat_map(|m| [(m, 1), (m, 2)])
                    {
                        let x: Vec<f32> = (0..m * k)
                            .map(|e| ((e * 37 + e / k * 101) % 199) as f32 / 99.0 - 1.0)
                            .collect();
                        let xs = Q8Tokens::new(Isa::Avx512, &x, k, terms);
                        let mut out = vec![vec![f32::NAN; nrows + 3]; m];
                        let mut views: Vec<&mut [f32]> =
                            out.iter_mut().map(Vec::as_mut_slice).collect();
                        avx.q8_panels(ty, &rows, nrows, &xs, &mut views);
                        let rb = ty.row_bytes(k).expect("whole blocks");
                        for (i, o) in out.iter().enumerate() {
                            let token = xs.terms_of(i..i + 1);
                            for (j, row) in rows.chunks_exact(rb).enumerate() {
                                let want: f32 = token.iter().map(|t| dot(ty, row, t)).sum();
                                let tol: f32 =
                                    token.iter().map(|t| 1e-5 * magnitude(ty, row, t)).sum();
                                assert!(
                                    (o[j] - want).abs() <= tol,
                                    "{ty} rows {nrows} tokens {m}×{terms}: [{i}][{j}] {} vs {want}",
                                    o[j]
                                );
                            }
                            assert!(o[nrows..].iter().all(|v| v.is_nan()), "wrote past nrows");
                        }
                    }
                }
            }
        }
    }

    /// Two terms stand for each activation within `max|x| / 64516` of its block (one term:
    /// within `max|x| / 254`), so the product is close to the exact one.
    #[test]
    fn two_terms_are_close_to_the_exact_activations() {
        let k = 256;
        let x: Vec<f32> = (0..k).map(|e| ((e as f32) * 0.731).sin() * 3.0).collect();
        for (terms, bound) in [(1, 254.0), (2, 64516.0)] {
            let xs = Q8Tokens::new(Isa::best(), &x, k, terms);
            let t = xs.terms_of(0..1);
            for (e, v) in x.iter().enumerate() {
                let b = e / 32;
                let back: f32 = t.iter().map(|r| r.d[b] * f32::from(r.qs[e])).sum();
                let amax = x[32 * b..32 * b + 32]
                    .iter()
                    .fold(0f32, |m, v| m.max(v.abs()));
                assert!(
                    (back - v).abs() <= amax / bound * 1.001 + 1e-7,
                    "{terms} terms: [{e}] {back} vs {v}"
                );
            }
        }
    }
}
