//! Codes packed into 32-bit words, little end first (GPTQ, AWQ and compressed-tensors'
//! `pack-quantized` all pack this way; they differ in which codes share a word): slot `i` of a
//! word holds bits `i·bits .. (i + 1)·bits`.

use ferrite_kernels::quant::GgmlType;
use ferrite_kernels::wq::{Bits, ScaleType, WqError, WqFormat, WqMatrix};

use super::TensorMap;
use crate::error::{FormatError, Result};

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

/// `codes` as one dense little-endian bit stream in `ceil(n · bits / 32)` words: code `j` at
/// bits `j·bits ..` of the stream, a 3-bit code straddling two words where it falls so
/// (compressed-tensors' `pack_to_int32`). For 2, 4 and 8 bits this is the slot layout above.
pub(super) fn pack(codes: &[u8], bits: Bits) -> Vec<i32> {
    let b = bits.get() as usize;
    let mut words = vec![0u32; (codes.len() * b).div_ceil(32)];
    for (j, &q) in codes.iter().enumerate() {
        let (w, off) = (j * b / 32, j * b % 32);
        let v = u64::from(q & bits.max_code()) << off;
        words[w] |= v as u32;
        if off + b > 32 {
            words[w + 1] |= (v >> 32) as u32;
        }
    }
    words.into_iter().map(|w| w as i32).collect()
}

/// The first `n` codes of the bit stream `words` (the inverse of [`pack`]); `None` when the
/// words hold fewer.
pub(super) fn unpack(words: &[i32], bits: Bits, n: usize) -> Option<Vec<u8>> {
    let b = bits.get() as usize;
    if words.len() * 32 < n * b {
        return None;
    }
    let word = |i: usize| u64::from(words.get(i).copied().unwrap_or(0) as u32);
    Some(
        (0..n)
            .map(|j| {
                let (w, off) = (j * b / 32, j * b % 32);
                let v = (word(w) | word(w + 1) << 32) >> off;
                (v as u8) & bits.max_code()
            })
            .collect(),
    )
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

/// A layer's stored scales `name`, after checking that their shape is `shape`: the values
/// (as f32) and the type they run as ([`scale_type`]).
pub(super) fn stored_scales(
    t: &TensorMap,
    name: &str,
    shape: [usize; 2],
) -> Result<(Vec<f32>, ScaleType)> {
    let entry = t
        .entry(name)
        .ok_or_else(|| FormatError::MissingTensor(name.to_owned()))?;
    if entry.shape != shape {
        return Err(FormatError::BadTensor {
            name: name.to_owned(),
            reason: format!("shape {:?}, expected {shape:?}", entry.shape),
        });
    }
    let values = t.vector(name)?;
    let ty = scale_type(entry.ty, &values, name);
    Ok((values, ty))
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
        for bits in [Bits::B2, Bits::B3, Bits::B4, Bits::B8] {
            for n in [64, 70] {
                let codes: Vec<u8> = (0..n as u32)
                    .map(|i| (i * 7 % (u32::from(bits.max_code()) + 1)) as u8)
                    .collect();
                let words = pack(&codes, bits);
                assert_eq!(words.len(), (n * bits.get() as usize).div_ceil(32));
                assert_eq!(unpack(&words, bits, n), Some(codes), "{bits:?}");
                assert_eq!(unpack(&words[1..], bits, n), None);
            }
        }
        // 3 bits: code 10 straddles words 0 and 1 (bits 30..33), as pack_to_int32 puts it.
        let mut codes = vec![0u8; 32];
        codes[10] = 0b101;
        codes[0] = 0b011;
        assert_eq!(pack(&codes, Bits::B3), vec![(1u32 << 30 | 3) as i32, 1, 0]);
        // Slot 0 is the low nibble; slot 7 reaches the sign bit.
        assert_eq!(
            pack(&[1, 0, 0, 0, 0, 0, 0, 0xf], Bits::B4),
            vec![0xf000_0001u32 as i32]
        );
    }
}
