//! The vector widths the panels run at: [`Zmm`] (AVX-512 VNNI, 16 rows a panel) and [`Ymm`]
//! (8 rows), the latter with AVX-VNNI's `vpdpbusd` (the VEX form, on Intel's laptop and desktop
//! CPUs without AVX-512 since Alder Lake: [`Vnni`]) or with AVX2's `vpmaddubsw` and `vpmaddwd`
//! ([`Madd`]). Each is the handful of operations the one kernel in `mod.rs` is written in, and
//! the `#[target_feature]` entry points that compile it for the width.
//!
//! The operations are `#[inline(always)]` without target features of their own: they are only
//! ever inlined into the entry points below, which carry the features (the callers' safety
//! contract: the width's token exists).

use std::arch::x86_64::*;

use super::kquant::{Q4K, Q5K, Q6K};
use super::{Panel, PanelGroup, Q4_0, Q4_1, Q8_0, Rows, Width};
use crate::quant::q8::Q8Row;
use crate::quant::{Avx2, GgmlType};

/// AVX-512 VNNI: 16 rows a panel.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Zmm;

/// 256 bits (AVX2, FMA, F16C): 8 rows a panel, four byte products summed into each 32-bit
/// lane by `D`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ymm<D>(std::marker::PhantomData<D>);

/// How a 256-bit panel sums byte products, and the entry points compiled for it.
pub(crate) trait Sum256: Sized {
    /// [`Width::dpbusd`].
    ///
    /// # Safety
    /// The flavor's features.
    unsafe fn dpbusd(acc: __m256i, w: __m256i, x: i32) -> __m256i;
    /// [`Width::with_panel`].
    fn with_panel<R>(f: impl FnOnce(&mut Panel<Ymm<Self>>) -> R) -> R;
    /// [`Width::decode`].
    ///
    /// # Safety
    /// As [`Width::decode`].
    unsafe fn decode(ty: GgmlType, rows: *const u8, rb: usize, n: usize, p: &mut Panel<Ymm<Self>>);
    /// [`Width::dots`].
    ///
    /// # Safety
    /// As [`Width::dots`].
    unsafe fn dots<const T: usize, const N: usize, const R: usize>(
        p: &Panel<Ymm<Self>>,
        xs: &[Q8Row],
        halves: &[Vec<f32>],
        outs: &mut [&mut [f32]],
        j0: usize,
        n: usize,
    );
}

/// AVX-VNNI's `vpdpbusd` (the VEX form, Intel's CPUs without AVX-512 since Alder Lake).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Vnni;

/// AVX2's `vpmaddubsw` (pairs of byte products, saturated to 16 bits) then `vpmaddwd` by ones
/// (CPUs with AVX2 alone: Intel's before Alder Lake, AMD's before Zen 4). Exact for codes up to
/// 127 (two products of at most 127 · 128 fit), so Q8_0's shifted codes stay on the f32 tiles.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Madd;

/// Proof that the running CPU has AVX-VNNI besides AVX2, FMA and F16C.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AvxVnni(());

impl AvxVnni {
    /// The token, if the CPU has the features and [`crate::quant::Isa::cap`] admits AVX2 and
    /// AVX-VNNI.
    pub(crate) fn detect() -> Option<Self> {
        static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        let has = *HAS.get_or_init(|| {
            Avx2::detect().is_some()
                && crate::quant::Isa::cap_admits_avx_vnni()
                && std::arch::is_x86_feature_detected!("avxvnni")
        });
        has.then_some(Self(()))
    }
}

thread_local! {
    /// Each thread's panel, kept from call to call: a fresh one per call (zeroed, 30 KiB for
    /// the default model's down projection) put `calloc` and `free` at 7% of a prefill.
    static ZMM_PANEL: std::cell::RefCell<Panel<Zmm>> = const {
        std::cell::RefCell::new(Panel::new())
    };
    static VNNI_PANEL: std::cell::RefCell<Panel<Ymm<Vnni>>> = const {
        std::cell::RefCell::new(Panel::new())
    };
    static MADD_PANEL: std::cell::RefCell<Panel<Ymm<Madd>>> = const {
        std::cell::RefCell::new(Panel::new())
    };
}

/// A `#[target_feature]` entry point per width for the kernel's two parts, `decode` and `dots`.
macro_rules! entry_points {
    ($w:ty, $features:literal, $decode:ident, $dots:ident) => {
        /// `super::decode` compiled for this width.
        ///
        /// # Safety
        /// As `super::decode`, on a CPU with this width's features.
        #[target_feature(enable = $features)]
        unsafe fn $decode<G: PanelGroup<$w>>(
            rows: *const u8,
            rb: usize,
            n: usize,
            panel: &mut Panel<$w>,
        ) {
            // SAFETY: forwarded.
            unsafe { super::decode::<$w, G>(rows, rb, n, panel) }
        }

        /// `super::dots` compiled for this width.
        ///
        /// # Safety
        /// As `super::dots`, on a CPU with this width's features.
        #[target_feature(enable = $features)]
        unsafe fn $dots<const T: usize, const N: usize, const R: usize>(
            panel: &Panel<$w>,
            xs: &[Q8Row],
            halves: &[Vec<f32>],
            outs: &mut [&mut [f32]],
            j0: usize,
            n: usize,
        ) {
            // SAFETY: forwarded.
            unsafe { super::dots::<$w, T, N, R>(panel, xs, halves, outs, j0, n) }
        }
    };
}

