//! Block-quantized weights times several rows of activations in integers (prefill, batched
//! decode) with VNNI's `vpdpbusd`, each weight decoded once for all the tokens: at 512 bits
//! (AVX-512 VNNI, 16 rows a panel) or 256 (8 rows: AVX-VNNI, Intel's CPUs without AVX-512 since
//! Alder Lake; or AVX2 alone, `vpmaddubsw` and `vpmaddwd` standing for `vpdpbusd`), one kernel
//! written over the width's operations ([`Width`], `widths.rs`). Each token comes as one or two
//! int8 terms ([`Q8Tokens`]): one is llama.cpp's arithmetic, two are close to exact.
//!
//! The single-token dot ([`super::avx512`]'s `q8_rows`) lays a row's codes along the lanes. Here
//! a *panel* of weight rows (16 at 512 bits) lies across the lanes instead: lane `r` of a code
//! vector holds four consecutive codes of row `r`, so one `vpdpbusd` against four activation
//! codes broadcast from memory adds four products to each row at once, and eight of them sum a
//! whole group of 32 for every row. The per-group float work (scale, offset) is then one vector
//! per panel and token, not one per row and token: the reason this beats the f32 tiles, whose
//! every multiply-add is a float one.
//!
//! Every type is read as unsigned codes `u` with a scale `d` and an offset `o` per group, so
//! that `Σ w·x = d·dx·Σ u·q + o·(dx·Σ q)`: Q4_1 is `d·u + m` (`o = m`); Q4_0 is `d·(u − 8)`
//! (`o = −8d`); Q8_0's signed codes are stored as `u = q + 128` (`o = −128d`); Q4_K's and
//! Q5_K's groups are `d·sc·u − dmin·m` (`kquant.rs`: each super-block of 256 decoded whole,
//! its header once); Q6_K's `d·sc·(u − 32)` with a scale per run of 16, two a group, each run
//! with its scale and offset against the activations' sum over the run. The integer sums are
//! exact (at most 32 · 255 · 127 per group; AVX2's 16-bit pair sums only for codes up to 127,
//! which Q8_0's are not), so the result is the portable [`super::q8::dot`] up to float
//! rounding.
//!
//! A panel's codes and scales come by plain 16-byte loads, four rows per 128-bit lane, put in
//! order by a 4×4 word transpose within each lane (the same at both widths). (Gathering the
//! codes took 55% of an 8-sequence decode step on the development machine; the loads and
//! transposes about a quarter of that.)
//!
//! The unsafe code is the SIMD modules': `#[target_feature]` calls justified by the
//! [`Panels`] token (made from [`Avx512`]'s, [`AvxVnni`]'s or `Avx2`'s detection), and loads
//! through raw pointers, justified by [`Panels::run`]'s length checks.

use super::GgmlType;
use super::avx512::Avx512;
use super::q8::{Q8Row, Q8Tokens};
use std::arch::x86_64::*;

mod kquant;
mod widths;

pub(crate) use widths::AvxVnni;
use widths::{Madd, Vnni, Ymm, Zmm};

/// The most rows a panel has (one per 32-bit lane at 512 bits).
const MAX_LANES: usize = 16;

/// The panel kernel this CPU runs: its width's token (the types each takes: [`Panels::has`]).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Panels {
    /// 16 rows a panel (AVX-512 VNNI).
    Wide(Avx512),
    /// 8 rows a panel (AVX-VNNI).
    Vex(AvxVnni),
    /// 8 rows a panel, AVX2 alone (`vpmaddubsw`, `vpmaddwd`).
    Madd(#[allow(dead_code)] super::Avx2), // held as the proof of AVX2, as the others' tokens
}

impl Panels {
    /// The widest panels `simd`'s CPU runs.
    pub(crate) fn of(simd: super::Avx2) -> Self {
        simd.wide()
            .map(Self::Wide)
            .or_else(|| AvxVnni::detect().map(Self::Vex))
            .unwrap_or(Self::Madd(simd))
    }

