//! AVX2 + FMA + F16C kernels for `y = row · x` over stored weight rows.
//!
//! - One activation row (`m == 1`, decode): each weight group of 32 is decoded in registers
//!   and multiplied straight into the accumulators ([`groups::Group::dot1`]); Q4_1 and Q8_0
//!   have hand-tuned versions.
//! - A few rows (`m` = 2..4): the same, each decoded group feeding all `m` rows
//!   ([`dot_rows_m`]).
//! - More rows: a tile of 4 weight rows is decoded once into an L1-resident f32 buffer, then a
//!   4×2 register-blocked microkernel ([`tile`]) runs it against every pair of activation rows,
//!   so decode cost is shared by all `m` rows and the inner loop is pure FMA (F32 weights are
//!   read in place, from `m = 2`).
//!
//! The unsafe code is of two kinds: calling `#[target_feature]` functions, justified by the
//! [`Avx2`] token (only constructible after runtime detection), and unaligned loads through raw
//! pointers, justified by the length assertions in [`Avx2::rows`].

use std::arch::x86_64::*;
use std::sync::atomic::{AtomicU8, Ordering};

use super::GgmlType;
use super::avx512::{Avx512, TILE_W};
use super::scalar;

mod groups;
mod kquant;
mod q8;

use groups::Group;

/// Proof that the running CPU supports AVX2, FMA and F16C; with `wide`, AVX-512 too, which
/// the kernels that have a version for it then use.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Avx2 {
    wide: Option<Avx512>,
}

static DETECTED: AtomicU8 = AtomicU8::new(0); // 0 unknown, 1 absent, 2 present

impl Avx2 {
    /// The token, if the CPU has the features (detected once, then cached).
    #[inline]
    pub(crate) fn detect() -> Option<Self> {
        let mut s = DETECTED.load(Ordering::Relaxed);
        if s == 0 {
            let ok = super::Isa::cap() >= super::Isa::Avx2
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c");
            s = if ok { 2 } else { 1 };
            DETECTED.store(s, Ordering::Relaxed);
        }
        (s == 2).then_some(Self { wide: None })
    }

    /// The token with AVX-512, if the CPU has both.
    #[inline]
    pub(crate) fn with_avx512() -> Option<Self> {
        let wide = Avx512::detect()?;
        Some(Self { wide: Some(wide) })
    }

    /// The AVX-512 token this one carries, if any.
    pub(crate) fn wide(self) -> Option<Avx512> {
        self.wide
    }

    /// For each `j in 0..nrows` and `i in 0..m`: `outs[i][j] = row_j · x[i*k..(i+1)*k]`, where
    /// `rows` holds `nrows` contiguous rows of `k` elements of type `ty` and `m = outs.len()`.
    ///
    /// # Panics
    /// If the slice lengths do not match `ty`, `k`, `nrows` and `m`.
    pub(crate) fn rows(
        self,
        ty: GgmlType,
        k: usize,
        rows: &[u8],
        nrows: usize,
        x: &[f32],
        outs: &mut [&mut [f32]],
    ) {
        let be = ty.block_elems();
        assert!(
            k.is_multiple_of(be),
            "row length not a whole number of blocks"
        );
        let rb = k / be * ty.block_bytes();
        assert_eq!(rows.len(), rb * nrows, "weight bytes");
        assert_eq!(x.len(), outs.len() * k, "activation length");
        for o in outs.iter_mut() {
            assert!(o.len() >= nrows, "output length");
            if k == 0 {
                o[..nrows].fill(0.0);
            }
        }
        if k == 0 {
            return;
        }
        let a = Args {
            ty,
            k,
            rb,
            rows,
            nrows,
            x,
        };
        match ty {
            GgmlType::F32 => self.run::<groups::F32>(&a, outs),
            GgmlType::F16 => self.run::<groups::F16>(&a, outs),
            GgmlType::BF16 => self.run::<groups::BF16>(&a, outs),
            GgmlType::Q8_0 => self.run::<groups::Q8_0>(&a, outs),
            GgmlType::Q4_0 => self.run::<groups::Q4_0>(&a, outs),
            GgmlType::Q4_1 => self.run::<groups::Q4_1>(&a, outs),
            GgmlType::Q4_K => self.run::<kquant::Q4K>(&a, outs),
            GgmlType::Q5_K => self.run::<kquant::Q5K>(&a, outs),
            GgmlType::Q6_K => self.run::<kquant::Q6K>(&a, outs),
            GgmlType::MXFP4 => self.run::<groups::Mxfp4>(&a, outs),
        }
    }