entry_points!(
    Zmm,
    "avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c",
    decode_zmm,
    dots_zmm
);
entry_points!(Ymm<Vnni>, "avxvnni,avx2,fma,f16c", decode_vnni, dots_vnni);
entry_points!(Ymm<Madd>, "avx2,fma,f16c", decode_madd, dots_madd);

// SAFETY (of every `unsafe` in the two impls below): as for the widths' impls.
impl Sum256 for Vnni {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, w: __m256i, x: i32) -> __m256i {
        unsafe { _mm256_dpbusd_avx_epi32(acc, w, _mm256_set1_epi32(x)) }
    }

    fn with_panel<R>(f: impl FnOnce(&mut Panel<Ymm<Self>>) -> R) -> R {
        VNNI_PANEL.with_borrow_mut(f)
    }

    unsafe fn decode(ty: GgmlType, rows: *const u8, rb: usize, n: usize, p: &mut Panel<Ymm<Self>>) {
        unsafe {
            match ty {
                GgmlType::Q4_0 => decode_vnni::<Q4_0>(rows, rb, n, p),
                GgmlType::Q4_1 => decode_vnni::<Q4_1>(rows, rb, n, p),
                GgmlType::Q4_K => decode_vnni::<Q4K>(rows, rb, n, p),
                GgmlType::Q5_K => decode_vnni::<Q5K>(rows, rb, n, p),
                GgmlType::Q6_K => decode_vnni::<Q6K>(rows, rb, n, p),
                _ => decode_vnni::<Q8_0>(rows, rb, n, p),
            }
        }
    }

    unsafe fn dots<const T: usize, const N: usize, const R: usize>(
        p: &Panel<Ymm<Self>>,
        xs: &[Q8Row],
        halves: &[Vec<f32>],
        outs: &mut [&mut [f32]],
        j0: usize,
        n: usize,
    ) {
        unsafe { dots_vnni::<T, N, R>(p, xs, halves, outs, j0, n) }
    }
}

impl Sum256 for Madd {
    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, w: __m256i, x: i32) -> __m256i {
        unsafe {
            let pairs = _mm256_maddubs_epi16(w, _mm256_set1_epi32(x));
            _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)))
        }
    }

    fn with_panel<R>(f: impl FnOnce(&mut Panel<Ymm<Self>>) -> R) -> R {
        MADD_PANEL.with_borrow_mut(f)
    }

    unsafe fn decode(ty: GgmlType, rows: *const u8, rb: usize, n: usize, p: &mut Panel<Ymm<Self>>) {
        unsafe {
            match ty {
                GgmlType::Q4_0 => decode_madd::<Q4_0>(rows, rb, n, p),
                GgmlType::Q4_1 => decode_madd::<Q4_1>(rows, rb, n, p),
                GgmlType::Q4_K => decode_madd::<Q4K>(rows, rb, n, p),
                GgmlType::Q5_K => decode_madd::<Q5K>(rows, rb, n, p),
                GgmlType::Q6_K => decode_madd::<Q6K>(rows, rb, n, p),
                _ => unreachable!("no 16-bit-exact panel for {ty}"),
            }
        }
    }

    unsafe fn dots<const T: usize, const N: usize, const R: usize>(
        p: &Panel<Ymm<Self>>,
        xs: &[Q8Row],
        halves: &[Vec<f32>],
        outs: &mut [&mut [f32]],
        j0: usize,
        n: usize,
    ) {
        unsafe { dots_madd::<T, N, R>(p, xs, halves, outs, j0, n) }
    }
}

// SAFETY (of every `unsafe` in the two impls below): intrinsics of the width's features,
// reached only through the entry points above (see the module's comment), and loads within the
// rows the callers bound.
impl Width for Zmm {
    const LANES: usize = 16;
    const TOKENS: usize = 8;
    type I = __m512i;
    type F = __m512;

    fn with_panel<R>(f: impl FnOnce(&mut Panel<Self>) -> R) -> R {
        ZMM_PANEL.with_borrow_mut(f)
    }