    /// What the panels are, in a few words.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Wide(_) => "512 bits (AVX-512 VNNI)",
            Self::Vex(_) => "256 bits (AVX-VNNI)",
            Self::Madd(_) => "256 bits (AVX2 maddubs; Q8_0 in f32)",
        }
    }

    /// Whether [`Self::run`] takes weights of `ty`: at every width the types whose codes are
    /// at most 63 (exact in AVX2's 16-bit pair sums); Q8_0's (shifted to 0..255) with VNNI;
    /// MXFP4, whose scales need `vscalefps`, at 512 bits.
    pub(crate) fn has(self, ty: GgmlType) -> bool {
        use GgmlType::*;
        let small = matches!(ty, Q4_0 | Q4_1 | Q4_K | Q5_K | Q6_K);
        match self {
            Self::Wide(_) => small || matches!(ty, Q8_0 | MXFP4),
            Self::Vex(_) => small || ty == Q8_0,
            Self::Madd(_) => small,
        }
    }

    /// `outs[i][j] = row_j · xs.token(i)` for the `nrows` contiguous rows of `ty` (see
    /// [`Self::has`]) in `rows`.
    ///
    /// # Panics
    /// If `ty` has no panel kernel, the rows are not `nrows` rows of the activations' groups,
    /// or an output is shorter than `nrows`.
    pub(crate) fn run(
        self,
        ty: GgmlType,
        rows: &[u8],
        nrows: usize,
        xs: &Q8Tokens,
        outs: &mut [&mut [f32]],
    ) {
        assert!(self.has(ty), "no int8 panel kernel for {ty}");
        assert_eq!(xs.tokens(), outs.len(), "one output per token");
        let rb = ty.row_bytes(32 * xs.blocks()).expect("whole blocks");
        assert_eq!(rows.len(), rb * nrows, "weight bytes");
        assert!(outs.iter().all(|o| o.len() >= nrows), "output length");
        // SAFETY: the token proves the width's features; the lengths are checked above.
        unsafe {
            match self {
                Self::Wide(_) => run::<Zmm>(ty, rows, rb, nrows, xs, outs),
                Self::Vex(_) => run::<Ymm<Vnni>>(ty, rows, rb, nrows, xs, outs),
                Self::Madd(_) => run::<Ymm<Madd>>(ty, rows, rb, nrows, xs, outs),
            }
        }
    }
}

