//! GGUF tensor types: block layouts, dequantization, and dot products of a stored row with f32
//! activations.
//!
//! Every layout matches ggml byte for byte (little-endian, f16 block scales). Input byte slices
//! may be unaligned (they come straight from a memory-mapped file), so they are only ever read
//! with `from_le_bytes` or unaligned SIMD loads.
//!
//! Two implementations exist for every type: a portable scalar one ([`Isa::Scalar`]) and, on
//! x86-64 CPUs with AVX2 + FMA + F16C, an intrinsics one ([`Isa::Avx2`]); on CPUs with
//! AVX-512, [`Isa::Avx512`] runs the hottest of them wider (`avx512.rs`). On ARM the portable
//! code is the kernel, its integer dots compiled with `sdot` ([`Isa::Neon`], `q8_dot.rs`).
//! [`Isa::best`] picks the fastest available (detected once, then cached).

use std::fmt;
use std::str::FromStr;

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx512;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod f16;
pub(crate) mod int8;
mod kernel;
pub(crate) mod q8;
mod q8_dot;
pub(crate) mod scalar;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod vnni_panel;

#[cfg(target_arch = "x86_64")]
pub(crate) use avx2::{Avx2, dot_i8_i8, hsum as hsum256};
#[cfg(target_arch = "x86_64")]
pub(crate) use avx512::Avx512;
pub use int8::{GgmlActivations, panels_name};
pub(crate) use kernel::RowKernel;
pub use kernel::{Isa, vec_dot, vec_dot_with};

/// Elements in one K-quant super-block.
pub const QK_K: usize = 256;

/// A tensor storage type, as GGUF names and numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[allow(non_camel_case_types)] // ggml's spelling
pub enum GgmlType {
    /// IEEE-754 binary32.
    F32,
    /// IEEE-754 binary16.
    F16,
    /// bfloat16 (the high half of an f32).
    BF16,
    /// Blocks of 32: `{d: f16, qs: [i8; 32]}`, value `d * q`.
    Q8_0,
    /// Blocks of 32: `{d: f16, qs: [u8; 16]}`, value `d * (q - 8)`.
    Q4_0,
    /// Blocks of 32: `{d: f16, m: f16, qs: [u8; 16]}`, value `d * q + m`.
    Q4_1,
    /// Super-blocks of 256: `{d, dmin: f16, scales: [u8; 12], qs: [u8; 128]}`.
    Q4_K,
    /// Super-blocks of 256: `{d, dmin: f16, scales: [u8; 12], qh: [u8; 32], qs: [u8; 128]}`.
    Q5_K,
    /// Super-blocks of 256: `{ql: [u8; 128], qh: [u8; 64], scales: [i8; 16], d: f16}`.
    Q6_K,
    /// Blocks of 32: `{e: u8, qs: [u8; 16]}` (OCP microscaling FP4, gpt-oss's experts), value
    /// `e2m1(q) · 2^(e − 127)`, Q4_0's nibble order (element `j` low in byte `j`, `j + 16`
    /// high).
    MXFP4,
}

impl GgmlType {
    /// Every supported type, in ggml id order.
    pub const ALL: [GgmlType; 10] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::BF16,
        GgmlType::MXFP4,
    ];

    /// The type with ggml's numeric id (`ggml_type`), if supported.
    pub fn from_ggml_id(id: u32) -> Option<Self> {
        Some(match id {
            0 => Self::F32,
            1 => Self::F16,
            2 => Self::Q4_0,
            3 => Self::Q4_1,
            8 => Self::Q8_0,
            12 => Self::Q4_K,
            13 => Self::Q5_K,
            14 => Self::Q6_K,
            30 => Self::BF16,
            39 => Self::MXFP4,
            _ => return None,
        })
    }

    /// ggml's numeric id for this type.
    pub fn ggml_id(self) -> u32 {
        match self {
            Self::F32 => 0,
            Self::F16 => 1,
            Self::Q4_0 => 2,
            Self::Q4_1 => 3,
            Self::Q8_0 => 8,
            Self::Q4_K => 12,
            Self::Q5_K => 13,
            Self::Q6_K => 14,
            Self::BF16 => 30,
            Self::MXFP4 => 39,
        }
    }

    /// ggml's name for this type (`"F32"`, `"Q4_K"`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "F32",
            Self::F16 => "F16",
            Self::BF16 => "BF16",
            Self::Q8_0 => "Q8_0",
            Self::Q4_0 => "Q4_0",
            Self::Q4_1 => "Q4_1",
            Self::Q4_K => "Q4_K",
            Self::Q5_K => "Q5_K",
            Self::Q6_K => "Q6_K",
            Self::MXFP4 => "MXFP4",
        }
    }

    /// Elements per block (1 for the float types).
    pub fn block_elems(self) -> usize {
        match self {
            Self::F32 | Self::F16 | Self::BF16 => 1,
            Self::Q8_0 | Self::Q4_0 | Self::Q4_1 | Self::MXFP4 => 32,
            Self::Q4_K | Self::Q5_K | Self::Q6_K => QK_K,
        }
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::BF16 => 2,
            Self::Q8_0 => 34,
            Self::Q4_0 => 18,
            Self::Q4_1 => 20,
            Self::Q4_K => 144,
            Self::Q5_K => 176,
            Self::Q6_K => 210,
            Self::MXFP4 => 17,
        }
    }

    /// Whether this is a block-quantized type (not F32/F16/BF16).
    pub fn is_quantized(self) -> bool {
        self.block_elems() > 1
    }

    /// Bytes taken by `n_elems` consecutive elements (one row).
    ///
    /// Errors if `n_elems` is not a multiple of [`Self::block_elems`] or the size overflows.
    pub fn row_bytes(self, n_elems: usize) -> Result<usize, QuantError> {
        let be = self.block_elems();
        if !n_elems.is_multiple_of(be) {
            return Err(QuantError::NotBlockMultiple {
                ty: self,
                n_elems,
                block_elems: be,
            });
        }
        (n_elems / be)
            .checked_mul(self.block_bytes())
            .ok_or(QuantError::Overflow { ty: self, n_elems })
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for GgmlType {
    type Err = QuantError;

    /// Parses a ggml type name, case-insensitively (`"q4_k"`, `"BF16"`, ...).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|t| t.name().eq_ignore_ascii_case(s.trim()))
            .ok_or_else(|| QuantError::UnknownType(s.to_owned()))
    }
}