    unsafe fn decode(ty: GgmlType, rows: *const u8, rb: usize, n: usize, p: &mut Panel<Self>) {
        unsafe {
            match ty {
                GgmlType::Q4_0 => decode_zmm::<Q4_0>(rows, rb, n, p),
                GgmlType::Q4_1 => decode_zmm::<Q4_1>(rows, rb, n, p),
                GgmlType::Q4_K => decode_zmm::<Q4K>(rows, rb, n, p),
                GgmlType::Q5_K => decode_zmm::<Q5K>(rows, rb, n, p),
                GgmlType::Q6_K => decode_zmm::<Q6K>(rows, rb, n, p),
                GgmlType::MXFP4 => decode_zmm::<super::Mxfp4>(rows, rb, n, p),
                _ => decode_zmm::<Q8_0>(rows, rb, n, p),
            }
        }
    }

    unsafe fn dots<const T: usize, const N: usize, const R: usize>(
        p: &Panel<Self>,
        xs: &[Q8Row],
        halves: &[Vec<f32>],
        outs: &mut [&mut [f32]],
        j0: usize,
        n: usize,
    ) {
        unsafe { dots_zmm::<T, N, R>(p, xs, halves, outs, j0, n) }
    }

    #[inline(always)]
    unsafe fn lanes(rows: &Rows, at: usize) -> [__m512i; 4] {
        let ld = |r: usize| unsafe { _mm_loadu_si128(rows[r].add(at).cast()) };
        std::array::from_fn(|i| unsafe {
            let v = _mm512_castsi128_si512(ld(i));
            let v = _mm512_inserti32x4::<1>(v, ld(4 + i));
            let v = _mm512_inserti32x4::<2>(v, ld(8 + i));
            _mm512_inserti32x4::<3>(v, ld(12 + i))
        })
    }