/// The vector operations the kernel is written in, at one width (`widths.rs`).
///
/// # Safety
/// Every `unsafe fn` needs the width's target features: they are called only from the width's
/// `#[target_feature]` entry points ([`Width::decode`], [`Width::dots`]), made callable by its
/// token. Loads need the bytes they read.
trait Width: Sized {
    /// Weight rows a panel holds: one per 32-bit lane.
    const LANES: usize;
    /// The most tokens whose accumulators stay in registers at once (their integer sums for
    /// two terms, and their float sums): 8 in AVX-512's 32 registers, 4 in AVX2's 16 (8 spilled
    /// to the stack and ran no faster than the f32 tiles).
    const TOKENS: usize;
    /// A vector of integers.
    type I: Copy;
    /// A vector of f32.
    type F: Copy;
    /// Runs `f` on this thread's panel, kept from call to call (a fresh one per call, zeroed,
    /// put `calloc` and `free` at 7% of a prefill).
    fn with_panel<R>(f: impl FnOnce(&mut Panel<Self>) -> R) -> R;
    /// [`decode`] of `ty`, compiled with the width's features.
    unsafe fn decode(ty: GgmlType, rows: *const u8, rb: usize, n: usize, p: &mut Panel<Self>);
    /// [`dots`], compiled with the width's features.
    unsafe fn dots<const T: usize, const N: usize, const R: usize>(
        p: &Panel<Self>,
        xs: &[Q8Row],
        halves: &[Vec<f32>],
        outs: &mut [&mut [f32]],
        j0: usize,
        n: usize,
    );
    /// The 16 bytes at `rows[r] + at` of every row, four rows per 128-bit lane: lane `L` of
    /// vector `i` holds row `4L + i`.
    unsafe fn lanes(rows: &Rows, at: usize) -> [Self::I; 4];
    /// The low and high interleavings of 32-bit words within each 128-bit lane.
    unsafe fn unpack32(a: Self::I, b: Self::I) -> [Self::I; 2];
    /// The low and high interleavings of 64-bit words within each 128-bit lane.
    unsafe fn unpack64(a: Self::I, b: Self::I) -> [Self::I; 2];
    /// The 16-bit halves of each lane of `v` (low or high) as f32, reading them as f16.
    unsafe fn f16_lanes(v: Self::I, high: bool) -> Self::F;
    /// Each byte's low nibble (after a 4-bit shift of each lane, if `shift4`).
    unsafe fn low_nibbles(v: Self::I, shift4: bool) -> Self::I;
    /// Each byte's top bit flipped: signed codes read as unsigned ones + 128.
    unsafe fn flip(v: Self::I) -> Self::I;
    /// Bitwise and, or; each 32-bit lane shifted right or left by `n`; a lane repeated.
    unsafe fn and(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn shr(v: Self::I, n: u32) -> Self::I;
    unsafe fn shl(v: Self::I, n: u32) -> Self::I;
    /// Each 32-bit lane shifted right by `n`, its sign repeated.
    unsafe fn sra(v: Self::I, n: u32) -> Self::I;
    unsafe fn splat_i(v: u32) -> Self::I;
    /// `vpdpbusd`: each lane adds its 4 unsigned bytes of `w` times the 4 signed bytes of `x`.
    unsafe fn dpbusd(acc: Self::I, w: Self::I, x: i32) -> Self::I;
    unsafe fn zero_i() -> Self::I;
    unsafe fn zero() -> Self::F;
    unsafe fn splat(v: f32) -> Self::F;
    unsafe fn to_f32(v: Self::I) -> Self::F;
    unsafe fn mul(a: Self::F, b: Self::F) -> Self::F;
    unsafe fn fmadd(a: Self::F, b: Self::F, c: Self::F) -> Self::F;
    /// Lanes `0..n` of `v` to `out`.
    unsafe fn store(out: *mut f32, n: usize, v: Self::F);
}

/// One panel's rows, decoded: per group, 8 vectors of codes (chunk `c` holds codes
/// `4c..4c + 4` of every row), the rows' scales and offsets (per run: [`runs`] a group).
struct Panel<W: Width> {
    codes: Vec<W::I>,
    scale: Vec<W::F>,
    offset: Vec<W::F>,
}

impl<W: Width> Panel<W> {
    const fn new() -> Self {
        Self {
            codes: Vec::new(),
            scale: Vec::new(),
            offset: Vec::new(),
        }
    }

    /// Room for exactly `ng` groups of `runs` runs (the kernels read the group count from
    /// `codes`).
    fn resize(&mut self, ng: usize, runs: usize) {
        // SAFETY: all-zero bits are a valid vector of integers and of 0.0f32 (the width's
        // zeroing intrinsics would need its target features).
        let (zi, zf) = unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
        self.codes.resize(8 * ng, zi);
        self.scale.resize(runs * ng, zf);
        self.offset.resize(runs * ng, zf);
    }

    /// The groups of 32 it holds.
    fn groups(&self) -> usize {
        self.codes.len() / 8
    }