    #[inline(always)]
    fn run<G: Group>(self, a: &Args<'_>, outs: &mut [&mut [f32]]) {
        // F32 needs no decoding, so its tiles read the rows in place and win from m = 2.
        let direct = a.ty == GgmlType::F32;
        match outs.len() {
            0 => {}
            1 => match self.wide.filter(|_| Avx512::has(a.ty)) {
                Some(wide) => single_wide(wide, a, outs[0]),
                None => self.single::<G>(a, outs[0]),
            },
            2 if !direct => self.fused::<G, 2>(a, outs),
            3 if !direct => self.fused::<G, 3>(a, outs),
            4 if !direct => self.fused::<G, 4>(a, outs),
            _ => self.tiled::<G>(a, outs),
        }
    }

    /// One activation row: fused decode + dot per weight row.
    #[inline(always)]
    fn single<G: Group>(self, a: &Args<'_>, out: &mut [f32]) {
        let (k, x) = (a.k, a.x);
        let ng = k / 32;
        let xsum: Vec<f32> = if G::NEEDS_XSUM {
            x.chunks_exact(32).map(|c| c.iter().sum()).collect()
        } else {
            Vec::new()
        };
        let tail = k % 32; // only float types have one
        for (j, o) in out[..a.nrows].iter_mut().enumerate() {
            let row = &a.rows[j * a.rb..(j + 1) * a.rb];
            // SAFETY: `self` proves AVX2/FMA/F16C. `row` holds k/32 = ng whole groups (asserted
            // in `rows`), `x` has k >= 32ng f32s and `xsum` ng sums when G needs them.
            let mut y = unsafe { G::dot1(row.as_ptr(), x.as_ptr(), xsum.as_ptr(), ng) };
            if tail != 0 {
                let mut w = [0f32; 32];
                let es = a.ty.block_bytes();
                scalar::dequantize(a.ty, &row[(k - tail) * es..], &mut w[..tail]);
                y += w[..tail]
                    .iter()
                    .zip(&x[k - tail..])
                    .map(|(p, q)| p * q)
                    .sum::<f32>();
            }
            *o = y;
        }
    }

    /// A few activation rows: decode each weight group once, in registers, for all of them.
    #[inline(always)]
    fn fused<G: Group, const M: usize>(self, a: &Args<'_>, outs: &mut [&mut [f32]]) {
        let k = a.k;
        let ng = k / 32;
        let tail = k % 32; // only float types have one
        for j in 0..a.nrows {
            let row = &a.rows[j * a.rb..(j + 1) * a.rb];
            // SAFETY: `self` proves AVX2/FMA/F16C; `row` holds ng whole groups and `x` holds
            // M = outs.len() rows of k >= 32ng f32s (asserted in `rows`).
            let y = unsafe { dot_rows_m::<G, M>(row.as_ptr(), a.x.as_ptr(), k, ng) };
            for (i, o) in outs.iter_mut().enumerate() {
                o[j] = y[i];
            }
            if tail != 0 {
                let mut w = [0f32; 32];
                let es = a.ty.block_bytes();
                scalar::dequantize(a.ty, &row[(k - tail) * es..], &mut w[..tail]);
                for (i, o) in outs.iter_mut().enumerate() {
                    let xs = &a.x[(i + 1) * k - tail..(i + 1) * k];
                    o[j] += w[..tail].iter().zip(xs).map(|(p, q)| p * q).sum::<f32>();
                }
            }
        }
    }

