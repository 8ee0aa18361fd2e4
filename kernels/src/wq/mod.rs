//! Weight-only quantization: 8, 4 and 2-bit integer weights in groups along the input
//! dimension, each group with its own scale (f16 or bf16) and, for the asymmetric formats, its
//! own integer zero point. Activations stay f32 on the CPU.
//!
//! Every format stores unsigned codes `q` in `0..2^bits` and means `w = scale * (q - zero)`:
//! the asymmetric formats store `zero` per group, the symmetric ones fix it at `2^(bits-1)`. So
//! one kernel serves all of them.
//!
//! # In-memory layout (CPU)
//!
//! Three arrays, row-major over output features: the codes, row `r`'s `cols` of them packed
//! little-end first (`8 / bits` per byte, code `j` at bit `(j * bits) % 8` of byte
//! `j * bits / 8`); `scales[r * groups + g]`; and `zeros[r * groups + g]`. Groups run along a
//! row; a row whose length is not a multiple of the group size ends with a shorter group. A
//! matmul streams each row's codes once. GPTQ checkpoints are converted into this at load
//! (`ferrite-formats`' `gptq`); GGUF's block types are repacked into it for the GPU
//! ([`gguf`]), with a float minimum per group beside the matrix for the types that have one.

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2;
pub mod gguf;
#[allow(unsafe_code)]
mod matmul;
mod rtn;

use std::fmt;
use std::ops::Range;
use std::str::FromStr;

use half::{bf16, f16};

pub use rtn::{GroupGrid, quantize_rtn};

/// Bits per weight.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Bits {
    B2,
    /// 3-bit codes, held in memory as 4-bit ones (nibbles: a byte does not hold whole 3-bit
    /// codes, and the 4-bit kernels then run them unchanged); on disk they are packed densely
    /// (compressed-tensors' layout).
    B3,
    B4,
    B8,
}

impl Bits {
    pub fn get(self) -> u32 {
        match self {
            Bits::B2 => 2,
            Bits::B3 => 3,
            Bits::B4 => 4,
            Bits::B8 => 8,
        }
    }

    pub fn from_u32(bits: u32) -> Result<Self, WqError> {
        match bits {
            2 => Ok(Bits::B2),
            3 => Ok(Bits::B3),
            4 => Ok(Bits::B4),
            8 => Ok(Bits::B8),
            other => Err(WqError::Format(format!(
                "{other}-bit weights are not supported (2, 3, 4 or 8)"
            ))),
        }
    }

    /// The largest code, `2^bits - 1`.
    pub fn max_code(self) -> u8 {
        ((1u32 << self.get()) - 1) as u8
    }

    /// Bits a code takes in memory: [`Self::get`], but 4 for 3-bit codes.
    pub fn storage(self) -> u32 {
        match self {
            Bits::B3 => 4,
            b => b.get(),
        }
    }

    /// Codes per byte in memory.
    pub fn per_byte(self) -> usize {
        8 / self.storage() as usize
    }
}

/// Which float type a format's scales are rounded to (and stored as, on disk and on the GPU).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ScaleType {
    F16,
    Bf16,
}

impl ScaleType {
    /// `x` rounded to this type, as f32.
    pub fn round(self, x: f32) -> f32 {
        match self {
            ScaleType::F16 => f16::from_f32(x).to_f32(),
            ScaleType::Bf16 => bf16::from_f32(x).to_f32(),
        }
    }

    /// The bits `x` is stored as in this type (rounded to nearest), for writing checkpoints.
    pub fn to_bits(self, x: f32) -> u16 {
        match self {
            ScaleType::F16 => f16::from_f32(x).to_bits(),
            ScaleType::Bf16 => bf16::from_f32(x).to_bits(),
        }
    }

    /// The smallest value of this type at or above `x` (`0 <= x <= max`), as f32: a scale
    /// rounded up still spans its group's whole range.
    pub fn round_up(self, x: f32) -> f32 {
        match self {
            ScaleType::F16 => {
                let r = f16::from_f32(x);
                if r.to_f32() < x {
                    f16::from_bits(r.to_bits() + 1)
                } else {
                    r
                }
                .to_f32()
            }
            ScaleType::Bf16 => {
                let r = bf16::from_f32(x);
                if r.to_f32() < x {
                    bf16::from_bits(r.to_bits() + 1)
                } else {
                    r
                }
                .to_f32()
            }
        }
    }

    /// The largest finite value of this type.
    pub fn max(self) -> f32 {
        match self {
            ScaleType::F16 => f16::MAX.to_f32(),
            ScaleType::Bf16 => bf16::MAX.to_f32(),
        }
    }
}