/// Errors from the quantization layer. All of them describe bad input (sizes, names); none is a
/// bug in the kernels.
#[derive(Debug, thiserror::Error)]
pub enum QuantError {
    /// A type name that is not one of the supported ggml types.
    #[error("unknown or unsupported ggml tensor type {0:?}")]
    UnknownType(String),
    /// An element count that does not fill whole blocks.
    #[error("{n_elems} elements of {ty} is not a whole number of {block_elems}-element blocks")]
    NotBlockMultiple {
        /// The tensor type.
        ty: GgmlType,
        /// The requested element count.
        n_elems: usize,
        /// Elements per block of `ty`.
        block_elems: usize,
    },
    /// A byte buffer whose length does not match the element count.
    #[error("{n_elems} elements of {ty} take {expected} bytes, but {actual} bytes were given")]
    ByteLength {
        /// The tensor type.
        ty: GgmlType,
        /// The element count the bytes should hold.
        n_elems: usize,
        /// `ty.row_bytes(n_elems)`.
        expected: usize,
        /// The length actually given.
        actual: usize,
    },
    /// An f32 operand of the wrong length.
    #[error("{what} has {actual} elements, expected {expected}")]
    LengthMismatch {
        /// Which operand.
        what: &'static str,
        /// The length required.
        expected: usize,
        /// The length given.
        actual: usize,
    },
    /// A size computation overflowed `usize`.
    #[error("size of {n_elems} elements of {ty} overflows")]
    Overflow {
        /// The tensor type.
        ty: GgmlType,
        /// The element count (possibly saturated).
        n_elems: usize,
    },
}

impl QuantError {
    /// A short stable identifier of the error kind, for logs and API error codes.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::UnknownType(_) => "unknown_type",
            Self::NotBlockMultiple { .. } => "not_block_multiple",
            Self::ByteLength { .. } => "byte_length",
            Self::LengthMismatch { .. } => "length_mismatch",
            Self::Overflow { .. } => "overflow",
        }
    }
}

/// Checks that `bytes` holds exactly `n_elems` elements of `ty`.
pub(crate) fn check_bytes(ty: GgmlType, n_elems: usize, bytes: &[u8]) -> Result<(), QuantError> {
    let expected = ty.row_bytes(n_elems)?;
    if bytes.len() != expected {
        return Err(QuantError::ByteLength {
            ty,
            n_elems,
            expected,
            actual: bytes.len(),
        });
    }
    Ok(())
}

/// Dequantizes `out.len()` elements of type `ty` from `bytes`, which must be exactly
/// `ty.row_bytes(out.len())` bytes long (any alignment).
///
/// Produces bit-identical results to ggml's / gguf-py's reference dequantization.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
    check_bytes(ty, out.len(), bytes)?;
    scalar::dequantize(ty, bytes, out);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_names_round_trip() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_ggml_id(t.ggml_id()), Some(t));
            assert_eq!(t.name().parse::<GgmlType>().ok(), Some(t));
            assert_eq!(t.name().to_lowercase().parse::<GgmlType>().ok(), Some(t));
            assert_eq!(t.to_string(), t.name());
        }
        assert!(GgmlType::from_ggml_id(6).is_none());
        assert!("Q5_0".parse::<GgmlType>().is_err());
    }

    #[test]
    fn row_bytes() {
        assert_eq!(GgmlType::Q4_1.row_bytes(576).ok(), Some(18 * 20));
        assert_eq!(GgmlType::Q6_K.row_bytes(512).ok(), Some(420));
        assert_eq!(GgmlType::F16.row_bytes(3).ok(), Some(6));
        let e = GgmlType::Q4_K.row_bytes(100);
        assert!(matches!(e, Err(QuantError::NotBlockMultiple { .. })));
        assert!(GgmlType::F32.row_bytes(usize::MAX).is_err());
    }
}
