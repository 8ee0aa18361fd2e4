//! What a KV cache's values are stored as ([`KvElem`]): f32, f16 or FP8 e4m3, each widened to
//! f32 as attention loads it (eight or sixteen at a time where AVX2 or AVX-512 run it).

use half::f16;

/// What a KV cache's values are stored as.
#[allow(unsafe_code)]
pub trait KvElem: Copy + Send + Sync + 'static {
    fn to_f32(self) -> f32;
    /// Round to nearest, ties to even (as `torch.Tensor.half()`).
    fn from_f32(x: f32) -> Self;
    /// 8 values from `p`, widened.
    ///
    /// # Safety
    /// AVX2 and F16C available; `p` points at 8 values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256;
    /// 16 values from `p`, widened.
    ///
    /// # Safety
    /// AVX-512F available; `p` points at 16 values.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512;
}

#[allow(unsafe_code)]
impl KvElem for f32 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        self
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        x
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm256_loadu_ps(p) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        // SAFETY: the caller's contract.
        unsafe { std::arch::x86_64::_mm512_loadu_ps(p) }
    }
}

#[allow(unsafe_code)]
impl KvElem for f16 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        f16::to_f32(self)
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        f16::from_f32(x)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: 8 f16 (16 bytes) at `p`, F16C present.
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: 16 f16 (32 bytes) at `p`, AVX-512F present.
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }
}

/// An FP8 e4m3 value ([`crate::fp8`]'s codes), as a KV cache of a quarter of f32's bytes
/// stores it: each value rounded once, to nearest, saturating at ±448 (vLLM's `fp8` cache
/// with its default scale of 1; keys and values of the models served stay far inside).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[repr(transparent)]
pub struct E4m3(pub u8);

impl E4m3 {
    /// `codes` as values.
    pub fn slice(codes: &[u8]) -> &[E4m3] {
        // SAFETY: E4m3 is a transparent u8: same size, alignment and validity.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(codes.as_ptr().cast(), codes.len())
        }
    }

    /// `codes` as values, to write.
    pub fn slice_mut(codes: &mut [u8]) -> &mut [E4m3] {
        // SAFETY: as in `slice`; the borrow is exclusive.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts_mut(codes.as_mut_ptr().cast(), codes.len())
        }
    }
}

/// The SIMD widening of e4m3 codes: `(sign << 8) | (magnitude << 7)` are the bits of an f16
/// whose value times 2⁸ is the code's, for every finite code, subnormals included (e4m3's
/// exponent bias is 7, f16's 15; both mantissas are linear below their smallest normal).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod e4m3_simd {
    use std::arch::x86_64::*;

    /// 8 (or 16) codes widened to u16 lanes, as f16 bits.
    #[inline(always)]
    pub unsafe fn f16_bits128(w: __m128i) -> __m128i {
        // SAFETY: SSE2 only (the caller's AVX2 implies it).
        unsafe {
            let sign = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x80)), 8);
            let mag = _mm_slli_epi16(_mm_and_si128(w, _mm_set1_epi16(0x7f)), 7);
            _mm_or_si128(sign, mag)
        }
    }

    #[inline(always)]
    pub unsafe fn f16_bits256(w: __m256i) -> __m256i {
        // SAFETY: AVX2 (the caller's contract).
        unsafe {
            let sign = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x80)), 8);
            let mag = _mm256_slli_epi16(_mm256_and_si256(w, _mm256_set1_epi16(0x7f)), 7);
            _mm256_or_si256(sign, mag)
        }
    }
}

/// Each code's value, by the widening the SIMD loads do (NaN for the two NaN codes, as
/// [`crate::fp8::e4m3_to_f32`] says; a cache never stores them but for a NaN written).
static E4M3_VALUES: [f32; 256] = e4m3_values();