/// A weight-only quantization format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WqFormat {
    pub bits: Bits,
    /// Elements per group along a row; `None` is one group per row (per-channel).
    pub group_size: Option<usize>,
    /// Whether each group stores its own zero point (else it is `2^(bits-1)`).
    pub zero_point: bool,
    pub scale_type: ScaleType,
}

impl WqFormat {
    /// The group size for rows of `cols` elements.
    pub fn group_len(&self, cols: usize) -> usize {
        self.group_size.unwrap_or(cols)
    }

    /// The zero point of the symmetric formats.
    pub fn fixed_zero(&self) -> u8 {
        1 << (self.bits.get() - 1)
    }

    /// Groups per row of `cols` elements: a row whose length is not a multiple of the group
    /// size ends with one shorter group (576 columns in groups of 128: four of 128, one of 64).
    pub fn groups_per_row(&self, cols: usize) -> usize {
        cols.div_ceil(self.group_len(cols).max(1))
    }

    /// Checks that rows of `cols` elements split into groups of whole bytes.
    pub fn check_cols(&self, cols: usize) -> Result<(), WqError> {
        let g = self.group_len(cols);
        let per = self.bits.per_byte();
        if cols == 0 || g == 0 || !g.is_multiple_of(per) || !cols.is_multiple_of(per) {
            return Err(WqError::Shape(format!(
                "rows of {cols} do not split into groups of {g} whole bytes of {}-bit codes",
                self.bits.get()
            )));
        }
        Ok(())
    }
}

/// `w4g128` (asymmetric, zero point), `w4g128-sym`, `w8pc` (per-channel), with `-bf16` for bf16
/// scales: the names `--quantize rtn-…` takes.
impl fmt::Display for WqFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "w{}", self.bits.get())?;
        match self.group_size {
            Some(g) => write!(f, "g{g}")?,
            None => f.write_str("pc")?,
        }
        if !self.zero_point {
            f.write_str("-sym")?;
        }
        if self.scale_type == ScaleType::Bf16 {
            f.write_str("-bf16")?;
        }
        Ok(())
    }
}

impl FromStr for WqFormat {
    type Err = WqError;

    fn from_str(s: &str) -> Result<Self, WqError> {
        let bad = || {
            WqError::Format(format!(
                "`{s}` is not a weight format (expected w<bits>g<group> or w<bits>pc, \
                 optionally -sym and -bf16: w4g128, w8pc-sym, w2g64-bf16)"
            ))
        };
        let mut parts = s.split('-');
        let head = parts.next().unwrap_or_default();
        let rest = head.strip_prefix('w').ok_or_else(bad)?;
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let bits: u32 = rest[..digits].parse().map_err(|_| bad())?;
        let group_size = match &rest[digits..] {
            "pc" => None,
            g => {
                let n: usize = g
                    .strip_prefix('g')
                    .ok_or_else(bad)?
                    .parse()
                    .map_err(|_| bad())?;
                if ![32, 64, 128].contains(&n) {
                    return Err(WqError::Format(format!(
                        "group size {n} is not supported (32, 64, 128, or pc for per-channel)"
                    )));
                }
                Some(n)
            }
        };
        let mut fmt = WqFormat {
            bits: Bits::from_u32(bits)?,
            group_size,
            zero_point: true,
            scale_type: ScaleType::F16,
        };
        for p in parts {
            match p {
                "sym" => fmt.zero_point = false,
                "bf16" => fmt.scale_type = ScaleType::Bf16,
                "f16" => fmt.scale_type = ScaleType::F16,
                _ => return Err(bad()),
            }
        }
        Ok(fmt)
    }
}

/// What can go wrong building or converting a quantized matrix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WqError {
    #[error("{0}")]
    Format(String),
    #[error("{0}")]
    Shape(String),
    #[error("{0}")]
    Value(String),
}

/// A `[rows, cols]` weight matrix in a [`WqFormat`], laid out as the module docs say.
#[derive(Clone)]
pub struct WqMatrix {
    format: WqFormat,
    rows: usize,
    cols: usize,
    /// `rows * cols * bits / 8` bytes.
    codes: Vec<u8>,
    /// `rows * groups`, already rounded to the format's scale type.
    scales: Vec<f32>,
    /// `rows * groups` for the asymmetric formats, else empty.
    zeros: Vec<u8>,
    /// W4A8 and the like: inputs are rounded to int8 per token (the W8A8 kernels' rounding,
    /// [`crate::w8a8::I8Activations::dequantized`]) before the product with these weights.
    int8_activations: bool,
}

