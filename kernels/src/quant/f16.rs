//! Little-endian f16 scales read as f32, exactly: what the CPU kernels' block decoders
//! (scalar-register code, shared by the AVX2 and AVX-512 ones) read a GGUF block's scales with.
//! AVX-512's one-token dots read two blocks' headers at once with `vcvtph2ps` instead
//! (`avx512::heads`): with the integer dot that fast, these scalar decodes were a third of its
//! instructions.

/// An f16 bit pattern as f32, exactly (subnormals, infinities and NaNs included).
///
/// Done in general-purpose registers on purpose: building a vector for `vcvtph2ps` from one
/// 16-bit value makes LLVM emit `vpinsrw` into whatever register is free, often a loop
/// accumulator, which chains every iteration to the previous one.
#[inline(always)]
fn f16_to_f32(h: u16) -> f32 {
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    if em >= 0x7c00 {
        return f32::from_bits(sign | 0x7f80_0000 | ((em & 0x3ff) << 13));
    }
    // The f16 bits shifted into an f32 read 2^112 too small (subnormals included): rescale,
    // exactly.
    f32::from_bits(sign | (em << 13)) * f32::from_bits(0x7780_0000)
}

/// The little-endian f16 at `p`, as f32.
///
/// # Safety
/// `p` readable for 2 bytes.
#[inline(always)]
pub(in crate::quant) unsafe fn f16_at(p: *const u8) -> f32 {
    // SAFETY: caller guarantees 2 readable bytes; read_unaligned has no alignment needs.
    f16_to_f32(u16::from_le(unsafe { p.cast::<u16>().read_unaligned() }))
}

/// The two little-endian f16 at `p` and `p + 2`, as f32.
///
/// # Safety
/// `p` readable for 4 bytes.
#[inline(always)]
pub(in crate::quant) unsafe fn f16x2_at(p: *const u8) -> (f32, f32) {
    // SAFETY: forwarded.
    unsafe { (f16_at(p), f16_at(p.add(2))) }
}

#[cfg(test)]
mod tests {
    #[test]
    fn f16_to_f32_is_exact_for_every_bit_pattern() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = super::f16_to_f32(h);
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "{h:#06x}: {got} vs {want}"
            );
        }
    }
}