const fn e4m3_values() -> [f32; 256] {
    let mut t = [0f32; 256];
    let mut c = 0;
    while c < 256 {
        t[c] = if c & 0x7f == 0x7f {
            f32::NAN
        } else {
            let bits = ((c & 0x80) << 8) | ((c & 0x7f) << 7);
            f16::from_bits(bits as u16).to_f32_const() * 256.0
        };
        c += 1;
    }
    t
}

#[allow(unsafe_code)]
impl KvElem for E4m3 {
    #[inline(always)]
    fn to_f32(self) -> f32 {
        E4M3_VALUES[usize::from(self.0)]
    }
    #[inline(always)]
    fn from_f32(x: f32) -> Self {
        E4m3(crate::fp8::e4m3_from_f32(x))
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load8(p: *const Self) -> std::arch::x86_64::__m256 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: 8 codes (8 bytes) at `p`, AVX2 and F16C present.
        unsafe {
            let w = _mm_cvtepu8_epi16(_mm_loadl_epi64(p.cast()));
            let f = _mm256_cvtph_ps(e4m3_simd::f16_bits128(w));
            _mm256_mul_ps(f, _mm256_set1_ps(256.0))
        }
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(p: *const Self) -> std::arch::x86_64::__m512 {
        use std::arch::x86_64::*;
        // SAFETY: the caller's contract: 16 codes (16 bytes) at `p`, AVX-512F (and so AVX2)
        // present.
        unsafe {
            let w = _mm256_cvtepu8_epi16(_mm_loadu_si128(p.cast()));
            let f = _mm512_cvtph_ps(e4m3_simd::f16_bits256(w));
            _mm512_mul_ps(f, _mm512_set1_ps(256.0))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every finite code widens, 8 and 16 at a time, to its value (`crate::fp8`'s decoding),
    /// subnormals and signs included; writing rounds to the nearest code and saturates.
    #[test]
    fn e4m3_codes_widen_to_their_values() {
        let finite: Vec<u8> = (0..=255u8).filter(|c| c & 0x7f != 0x7f).collect();
        // The reference decoding (fp8.rs), against the table and both SIMD widenings.
        let want: Vec<f32> = finite.iter().map(|&c| crate::fp8::e4m3_to_f32(c)).collect();
        let table: Vec<f32> = finite.iter().map(|&c| E4m3(c).to_f32()).collect();
        assert_eq!(table, want);
        assert!(E4m3(0x7f).to_f32().is_nan() && E4m3(0xff).to_f32().is_nan());
        assert_eq!(E4m3(0x01).to_f32(), 2f32.powi(-9), "the smallest subnormal");
        assert_eq!(E4m3(0xfe).to_f32(), -448.0);
        #[cfg(target_arch = "x86_64")]
        {
            let codes = E4m3::slice(&finite);
            let mut got = vec![0f32; 16];
            if crate::quant::Avx2::detect().is_some() {
                for (chunk, want) in codes.chunks_exact(8).zip(want.chunks_exact(8)) {
                    // SAFETY: AVX2 and F16C were detected; the chunk holds 8 codes.
                    #[allow(unsafe_code)]
                    unsafe {
                        let v = E4m3::load8(chunk.as_ptr());
                        std::arch::x86_64::_mm256_storeu_ps(got.as_mut_ptr(), v);
                    }
                    assert_eq!(&got[..8], want);
                }
            }
            if std::arch::is_x86_feature_detected!("avx512f") {
                for (chunk, want) in codes.chunks_exact(16).zip(want.chunks_exact(16)) {
                    // SAFETY: AVX-512F was detected; the chunk holds 16 codes.
                    #[allow(unsafe_code)]
                    unsafe {
                        let v = E4m3::load16(chunk.as_ptr());
                        std::arch::x86_64::_mm512_storeu_ps(got.as_mut_ptr(), v);
                    }
                    assert_eq!(got, want);
                }
            }
        }
        assert_eq!(E4m3::from_f32(1000.0), E4m3(0x7e), "saturated");
        assert_eq!(E4m3::from_f32(-0.3).to_f32(), -0.3125);
    }
}