impl fmt::Debug for WqMatrix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WqMatrix")
            .field("format", &self.format.to_string())
            .field("rows", &self.rows)
            .field("cols", &self.cols)
            .finish_non_exhaustive()
    }
}

impl WqMatrix {
    /// A matrix from unpacked codes (`rows * cols`, each `<= 2^bits - 1`), per-group scales
    /// (rounded here to the format's scale type) and, for asymmetric formats, per-group zeros.
    pub fn from_codes(
        format: WqFormat,
        rows: usize,
        cols: usize,
        codes: &[u8],
        scales: &[f32],
        zeros: Option<&[u8]>,
    ) -> Result<Self, WqError> {
        format.check_cols(cols)?;
        let groups = rows * format.groups_per_row(cols);
        let expect = |what: &str, got: usize, want: usize| {
            if got == want {
                Ok(())
            } else {
                Err(WqError::Shape(format!(
                    "{rows}x{cols} {format}: {what} has {got} entries, expected {want}"
                )))
            }
        };
        expect("codes", codes.len(), rows * cols)?;
        expect("scales", scales.len(), groups)?;
        let max = format.bits.max_code();
        if let Some(q) = codes.iter().chain(zeros.unwrap_or(&[])).find(|&&q| q > max) {
            return Err(WqError::Value(format!(
                "code {q} does not fit in {} bits",
                format.bits.get()
            )));
        }
        if let Some(s) = scales.iter().find(|s| !s.is_finite()) {
            return Err(WqError::Value(format!("scale {s} is not finite")));
        }
        let zeros = match (format.zero_point, zeros) {
            (true, Some(z)) => {
                expect("zeros", z.len(), groups)?;
                z.to_vec()
            }
            (false, None) => Vec::new(),
            (true, None) => {
                return Err(WqError::Shape(format!("{format} needs zero points")));
            }
            (false, Some(_)) => {
                return Err(WqError::Shape(format!(
                    "{format} is symmetric: it has no zero points"
                )));
            }
        };
        Ok(Self {
            format,
            rows,
            cols,
            codes: pack(codes, format.bits),
            scales: scales.iter().map(|&s| format.scale_type.round(s)).collect(),
            zeros,
            int8_activations: false,
        })
    }

    /// This matrix with its inputs rounded to int8 per token (`true`), or not.
    pub fn with_int8_activations(mut self, on: bool) -> Self {
        self.int8_activations = on;
        self
    }

    /// Whether inputs are rounded to int8 per token before the product (W4A8).
    pub fn int8_activations(&self) -> bool {
        self.int8_activations
    }

