//! Codes packed into 32-bit words, little end first (GPTQ, AWQ and compressed-tensors'
//! `pack-quantized` all pack this way; they differ in which codes share a word): slot `i` of a
//! word holds bits `i·bits .. (i + 1)·bits`.

use ferrite_kernels::quant::GgmlType;
use ferrite_kernels::wq::{Bits, ScaleType, WqError, WqFormat, WqMatrix};

/// Codes per 32-bit word.
pub(super) fn per_word(bits: Bits) -> usize {
    32 / bits.get() as usize
}

/// The code in slot `i` of `word`.
pub(super) fn code(word: i32, i: usize, bits: Bits) -> u8 {
    ((word as u32 >> (i as u32 * bits.get())) & u32::from(bits.max_code())) as u8
}

/// Puts `code` (at most `bits` wide) into slot `i` of `word`.
pub(super) fn put(word: &mut i32, i: usize, bits: Bits, code: u8) {
    *word |= (u32::from(code) << (i as u32 * bits.get())) as i32;
}

/// `codes` packed into words, consecutive codes in consecutive slots; the count must be a
/// multiple of [`per_word`].
pub(super) fn pack(codes: &[u8], bits: Bits) -> Vec<i32> {
    codes
        .chunks(per_word(bits))
        .map(|c| {
            let mut w = 0;
            for (i, &q) in c.iter().enumerate() {
                put(&mut w, i, bits, q);
            }
            w
        })
        .collect()
}

/// Every slot of `words`, in order.
pub(super) fn unpack(words: &[i32], bits: Bits) -> Vec<u8> {
    let p = per_word(bits);
    words
        .iter()
        .flat_map(|&w| (0..p).map(move |i| code(w, i, bits)))
        .collect()
}

/// The scale type a layer's stored scales (`ty`, values `scales`, named `name` in the log) run
/// as: bf16 and f16 as they are; f32 as whichever of the two holds every value exactly, else f16
/// (a relative change of at most 2⁻¹¹ per scale, far inside a 4-bit step), said in the log.
pub(super) fn scale_type(ty: GgmlType, scales: &[f32], name: &str) -> ScaleType {
    match ty {
        GgmlType::BF16 => ScaleType::Bf16,
        GgmlType::F32 => {
            let exact = |t: ScaleType| scales.iter().all(|&s| t.round(s) == s);
            if exact(ScaleType::F16) {
                ScaleType::F16
            } else if exact(ScaleType::Bf16) {
                ScaleType::Bf16
            } else {
                tracing::warn!("{name}: f32 scales rounded to f16");
                ScaleType::F16
            }
        }
        _ => ScaleType::F16,
    }
}

/// One layer's unpacked codes (`rows * cols`, row-major over output features) and per-group
/// scales and zero points (`rows * groups`).
pub(super) struct Unpacked {
    pub rows: usize,
    pub cols: usize,
    pub codes: Vec<u8>,
    pub scales: Vec<f32>,
    pub zeros: Vec<u8>,
}

impl Unpacked {
    /// The [`WqMatrix`]: symmetric when the checkpoint says so and every zero sits at the
    /// midpoint `2^(bits-1)` (so the symmetric kernels run it), else with its zero points.
    pub fn into_wq(
        self,
        bits: Bits,
        group_size: Option<usize>,
        scale_type: ScaleType,
        sym: bool,
    ) -> Result<WqMatrix, WqError> {
        let format = WqFormat {
            bits,
            group_size,
            zero_point: true,
            scale_type,
        };
        let symmetric = WqFormat {
            zero_point: false,
            ..format
        };
        let (rows, cols) = (self.rows, self.cols);
        if sym && self.zeros.iter().all(|&z| z == symmetric.fixed_zero()) {
            WqMatrix::from_codes(symmetric, rows, cols, &self.codes, &self.scales, None)
        } else {
            WqMatrix::from_codes(
                format,
                rows,
                cols,
                &self.codes,
                &self.scales,
                Some(&self.zeros),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_and_unpack_are_inverse_for_every_width() {
        for bits in [Bits::B2, Bits::B4, Bits::B8] {
            let codes: Vec<u8> = (0..64u32)
                .map(|i| (i * 7 % (u32::from(bits.max_code()) + 1)) as u8)
                .collect();
            let words = pack(&codes, bits);
            assert_eq!(words.len(), 64 / per_word(bits));
            assert_eq!(unpack(&words, bits), codes, "{bits:?}");
        }
        // Slot 0 is the low nibble; slot 7 reaches the sign bit.
        assert_eq!(
            pack(&[1, 0, 0, 0, 0, 0, 0, 0xf], Bits::B4),
            vec![0xf000_0001u32 as i32]
        );
    }
}