    #[inline(always)]
    unsafe fn unpack32(a: __m512i, b: __m512i) -> [__m512i; 2] {
        unsafe { [_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b)] }
    }

    #[inline(always)]
    unsafe fn unpack64(a: __m512i, b: __m512i) -> [__m512i; 2] {
        unsafe { [_mm512_unpacklo_epi64(a, b), _mm512_unpackhi_epi64(a, b)] }
    }

    #[inline(always)]
    unsafe fn f16_lanes(v: __m512i, high: bool) -> __m512 {
        unsafe {
            let v = if high { _mm512_srli_epi32(v, 16) } else { v };
            _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v))
        }
    }

    #[inline(always)]
    unsafe fn low_nibbles(v: __m512i, shift4: bool) -> __m512i {
        unsafe {
            let v = if shift4 { _mm512_srli_epi32(v, 4) } else { v };
            _mm512_and_si512(v, _mm512_set1_epi8(0x0f))
        }
    }

    #[inline(always)]
    unsafe fn flip(v: __m512i) -> __m512i {
        unsafe { _mm512_xor_si512(v, _mm512_set1_epi8(-128)) }
    }

    #[inline(always)]
    unsafe fn and(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_and_si512(a, b) }
    }

    #[inline(always)]
    unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
        unsafe { _mm512_or_si512(a, b) }
    }

    #[inline(always)]
    unsafe fn shr(v: __m512i, n: u32) -> __m512i {
        unsafe { _mm512_srl_epi32(v, _mm_cvtsi32_si128(n as i32)) }
    }

    #[inline(always)]
    unsafe fn shl(v: __m512i, n: u32) -> __m512i {
        unsafe { _mm512_sll_epi32(v, _mm_cvtsi32_si128(n as i32)) }
    }

    #[inline(always)]
    unsafe fn sra(v: __m512i, n: u32) -> __m512i {
        unsafe { _mm512_sra_epi32(v, _mm_cvtsi32_si128(n as i32)) }
    }

    #[inline(always)]
    unsafe fn splat_i(v: u32) -> __m512i {
        unsafe { _mm512_set1_epi32(v as i32) }
    }

    #[inline(always)]
    unsafe fn dpbusd(acc: __m512i, w: __m512i, x: i32) -> __m512i {
        unsafe { _mm512_dpbusd_epi32(acc, w, _mm512_set1_epi32(x)) }
    }

    #[inline(always)]
    unsafe fn zero_i() -> __m512i {
        unsafe { _mm512_setzero_si512() }
    }

    #[inline(always)]
    unsafe fn zero() -> __m512 {
        unsafe { _mm512_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> __m512 {
        unsafe { _mm512_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn to_f32(v: __m512i) -> __m512 {
        unsafe { _mm512_cvtepi32_ps(v) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        unsafe { _mm512_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m512, b: __m512, c: __m512) -> __m512 {
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn store(out: *mut f32, n: usize, v: __m512) {
        unsafe { _mm512_mask_storeu_ps(out, ((1u32 << n) - 1) as __mmask16, v) }
    }
}

impl<D: Sum256> Width for Ymm<D> {
    const LANES: usize = 8;
    const TOKENS: usize = 4;
    type I = __m256i;
    type F = __m256;

    fn with_panel<R>(f: impl FnOnce(&mut Panel<Self>) -> R) -> R {
        D::with_panel(f)
    }

    unsafe fn decode(ty: GgmlType, rows: *const u8, rb: usize, n: usize, p: &mut Panel<Self>) {
        unsafe { D::decode(ty, rows, rb, n, p) }
    }

    unsafe fn dots<const T: usize, const N: usize, const R: usize>(
        p: &Panel<Self>,
        xs: &[Q8Row],
        halves: &[Vec<f32>],
        outs: &mut [&mut [f32]],
        j0: usize,
        n: usize,
    ) {
        unsafe { D::dots::<T, N, R>(p, xs, halves, outs, j0, n) }
    }

    #[inline(always)]
    unsafe fn lanes(rows: &Rows, at: usize) -> [__m256i; 4] {
        let ld = |r: usize| unsafe { _mm_loadu_si128(rows[r].add(at).cast()) };
        std::array::from_fn(|i| unsafe { _mm256_set_m128i(ld(4 + i), ld(i)) })
    }

    #[inline(always)]
    unsafe fn unpack32(a: __m256i, b: __m256i) -> [__m256i; 2] {
        unsafe { [_mm256_unpacklo_epi32(a, b), _mm256_unpackhi_epi32(a, b)] }
    }

    #[inline(always)]
    unsafe fn unpack64(a: __m256i, b: __m256i) -> [__m256i; 2] {
        unsafe { [_mm256_unpacklo_epi64(a, b), _mm256_unpackhi_epi64(a, b)] }
    }

    #[inline(always)]
    unsafe fn f16_lanes(v: __m256i, high: bool) -> __m256 {
        unsafe {
            let v = if high {
                _mm256_srli_epi32(v, 16)
            } else {
                _mm256_and_si256(v, _mm256_set1_epi32(0xffff))
            };
            // Each 128-bit lane packs its four words twice; quads 0 and 2 are the eight in
            // order.
            let p = _mm256_packus_epi32(v, v);
            let p = _mm256_permute4x64_epi64::<0b00_00_10_00>(p);
            _mm256_cvtph_ps(_mm256_castsi256_si128(p))
        }
    }

    #[inline(always)]
    unsafe fn low_nibbles(v: __m256i, shift4: bool) -> __m256i {
        unsafe {
            let v = if shift4 { _mm256_srli_epi32(v, 4) } else { v };
            _mm256_and_si256(v, _mm256_set1_epi8(0x0f))
        }
    }

    #[inline(always)]
    unsafe fn flip(v: __m256i) -> __m256i {
        unsafe { _mm256_xor_si256(v, _mm256_set1_epi8(-128)) }
    }

    #[inline(always)]
    unsafe fn and(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_and_si256(a, b) }
    }

    #[inline(always)]
    unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
        unsafe { _mm256_or_si256(a, b) }
    }

    #[inline(always)]
    unsafe fn shr(v: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_srl_epi32(v, _mm_cvtsi32_si128(n as i32)) }
    }

    #[inline(always)]
    unsafe fn shl(v: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_sll_epi32(v, _mm_cvtsi32_si128(n as i32)) }
    }

    #[inline(always)]
    unsafe fn sra(v: __m256i, n: u32) -> __m256i {
        unsafe { _mm256_sra_epi32(v, _mm_cvtsi32_si128(n as i32)) }
    }

    #[inline(always)]
    unsafe fn splat_i(v: u32) -> __m256i {
        unsafe { _mm256_set1_epi32(v as i32) }
    }

    #[inline(always)]
    unsafe fn dpbusd(acc: __m256i, w: __m256i, x: i32) -> __m256i {
        unsafe { D::dpbusd(acc, w, x) }
    }

    #[inline(always)]
    unsafe fn zero_i() -> __m256i {
        unsafe { _mm256_setzero_si256() }
    }

    #[inline(always)]
    unsafe fn zero() -> __m256 {
        unsafe { _mm256_setzero_ps() }
    }

    #[inline(always)]
    unsafe fn splat(v: f32) -> __m256 {
        unsafe { _mm256_set1_ps(v) }
    }

    #[inline(always)]
    unsafe fn to_f32(v: __m256i) -> __m256 {
        unsafe { _mm256_cvtepi32_ps(v) }
    }

    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        unsafe { _mm256_mul_ps(a, b) }
    }

    #[inline(always)]
    unsafe fn fmadd(a: __m256, b: __m256, c: __m256) -> __m256 {
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }

    #[inline(always)]
    unsafe fn store(out: *mut f32, n: usize, v: __m256) {
        unsafe {
            // Lane r stored where r < n: the mask's top bit per lane.
            let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
            let mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), lane);
            _mm256_maskstore_ps(out, mask, v)
        }
    }
}