    /// The runs of each group, as [`Panel::resize`] was told ([`runs`] of the type).
    fn runs(&self) -> usize {
        self.scale.len() / self.groups().max(1)
    }
}

/// [`Panels::run`] at width `W`.
///
/// # Safety
/// The CPU has `W`'s features; the lengths are as [`Panels::run`] checks them.
unsafe fn run<W: Width>(
    ty: GgmlType,
    rows: &[u8],
    rb: usize,
    nrows: usize,
    xs: &Q8Tokens,
    outs: &mut [&mut [f32]],
) {
    let runs = runs(ty);
    // Q6_K's offsets multiply each run's activation sum: `d · Σ q` per 16, per term.
    let halves: Vec<Vec<f32>> = match runs {
        1 => Vec::new(),
        _ => xs.terms_of(0..xs.tokens()).iter().map(half_sums).collect(),
    };
    W::with_panel(|panel| {
        panel.resize(xs.blocks(), runs);
        for j0 in (0..nrows).step_by(W::LANES) {
            let n = W::LANES.min(nrows - j0);
            // SAFETY: the caller's features; rows j0..j0 + n hold the groups (its lengths).
            unsafe { W::decode(ty, rows.as_ptr().add(j0 * rb), rb, n, panel) };
            let mut i = 0;
            while i < outs.len() {
                // Two runs a group take twice the integer sums: half the tokens fit.
                let t = [8, 4, 2, 1]
                    .into_iter()
                    .find(|&t| t * runs <= W::TOKENS && t <= outs.len() - i)
                    .unwrap_or(1);
                let terms = xs.terms();
                let x = xs.terms_of(i..i + t);
                let h = halves.get(i * terms..(i + t) * terms).unwrap_or(&[]);
                let o = &mut outs[i..i + t];
                // SAFETY: the caller's features; the panel holds the groups every term of
                // tokens i..i + t has (and `h` their runs' sums, with two runs); each output
                // has lanes j0..j0 + n.
                unsafe {
                    match runs {
                        1 => dots_of::<W, 1>(t, terms, panel, x, h, o, j0, n),
                        _ => dots_of::<W, 2>(t, terms, panel, x, h, o, j0, n),
                    }
                }
                i += t;
            }
        }
    });
}

/// Runs (scales) per group of 32 of `ty`'s panels: Q6_K has a scale per 16 weights.
fn runs(ty: GgmlType) -> usize {
    if ty == GgmlType::Q6_K { 2 } else { 1 }
}

/// `d · Σ q` over each half of each block of `x`.
fn half_sums(x: &Q8Row) -> Vec<f32> {
    let sum = |c: &[i8]| c.iter().map(|&q| i32::from(q)).sum::<i32>() as f32;
    x.qs.chunks_exact(16)
        .enumerate()
        .map(|(h, c)| x.d[h / 2] * sum(c))
        .collect()
}

/// [`Width::dots`] for `t` tokens of `terms` terms each, `R` runs a group.
///
/// # Safety
/// As [`dots`].
#[allow(clippy::too_many_arguments)] // the kernel's inputs, passed through
unsafe fn dots_of<W: Width, const R: usize>(
    t: usize,
    terms: usize,
    panel: &Panel<W>,
    x: &[Q8Row],
    h: &[Vec<f32>],
    o: &mut [&mut [f32]],
    j0: usize,
    n: usize,
) {
    // SAFETY: forwarded.
    unsafe {
        match (t, terms) {
            (8, 1) => W::dots::<8, 1, R>(panel, x, h, o, j0, n),
            (8, _) => W::dots::<8, 2, R>(panel, x, h, o, j0, n),
            (4, 1) => W::dots::<4, 1, R>(panel, x, h, o, j0, n),
            (4, _) => W::dots::<4, 2, R>(panel, x, h, o, j0, n),
            (2, 1) => W::dots::<2, 1, R>(panel, x, h, o, j0, n),
            (2, _) => W::dots::<2, 2, R>(panel, x, h, o, j0, n),
            (_, 1) => W::dots::<1, 1, R>(panel, x, h, o, j0, n),
            _ => W::dots::<1, 2, R>(panel, x, h, o, j0, n),
        }
    }
}

/// A panel's rows: each one's block `g` is at `row[r] + g · BYTES` (rows past the panel's end
/// repeat its last row; their lanes are never stored). Sized for the widest panel.
type Rows = [*const u8; MAX_LANES];

/// A storage type as a panel of width `W` reads it: blocks of [`PanelGroup::GROUPS`] groups of
/// 32 (one, or the K-quants' eight under one header).
trait PanelGroup<W: Width> {
    /// Bytes per block.
    const BYTES: usize;
    /// Groups of 32 per block.
    const GROUPS: usize = 1;