    pub fn format(&self) -> WqFormat {
        self.format
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn groups_per_row(&self) -> usize {
        self.format.groups_per_row(self.cols)
    }

    /// The stored size: packed codes, scales as 2 bytes, zeros as the format's bits.
    pub fn bytes_len(&self) -> usize {
        let groups = self.rows * self.groups_per_row();
        let zero_bytes = if self.format.zero_point {
            (groups * self.format.bits.get() as usize).div_ceil(8)
        } else {
            0
        };
        self.codes.len() + groups * 2 + zero_bytes
    }

    /// Row `r`'s codes, packed.
    pub fn packed_row(&self, r: usize) -> &[u8] {
        let rb = self.cols / self.format.bits.per_byte();
        &self.codes[r * rb..(r + 1) * rb]
    }

    /// `parts` (same format and width) one after another as one matrix: a fused projection
    /// (q, k and v; gate and up). `None` when they differ.
    pub fn stack(parts: &[&WqMatrix]) -> Option<WqMatrix> {
        let first = parts.first()?;
        if parts.iter().any(|p| {
            p.format != first.format
                || p.cols != first.cols
                || p.int8_activations != first.int8_activations
        }) {
            return None;
        }
        Some(WqMatrix {
            format: first.format,
            rows: parts.iter().map(|p| p.rows).sum(),
            cols: first.cols,
            codes: parts.iter().flat_map(|p| p.codes.iter().copied()).collect(),
            scales: parts
                .iter()
                .flat_map(|p| p.scales.iter().copied())
                .collect(),
            zeros: parts.iter().flat_map(|p| p.zeros.iter().copied()).collect(),
            int8_activations: first.int8_activations,
        })
    }

    /// Rows `rows` and columns `cols` of this matrix as a matrix of its own: one rank's shard.
    /// A column range must start and end on group boundaries (or end at the row's end), so
    /// every group keeps its scale; per-channel formats cut anywhere.
    pub fn slice(&self, rows: Range<usize>, cols: Range<usize>) -> Result<WqMatrix, WqError> {
        let g = self.format.group_len(self.cols).max(1);
        let per_channel = self.format.group_size.is_none();
        let on_group = |c: usize| c.is_multiple_of(g) || c == self.cols;
        if rows.end > self.rows || cols.end > self.cols || rows.is_empty() || cols.is_empty() {
            return Err(WqError::Shape(format!(
                "rows {rows:?} and columns {cols:?} of a {}x{} matrix",
                self.rows, self.cols
            )));
        }
        let whole_groups = cols.start.is_multiple_of(g) && on_group(cols.end);
        if !(per_channel || whole_groups) {
            return Err(WqError::Shape(format!(
                "columns {cols:?} do not start and end on groups of {g} ({})",
                self.format
            )));
        }
        let gpr = self.groups_per_row();
        let (g0, ng) = if per_channel {
            (0, 1)
        } else {
            (cols.start / g, cols.len().div_ceil(g))
        };
        let mut codes = Vec::with_capacity(rows.len() * cols.len());
        let mut scales = Vec::with_capacity(rows.len() * ng);
        let mut zeros = Vec::with_capacity(rows.len() * ng);
        for r in rows.clone() {
            let row = unpack(self.packed_row(r), self.format.bits, self.cols);
            codes.extend_from_slice(&row[cols.clone()]);
            let groups = r * gpr + g0..r * gpr + g0 + ng;
            scales.extend_from_slice(&self.scales[groups.clone()]);
            if self.format.zero_point {
                zeros.extend_from_slice(&self.zeros[groups]);
            }
        }
        let zeros = self.format.zero_point.then_some(zeros.as_slice());
        WqMatrix::from_codes(self.format, rows.len(), cols.len(), &codes, &scales, zeros)
            .map(|m| m.with_int8_activations(self.int8_activations))
    }

    /// All codes, packed, row-major (the layout the CUDA kernels read as is).
    pub fn packed_codes(&self) -> &[u8] {
        &self.codes
    }

    /// All codes, unpacked, row-major.
    pub fn codes(&self) -> Vec<u8> {
        unpack(&self.codes, self.format.bits, self.rows * self.cols)
    }

    /// Per-group scales (as rounded to the scale type), row-major.
    pub fn scales(&self) -> &[f32] {
        &self.scales
    }

    /// Per-group zero points, row-major (the fixed zero repeated for symmetric formats).
    pub fn zeros(&self) -> Vec<u8> {
        if self.format.zero_point {
            self.zeros.clone()
        } else {
            vec![self.format.fixed_zero(); self.scales.len()]
        }
    }

    fn zero_code(&self, group: usize) -> u8 {
        if self.format.zero_point {
            self.zeros[group]
        } else {
            self.format.fixed_zero()
        }
    }

    /// Row `r` as f32: the reference every kernel is checked against.
    ///
    /// # Panics
    /// If `r >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, r: usize, out: &mut [f32]) {
        assert!(r < self.rows, "row {r} of {}", self.rows);
        assert_eq!(out.len(), self.cols, "output row length");
        let g = self.format.group_len(self.cols);
        let codes = unpack(self.packed_row(r), self.format.bits, self.cols);
        let base = r * self.groups_per_row();
        for (gi, (o, q)) in out.chunks_mut(g).zip(codes.chunks(g)).enumerate() {
            let (s, z) = (self.scales[base + gi], f32::from(self.zero_code(base + gi)));
            for (o, &q) in o.iter_mut().zip(q) {
                *o = s * (f32::from(q) - z);
            }
        }
    }

    /// The whole matrix as f32, row-major.
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.rows * self.cols];
        for (r, row) in out.chunks_mut(self.cols.max(1)).enumerate() {
            self.dequantize_row(r, row);
        }
        out
    }
}

/// Packs codes (each `< 2^bits`) little-end first, [`Bits::per_byte`] per byte. `codes.len()` must be a
/// multiple of that; a short last byte is zero-padded.
pub fn pack(codes: &[u8], bits: Bits) -> Vec<u8> {
    let b = bits.storage() as usize;
    let per = bits.per_byte();
    let mask = bits.max_code();
    codes
        .chunks(per)
        .map(|c| {
            c.iter()
                .enumerate()
                .fold(0u8, |acc, (i, &q)| acc | ((q & mask) << (i * b)))
        })
        .collect()
}