    /// Several activation rows: decode 4 weight rows to f32 once, then 4×2 microkernel tiles.
    #[inline(always)]
    fn tiled<G: Group>(self, a: &Args<'_>, outs: &mut [&mut [f32]]) {
        let k = a.k;
        let direct = a.ty == GgmlType::F32; // already f32: read in place
        let mut buf = if direct {
            Vec::new()
        } else {
            vec![0f32; TILE_W * k]
        };
        let m = outs.len();
        let mut j0 = 0;
        while j0 < a.nrows {
            let tw = TILE_W.min(a.nrows - j0);
            let tile_rows = &a.rows[j0 * a.rb..(j0 + tw) * a.rb];
            if !direct {
                let wide = self.wide.filter(|_| Avx512::has(a.ty));
                for (row, dst) in tile_rows.chunks_exact(a.rb).zip(buf.chunks_exact_mut(k)) {
                    match wide {
                        Some(w) => w.decode_row(a.ty, row, dst),
                        // SAFETY: AVX2 proven by `self`; `row` holds k elements of `ty`.
                        None => unsafe { decode_row::<G>(a.ty, row, dst) },
                    }
                }
            }
            // Row pointers, taken after all writes; padding rows repeat the last real row
            // (computed and discarded).
            let src: *const f32 = if direct {
                tile_rows.as_ptr().cast()
            } else {
                buf.as_ptr()
            };
            // SAFETY: min(t, tw - 1) < tw rows of k f32s (F32 rows are exactly 4k bytes).
            let ptrs: [*const f32; TILE_W] =
                std::array::from_fn(|t| unsafe { src.add(t.min(tw - 1) * k) });
            if let Some(wide) = self.wide {
                // SAFETY: as below; the AVX-512 tile reads the same rows.
                unsafe { wide_tiles(wide, ptrs, a.x, k, outs, (j0, tw)) };
                j0 += tw;
                continue;
            }
            let mut i = 0;
            while i < m {
                let xp = a.x[i * k..].as_ptr();
                if i + 2 <= m {
                    // SAFETY: AVX2 proven by `self`; the 4 pointers each address k readable f32s
                    // (`buf` rows, or F32 rows of exactly 4k bytes), and x rows i, i+1 exist.
                    store(unsafe { tile::<2>(ptrs, xp, k) }, outs, i, j0, tw);
                    i += 2;
                } else {
                    // SAFETY: as above, with one x row.
                    store(unsafe { tile::<1>(ptrs, xp, k) }, outs, i, j0, tw);
                    i += 1;
                }
            }
            j0 += tw;
        }
    }
}

/// One activation row of weights AVX-512 decodes (Q8_0, Q4_0, Q4_1, MXFP4: the LM head's
/// usual types), exactly ([`Avx512::dot_f32`]).
fn single_wide(wide: Avx512, a: &Args<'_>, out: &mut [f32]) {
    let ng = a.k / 32; // these types' rows are whole blocks
    for (j, o) in out[..a.nrows].iter_mut().enumerate() {
        let row = &a.rows[j * a.rb..(j + 1) * a.rb];
        // SAFETY: `row` holds ng blocks of `a.ty` and `x` k = 32ng f32s (asserted in `rows`);
        // `a.ty` is one `Avx512::has` takes (the caller's match).
        *o = unsafe { wide.dot_f32(a.ty, row.as_ptr(), a.x.as_ptr(), ng) };
    }
}

/// The AVX-512 tiles of one group of `tw` decoded weight rows (`ptrs`, padded to 4) against
/// all `m` activation rows of `x`, written to `outs[i][j0 + t]`: 4 activation rows at a time,
/// then 2, then 1.
///
/// # Safety
/// Each pointer readable for `k` f32s; `x` holds `m` rows of `k`.
unsafe fn wide_tiles(
    wide: Avx512,
    ptrs: [*const f32; TILE_W],
    x: &[f32],
    k: usize,
    outs: &mut [&mut [f32]],
    (j0, tw): (usize, usize),
) {
    let m = outs.len();
    let mut i = 0;
    while i < m {
        let xp = x[i * k..].as_ptr();
        // SAFETY: rows i..i + n of x exist (n <= m - i); the weight pointers are the caller's.
        unsafe {
            if i + 4 <= m {
                store(wide.tile::<4>(ptrs, xp, k), outs, i, j0, tw);
                i += 4;
            } else if i + 2 <= m {
                store(wide.tile::<2>(ptrs, xp, k), outs, i, j0, tw);
                i += 2;
            } else {
                store(wide.tile::<1>(ptrs, xp, k), outs, i, j0, tw);
                i += 1;
            }
        }
    }
}