    /// The rows' block `blk`, its groups into `out`.
    ///
    /// # Safety
    /// `W`'s features; block `blk` of every row readable; room in `out` for the block's groups.
    unsafe fn block(rows: &Rows, blk: usize, out: Groups<'_, W>);
}

/// Where [`PanelGroup::block`] puts a block's groups: group `s`'s 8 code vectors into
/// `codes[8s..8s + 8]`, its runs' scales and offsets (one or, Q6_K's, two a group: [`runs`])
/// into `scale[runs·s..]` and `offset[runs·s..]`.
struct Groups<'a, W: Width> {
    codes: &'a mut [W::I],
    scale: &'a mut [W::F],
    offset: &'a mut [W::F],
}

/// The first 32-bit word at `rows[r] + at` (a block's scales) of every row, in lane `r`: the
/// first column of [`words`]' transpose. (A gather of the same words cost 40% of a panel's
/// decoding, most of it waiting for the gather.)
///
/// # Safety
/// As [`words`].
#[inline(always)]
unsafe fn header<W: Width>(rows: &Rows, at: usize) -> W::I {
    // SAFETY: forwarded.
    unsafe {
        let z = W::lanes(rows, at);
        let (a, b) = (W::unpack32(z[0], z[1])[0], W::unpack32(z[2], z[3])[0]);
        W::unpack64(a, b)[0]
    }
}

/// The 16 bytes at `rows[r] + at` of every row, transposed: vector `w` holds word `w` (bytes
/// `4w..4w + 4`) of row `r` in lane `r`. A 4×4 word transpose within each 128-bit lane of
/// [`Width::lanes`] puts them in order.
///
/// # Safety
/// `W`'s features; 16 bytes at `rows[r] + at` readable for every row.
#[inline(always)]
unsafe fn words<W: Width>(rows: &Rows, at: usize) -> [W::I; 4] {
    // SAFETY: forwarded.
    unsafe {
        let z = W::lanes(rows, at);
        let [t0, t1] = W::unpack32(z[0], z[1]);
        let [t2, t3] = W::unpack32(z[2], z[3]);
        let [w0, w1] = W::unpack64(t0, t2);
        let [w2, w3] = W::unpack64(t1, t3);
        [w0, w1, w2, w3]
    }
}

/// A 4-bit block's 32 codes from its 16 code bytes at `at`: word `w`'s low nibbles are codes
/// `4w..4w + 4`, its high nibbles codes `16 + 4w..16 + 4w + 4`.
///
/// # Safety
/// As [`words`].
#[inline(always)]
unsafe fn nibble_codes<W: Width>(rows: &Rows, at: usize, codes: &mut [W::I]) {
    // SAFETY: forwarded.
    unsafe {
        for (i, v) in words::<W>(rows, at).into_iter().enumerate() {
            codes[i] = W::low_nibbles(v, false);
            codes[4 + i] = W::low_nibbles(v, true);
        }
    }
}

struct Q4_0;
struct Q4_1;
struct Q8_0;
struct Mxfp4;

impl<W: Width> PanelGroup<W> for Q4_0 {
    const BYTES: usize = GgmlType::Q4_0.block_bytes();
    #[inline(always)]
    unsafe fn block(rows: &Rows, blk: usize, out: Groups<'_, W>) {
        let at = blk * <Self as PanelGroup<W>>::BYTES;
        // SAFETY: an 18-byte block per row at `at` (the caller's contract): the f16 scale (its
        // word also holds two code bytes), then 16 code bytes.
        unsafe {
            let d = W::f16_lanes(header::<W>(rows, at), false);
            nibble_codes::<W>(rows, at + 2, out.codes);
            (out.scale[0], out.offset[0]) = (d, W::mul(d, W::splat(-8.0)));
        }
    }
}

impl<W: Width> PanelGroup<W> for Q4_1 {
    const BYTES: usize = GgmlType::Q4_1.block_bytes();
    #[inline(always)]
    unsafe fn block(rows: &Rows, blk: usize, out: Groups<'_, W>) {
        let at = blk * <Self as PanelGroup<W>>::BYTES;
        // SAFETY: a 20-byte block per row at `at` (the caller's contract): f16 scale and
        // minimum, then 16 code bytes.
        unsafe {
            let dm = header::<W>(rows, at);
            nibble_codes::<W>(rows, at + 4, out.codes);
            (out.scale[0], out.offset[0]) = (W::f16_lanes(dm, false), W::f16_lanes(dm, true));
        }
    }
}

impl<W: Width> PanelGroup<W> for Q8_0 {
    const BYTES: usize = GgmlType::Q8_0.block_bytes();
    #[inline(always)]
    unsafe fn block(rows: &Rows, blk: usize, out: Groups<'_, W>) {
        let at = blk * <Self as PanelGroup<W>>::BYTES;
        // SAFETY: a 34-byte block per row at `at` (the caller's contract): the f16 scale, then
        // 32 signed codes.
        unsafe {
            let d = W::f16_lanes(header::<W>(rows, at), false);
            for half in 0..2 {
                let w = words::<W>(rows, at + 2 + 16 * half);
                for (i, v) in w.into_iter().enumerate() {
                    out.codes[4 * half + i] = W::flip(v);
                }
            }
            (out.scale[0], out.offset[0]) = (d, W::mul(d, W::splat(-128.0)));
        }
    }
}

impl PanelGroup<Zmm> for Mxfp4 {
    const BYTES: usize = GgmlType::MXFP4.block_bytes();
    #[inline(always)]
    unsafe fn block(rows: &Rows, blk: usize, out: Groups<'_, Zmm>) {
        let at = blk * Self::BYTES;
        // SAFETY: a 17-byte block per row at `at` (the caller's contract): the exponent (its
        // word also holds three code bytes), then 16 code bytes; AVX-512 (the caller's).
        unsafe {
            let e = _mm512_and_si512(header::<Zmm>(rows, at), _mm512_set1_epi32(0xff));
            // 2^(e − 128), subnormals included (vscalefps).
            let exp = _mm512_cvtepi32_ps(_mm512_sub_epi32(e, _mm512_set1_epi32(128)));
            let d = _mm512_scalef_ps(_mm512_set1_ps(1.0), exp);
            nibble_codes::<Zmm>(rows, at + 1, out.codes);
            // Signed doubled values + 128 as unsigned bytes: flipping the top bit.
            for c in out.codes.iter_mut().take(8) {
                *c = Zmm::flip(super::avx512::mxfp4_lookup(*c));
            }
            (out.scale[0], out.offset[0]) = (d, _mm512_mul_ps(d, _mm512_set1_ps(-128.0)));
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
/// `W`'s features; `rows` holds `1 <= n <= W::LANES` rows of the panel's groups of `G`.
#[inline(always)]
unsafe fn decode<W: Width, G: PanelGroup<W>>(
    rows: *const u8,
    rb: usize,
    n: usize,
    panel: &mut Panel<W>,
) {
    // SAFETY: rows 0..n exist; the padding lanes read row n - 1 again.
    let ptrs: Rows = std::array::from_fn(|r| unsafe { rows.add(r.min(n - 1) * rb) });
    let (groups, runs) = (G::GROUPS, panel.runs());
    for blk in 0..panel.groups() / groups {
        for p in &ptrs[..W::LANES] {
            for line in (0..G::BYTES).step_by(64) {
                // A hint (it never faults, past the rows too).
                // SAFETY: SSE, part of x86-64.
                unsafe {
                    let ahead = p.wrapping_add(blk * G::BYTES + line + PREFETCH);
                    _mm_prefetch::<_MM_HINT_T0>(ahead.cast());
                }
            }
        }
        let g = blk * groups;
        // SAFETY: block blk of each row (its groups are < the rows' groups); room for them.
        unsafe {
            let out = Groups {
                codes: &mut panel.codes[8 * g..8 * (g + groups)],
                scale: &mut panel.scale[runs * g..runs * (g + groups)],
                offset: &mut panel.offset[runs * g..runs * (g + groups)],
            };
            G::block(&ptrs, blk, out)
        };
    }
}

/// `outs[t][j0 + r] = Σ_g Σ_n d·dx_n·Σ u·q_n + o·Σ_n s_n` for the `T` tokens of `xs` (token
/// `t` is the `N` terms `xs[t·N..t·N + N]`) and the panel's rows `r < lanes`: per group, 8
/// `vpdpbusd` per token and term (its 4 codes broadcast), then per run (`R` a group, of
/// `8 / R` chunks) one multiply-add per term, one for the scale and one for the offset, whose
/// activation sums `s_n` are the blocks' (`R = 1`) or `halves[t·N + n]`'s (`R = 2`).
///
/// # Safety
/// `W`'s features; `xs` holds `T·N` rows of the panel's groups (and `halves` their runs' sums
/// if `R = 2`); each output has `lanes` lanes at `j0`.
#[inline(always)]
#[allow(clippy::needless_range_loop)] // index loops read clearest in a register-blocked kernel
unsafe fn dots<W: Width, const T: usize, const N: usize, const R: usize>(
    panel: &Panel<W>,
    xs: &[Q8Row],
    halves: &[Vec<f32>],
    outs: &mut [&mut [f32]],
    j0: usize,
    lanes: usize,
) {
    // SAFETY: the caller's features and lengths, as each step says.
    unsafe {
        let mut acc = [W::zero(); T];
        let q: [[*const i32; N]; T] =
            std::array::from_fn(|t| std::array::from_fn(|n| xs[t * N + n].qs.as_ptr().cast()));
        for g in 0..panel.groups() {
            let mut sums = [[[W::zero_i(); R]; N]; T];
            for c in 0..8 {
                let w = panel.codes[8 * g + c];
                for t in 0..T {
                    for n in 0..N {
                        // The term's codes 32g + 4c..32g + 4c + 4 exist (g < its blocks).
                        let x = q[t][n].add(8 * g + c).read_unaligned();
                        let r = c * R / 8;
                        sums[t][n][r] = W::dpbusd(sums[t][n][r], w, x);
                    }
                }
            }
            for t in 0..T {
                let x = &xs[t * N..t * N + N];
                let sum = |n: usize, r: usize| match R {
                    1 => x[n].s[g],
                    _ => halves[t * N + n][R * g + r],
                };
                for r in 0..R {
                    let mut f = W::mul(W::to_f32(sums[t][0][r]), W::splat(x[0].d[g]));
                    let mut s = sum(0, r);
                    for n in 1..N {
                        f = W::fmadd(W::to_f32(sums[t][n][r]), W::splat(x[n].d[g]), f);
                        s += sum(n, r);
                    }
                    acc[t] = W::fmadd(f, panel.scale[R * g + r], acc[t]);
                    acc[t] = W::fmadd(panel.offset[R * g + r], W::splat(s), acc[t]);
                }
            }
        }
        for t in 0..T {
            // Lanes 0..lanes are within outs[t] at j0 (the caller's contract).
            W::store(outs[t].as_mut_ptr().add(j0), lanes, acc[t]);
        }
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
        let widths: Vec<Panels> = [
            Avx512::detect().map(Panels::Wide),
            AvxVnni::detect().map(Panels::Vex),
            super::super::Avx2::detect().map(Panels::Madd),
        ]
        .into_iter()
        .flatten()
        .collect();
        if widths.is_empty() {
            eprintln!("skipped: this CPU has neither AVX-512 VNNI nor AVX-VNNI");
        }
        for panels in widths {
            check_panels(panels);
        }
    }

    /// [`panels_match_the_portable_reference`] at one width.
    fn check_panels(panels: Panels) {
        for ty in GgmlType::ALL.into_iter().filter(|&t| panels.has(t)) {
            // 3 and 18 groups of 32, or 1 and 3 of the K-quants' super-blocks of 256.
            let ks = if ty.block_elems() == 256 {
                [256, 768]
            } else {
                [96, 576]
            };
            for k in ks {
                // Around both widths (8 and 16 rows a panel).
                for nrows in [1, 7, 8, 9, 15, 16, 17, 40] {
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
                        panels.run(ty, &rows, nrows, &xs, &mut views);
                        let rb = ty.row_bytes(k).expect("whole blocks");
                        for (i, o) in out.iter().enumerate() {
                            let token = xs.terms_of(i..i + 1);
                            for (j, row) in rows.chunks_exact(rb).enumerate() {
                                let want: f32 = token.iter().map(|t| dot(ty, row, t)).sum();
                                let tol: f32 =
                                    token.iter().map(|t| 1e-5 * magnitude(ty, row, t)).sum();
                                assert!(
                                    (o[j] - want).abs() <= tol,
                                    "{panels:?} {ty} rows {nrows} tokens {m}×{terms}: [{i}][{j}] {} vs {want}",
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