/// The first `n` codes of `packed` (the inverse of [`pack`]).
pub fn unpack(packed: &[u8], bits: Bits, n: usize) -> Vec<u8> {
    let b = bits.storage() as usize;
    let mask = bits.max_code();
    packed
        .iter()
        .flat_map(|&byte| (0..bits.per_byte()).map(move |i| (byte >> (i * b)) & mask))
        .take(n)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_names_round_trip() {
        for s in [
            "w4g128",
            "w8pc",
            "w2g64-sym",
            "w3g128",
            "w4g32-bf16",
            "w8g64-sym-bf16",
        ] {
            let f: WqFormat = s.parse().expect(s);
            assert_eq!(f.to_string(), s);
        }
        for bad in ["w5g128", "w4g100", "w4", "q4g128", "w4g128-asym", ""] {
            assert!(bad.parse::<WqFormat>().is_err(), "{bad}");
        }
    }

    /// A shard's dequantized values are the whole matrix's at the same rows and columns, for
    /// every bit width, grouped and per-channel, with a ragged last group; a cut through a
    /// group is refused.
    #[test]
    fn slices_keep_every_value_and_refuse_cuts_through_groups() {
        let (rows, cols) = (6, 192);
        let w: Vec<f32> = (0..rows * cols)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        for name in ["w4g128", "w2g64-sym", "w8pc", "w4g32-bf16", "w3g64"] {
            let f: WqFormat = name.parse().expect(name);
            let m = quantize_rtn(&w, rows, cols, f).expect("quantize");
            let full = m.dequantize();
            let g = f.group_size.unwrap_or(1);
            for (r, c) in [(0..3, 0..cols), (2..6, 128..192), (1..2, 0..128)] {
                if !c.start.is_multiple_of(g) || !(c.end.is_multiple_of(g) || c.end == cols) {
                    continue;
                }
                let s = m.slice(r.clone(), c.clone()).expect(name);
                let got = s.dequantize();
                let want: Vec<f32> = r
                    .clone()
                    .flat_map(|i| full[i * cols + c.start..i * cols + c.end].to_vec())
                    .collect();
                assert_eq!(got, want, "{name} rows {r:?} cols {c:?}");
            }
        }
        let m = quantize_rtn(&w, rows, cols, "w4g128".parse().expect("f")).expect("quantize");
        assert!(m.slice(0..rows, 0..64).is_err(), "ends inside a group");
        assert!(m.slice(0..rows, 64..192).is_err(), "starts inside a group");
        assert!(m.slice(0..7, 0..cols).is_err(), "past the last row");
    }

    #[test]
    fn packing_round_trips_exactly() {
        for bits in [Bits::B2, Bits::B3, Bits::B4, Bits::B8] {
            let n = 256;
            let codes: Vec<u8> = (0..n)
                .map(|i| ((i * 37 + 11) % 256) as u8 & bits.max_code())
                .collect();
            let packed = pack(&codes, bits);
            assert_eq!(packed.len(), n * bits.storage() as usize / 8);
            assert_eq!(unpack(&packed, bits, n), codes);
        }
        // The documented bit order: code j at bit (j * bits) % 8.
        assert_eq!(pack(&[1, 2, 3, 0], Bits::B2), vec![0b00_11_10_01]);
        assert_eq!(pack(&[0xa, 0x5], Bits::B4), vec![0x5a]);
    }

    #[test]
    fn bad_codes_and_shapes_are_refused() {
        let f: WqFormat = "w4g32".parse().expect("format");
        let ok = WqMatrix::from_codes(f, 1, 32, &[1; 32], &[0.5], Some(&[8]));
        assert!(ok.is_ok());
        let e = WqMatrix::from_codes(f, 1, 32, &[16; 32], &[0.5], Some(&[8]));
        assert!(matches!(e, Err(WqError::Value(_))), "{e:?}");
        let e = WqMatrix::from_codes(f, 1, 48, &[1; 48], &[0.5], Some(&[8]));
        assert!(
            matches!(e, Err(WqError::Shape(_))),
            "a ragged last group has its own scale"
        );
        let e = WqMatrix::from_codes(f, 1, 31, &[1; 31], &[0.5], Some(&[8]));
        assert!(matches!(e, Err(WqError::Shape(_))), "{e:?}");
        let e = WqMatrix::from_codes(f, 1, 32, &[1; 32], &[f32::NAN], Some(&[8]));
        assert!(matches!(e, Err(WqError::Value(_))), "{e:?}");
        let e = WqMatrix::from_codes(f, 1, 32, &[1; 32], &[0.5], None);
        assert!(matches!(e, Err(WqError::Shape(_))), "{e:?}");
    }
}