/// `outs[i + d][j0 + t] = r[t][d]` for the tile's `tw` real weight rows.
fn store<const X: usize>(
    r: [[f32; X]; TILE_W],
    outs: &mut [&mut [f32]],
    i: usize,
    j0: usize,
    tw: usize,
) {
    for (t, row) in r.iter().enumerate().take(tw) {
        for (d, v) in row.iter().enumerate() {
            outs[i + d][j0 + t] = *v;
        }
    }
}

/// What [`Avx2::rows`] was asked to do, after validation.
struct Args<'a> {
    ty: GgmlType,
    k: usize,
    rb: usize,
    rows: &'a [u8],
    nrows: usize,
    x: &'a [f32],
}

/// Decodes one stored row of `dst.len()` elements into `dst`.
///
/// # Safety
/// AVX2/FMA/F16C available; `row` holds exactly `dst.len()` elements of `ty` (the type `G`).
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn decode_row<G: Group>(ty: GgmlType, row: &[u8], dst: &mut [f32]) {
    let k = dst.len();
    let ng = k / 32;
    for blk in 0..ng / G::GROUPS {
        // SAFETY: the block's groups are whole groups (< ng) in `row` (caller contract); dst has
        // 32 f32s at 32g for each.
        unsafe {
            G::block(row.as_ptr(), blk, |s, v| {
                let p = dst.as_mut_ptr().add(32 * (blk * G::GROUPS + s));
                _mm256_storeu_ps(p, v[0]);
                _mm256_storeu_ps(p.add(8), v[1]);
                _mm256_storeu_ps(p.add(16), v[2]);
                _mm256_storeu_ps(p.add(24), v[3]);
            });
        }
    }
    let tail = k % 32;
    if tail != 0 {
        let es = ty.block_bytes();
        scalar::dequantize(ty, &row[(k - tail) * es..], &mut dst[k - tail..]);
    }
}

/// `Σ decode(row) · x` over `ng` groups, one activation row.
///
/// # Safety
/// AVX2/FMA/F16C available; `row` holds `ng` groups; `x` readable for `32 * ng` f32s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_rows<G: Group + ?Sized>(row: *const u8, x: *const f32, ng: usize) -> f32 {
    // SAFETY: forwarded.
    unsafe { dot_rows_m::<G, 1>(row, x, 0, ng)[0] }
}

/// `y[i] = Σ_g decode(row, g) · x[i*k + 32g ..]` for `i < M`: each group is decoded once, in
/// registers, and used for all `M` activation rows.
///
/// Per group and row the four products are summed as `(w0·x0 + w1·x1) + (w2·x2 + w3·x3)`, so
/// each accumulator sees a single add per group (a short loop-carried chain).
///
/// # Safety
/// AVX2/FMA/F16C available; `row` holds `ng` groups; `x` readable for `(M-1)*k + 32*ng` f32s.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
unsafe fn dot_rows_m<G: Group + ?Sized, const M: usize>(
    row: *const u8,
    x: *const f32,
    k: usize,
    ng: usize,
) -> [f32; M] {
    let mut acc = [_mm256_setzero_ps(); M];
    let group = |acc: &mut [__m256; M], g: usize, w: [__m256; 4]| {
        for (i, a) in acc.iter_mut().enumerate() {
            // SAFETY: i < M and 32g + 32 <= 32ng, within the caller's bound on `x`.
            let (x0, x1, x2, x3) = unsafe {
                let p = x.add(i * k + 32 * g);
                (
                    _mm256_loadu_ps(p),
                    _mm256_loadu_ps(p.add(8)),
                    _mm256_loadu_ps(p.add(16)),
                    _mm256_loadu_ps(p.add(24)),
                )
            };
            let t = _mm256_fmadd_ps(w[1], x1, _mm256_mul_ps(w[0], x0));
            let u = _mm256_fmadd_ps(w[3], x3, _mm256_mul_ps(w[2], x2));
            *a = _mm256_add_ps(*a, _mm256_add_ps(t, u));
        }
    };
    for blk in 0..ng / G::GROUPS {
        // SAFETY: the block's groups are < ng, per the caller's contract.
        unsafe { G::block(row, blk, |s, w| group(&mut acc, blk * G::GROUPS + s, w)) };
    }
    acc.map(|a| hsum(a))
}

/// `r[t][i] = Σ_e w[t][e] · x[i*k + e]` for 4 weight rows and `X` activation rows: 4·X
/// independent accumulators; each loaded vector feeds X (or 4) FMAs.
///
/// # Safety
/// AVX2/FMA available; each `w[t]` readable for `k` f32s (any alignment); `x` for `X*k`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
#[allow(clippy::needless_range_loop)] // index loops read clearest in a register-blocked kernel
unsafe fn tile<const X: usize>(
    w: [*const f32; TILE_W],
    x: *const f32,
    k: usize,
) -> [[f32; X]; TILE_W] {
    let mut acc = [[_mm256_setzero_ps(); X]; TILE_W];
    let k8 = k - k % 8;
    let mut e = 0;
    while e < k8 {
        // SAFETY: e + 8 <= k, within every row.
        let wv = unsafe {
            [
                _mm256_loadu_ps(w[0].add(e)),
                _mm256_loadu_ps(w[1].add(e)),
                _mm256_loadu_ps(w[2].add(e)),
                _mm256_loadu_ps(w[3].add(e)),
            ]
        };
        for i in 0..X {
            // SAFETY: i < X and e + 8 <= k.
            let xv = unsafe { _mm256_loadu_ps(x.add(i * k + e)) };
            for t in 0..TILE_W {
                acc[t][i] = _mm256_fmadd_ps(wv[t], xv, acc[t][i]);
            }
        }
        e += 8;
    }
    let mut r = [[0f32; X]; TILE_W];
    for t in 0..TILE_W {
        for i in 0..X {
            let mut s = hsum(acc[t][i]);
            for e in k8..k {
                // SAFETY: e < k.
                s += unsafe { w[t].add(e).read_unaligned() * x.add(i * k + e).read() };
            }
            r[t][i] = s;
        }
    }
    r
}

/// `Σ u·s` over each 4 consecutive bytes, as 8 i32 lanes: `u` unsigned and at most 128 (so a
/// pair of products stays within `maddubs`' i16), `s` signed.
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

/// [`dot_u8_i8`] for signed `a`: `|a|` times `b` with `a`'s sign. `b` must not be −128 where
/// `a` is negative (negating −128 wraps); `a` may be −128 (`|a|` = 128 as unsigned).
#[target_feature(enable = "avx2")]
#[inline]
pub(crate) fn dot_i8_i8(a: __m256i, b: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(a, a), _mm256_sign_epi8(b, a))
}

/// 16 bytes at `p`.
///
/// # Safety
/// `p` readable for 16 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn load16(p: *const u8) -> __m128i {
    // SAFETY: caller guarantees 16 readable bytes; loadu has no alignment needs.
    unsafe { _mm_loadu_si128(p.cast()) }
}

/// 32 bytes at `p`.
///
/// # Safety
/// `p` readable for 32 bytes.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(super) unsafe fn load32(p: *const u8) -> __m256i {
    // SAFETY: caller guarantees 32 readable bytes; loadu has no alignment needs.
    unsafe { _mm256_loadu_si256(p.cast()) }
}

/// The sum of the 8 lanes of `v`.
#[target_feature(enable = "avx2,fma,f16c")]
#[inline]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}
