//! `pack-quantized` layers, converted to and from [`WqMatrix`]. A linear layer `<stem>` of
//! `out` × `in` features with `g` groups per row (1 for strategy `channel`) is stored as:
//!
//! - `<stem>.weight_packed`: i32 `[out, ceil(in · bits / 32)]`: each row's codes packed along
//!   the *input* dimension as one dense little-endian bit stream (compressed-tensors'
//!   `pack_to_int32`; 3-bit codes straddle words); a code is the signed value plus
//!   `2^(bits-1)`, so it is unsigned;
//! - `<stem>.weight_scale`: float `[out, g]`;
//! - `<stem>.weight_zero_point` (asymmetric only): the signed zero points plus `2^(bits-1)`,
//!   packed the same way along the *output* dimension, i32 `[ceil(out · bits / 32), g]` (an int8
//!   `[out, g]` of signed zero points is read too);
//! - `<stem>.weight_shape`: i64 `[out, in]`.
//!
//! Values are `scale · (q − zero)` with both offset alike: the [`WqMatrix`] convention, the
//! symmetric zero being `2^(bits-1)`.

use ferrite_kernels::wq::{Bits, ScaleType, WqMatrix};

use crate::error::{FormatError, Result};
use crate::packing::{Unpacked, pack, stored_scales, unpack};
use crate::{IntType, TensorMap};

/// The unsigned value of signed code 0.
pub(super) fn offset(bits: Bits) -> u8 {
    1 << (bits.get() - 1)
}

/// Converts layer `<stem>` to a [`WqMatrix`].
pub(super) fn load_linear(
    t: &TensorMap,
    stem: &str,
    bits: Bits,
    group_size: Option<usize>,
    sym: bool,
) -> Result<WqMatrix> {
    let name = |part: &str| format!("{stem}.{part}");
    let bad = |reason: String| FormatError::BadTensor {
        name: name("weight_packed"),
        reason,
    };
    if t.int_type(&name("weight_g_idx")).is_some() {
        return Err(bad(
            "has a weight_g_idx (act-order), which is not supported: its groups are not \
             contiguous"
                .into(),
        ));
    }
    let (pshape, packed) = t.i32_tensor(&name("weight_packed"))?;
    let [rows, words] = pshape[..] else {
        return Err(bad(format!("shape {pshape:?} is not 2-D")));
    };
    let cols = match t.int_type(&name("weight_shape")) {
        Some(_) => match t.i64_tensor(&name("weight_shape"))?.1[..] {
            [r, c] if usize::try_from(r) == Ok(rows) => usize::try_from(c).unwrap_or(0),
            ref other => return Err(bad(format!("weight_shape {other:?} for {rows} rows"))),
        },
        None => words * 32 / bits.get() as usize,
    };
    if words != (cols * bits.get() as usize).div_ceil(32) {
        return Err(bad(format!(
            "{words} words per row do not hold {cols} {}-bit codes",
            bits.get()
        )));
    }
    let (scales, scale_type, zeros) = group_params(t, stem, [rows, cols], bits, group_size, sym)?;
    let mut codes = Vec::with_capacity(rows * cols);
    for row in packed.chunks_exact(words.max(1)) {
        codes.extend(unpack(row, bits, cols).ok_or_else(|| bad("too few words".into()))?);
    }
    let u = Unpacked {
        rows,
        cols,
        codes,
        scales,
        zeros,
    };
    u.into_wq(bits, group_size, scale_type, sym)
        .map_err(|e| bad(e.to_string()))
}

/// Layer `<stem>`'s `weight_scale` `[rows, groups]` (with its stored type) and unsigned zero
/// points (`weight_zero_point`, or the symmetric zero): the same for packed and unpacked codes.
pub(super) fn group_params(
    t: &TensorMap,
    stem: &str,
    [rows, cols]: [usize; 2],
    bits: Bits,
    group_size: Option<usize>,
    sym: bool,
) -> Result<(Vec<f32>, ScaleType, Vec<u8>)> {
    let groups = group_size.map_or(1, |g| cols.div_ceil(g.max(1)));
    let (scales, scale_type) = stored_scales(t, &format!("{stem}.weight_scale"), [rows, groups])?;
    let zeros = if sym {
        vec![offset(bits); rows * groups]
    } else {
        let name = format!("{stem}.weight_zero_point");
        zero_points(t, &name, bits, rows, groups)?
    };
    Ok((scales, scale_type, zeros))
}

/// The unsigned zero points `[rows, groups]` of tensor `name`: i32 packed along the rows, or
/// int8 signed values.
fn zero_points(
    t: &TensorMap,
    name: &str,
    bits: Bits,
    rows: usize,
    groups: usize,
) -> Result<Vec<u8>> {
    let bad = |reason: String| FormatError::BadTensor {
        name: name.to_owned(),
        reason,
    };
    if t.int_type(name) == Some(IntType::I8) {
        let (shape, z) = t.i8_tensor(name)?;
        if shape != [rows, groups] {
            return Err(bad(format!("shape {shape:?}, expected [{rows}, {groups}]")));
        }
        return z
            .iter()
            .map(|&v| {
                u8::try_from(i16::from(v) + i16::from(offset(bits)))
                    .ok()
                    .filter(|&u| u <= bits.max_code())
                    .ok_or_else(|| bad(format!("zero point {v} does not fit {} bits", bits.get())))
            })
            .collect();
    }
    let (shape, words) = t.i32_tensor(name)?;
    let word_rows = (rows * bits.get() as usize).div_ceil(32);
    if shape != [word_rows, groups] {
        return Err(bad(format!(
            "shape {shape:?}, expected [{word_rows}, {groups}] (packed along the rows)"
        )));
    }
    let mut zeros = vec![0u8; rows * groups];
    for g in 0..groups {
        let column: Vec<i32> = (0..word_rows).map(|wr| words[wr * groups + g]).collect();
        let z = unpack(&column, bits, rows).ok_or_else(|| bad("too few words".into()))?;
        for (r, z) in z.into_iter().enumerate() {
            zeros[r * groups + g] = z;
        }
    }
    Ok(zeros)
}

/// One linear layer in `pack-quantized` tensors, ready to write.
#[derive(Debug)]
pub struct PackedTensors {
    /// `[rows, ceil(cols · bits / 32)]`.
    pub weight_packed: Vec<i32>,
    /// `[rows, groups]`, f16 or bf16 bits as `scale_type` says.
    pub weight_scale: Vec<u16>,
    pub scale_type: ScaleType,
    /// `[ceil(rows · bits / 32), groups]` for asymmetric formats.
    pub weight_zero_point: Option<Vec<i32>>,
    pub rows: usize,
    pub cols: usize,
    pub groups: usize,
}

impl PackedTensors {
    /// `w` in the `pack-quantized` layout.
    pub fn from_wq(w: &WqMatrix) -> Result<Self> {
        let format = w.format();
        let (rows, cols, groups) = (w.rows(), w.cols(), w.groups_per_row());
        let weight_scale = w
            .scales()
            .iter()
            .map(|&s| format.scale_type.to_bits(s))
            .collect();
        let weight_zero_point = format.zero_point.then(|| {
            // Transposed so consecutive rows share a word, as `pack_to_int32(packed_dim=0)`.
            let zeros = w.zeros();
            let by_group: Vec<u8> = (0..groups)
                .flat_map(|g| (0..rows).map(move |r| (g, r)))
                .map(|(g, r)| zeros[r * groups + g])
                .collect();
            // One bit stream per group's column of rows, then [word_rows, groups] row-major.
            let word_rows = (rows * format.bits.get() as usize).div_ceil(32);
            let columns: Vec<Vec<i32>> = by_group
                .chunks(rows)
                .map(|c| pack(c, format.bits))
                .collect();
            (0..word_rows * groups)
                .map(|i| columns[i % groups][i / groups])
                .collect()
        });
        let codes = w.codes();
        Ok(Self {
            weight_packed: codes
                .chunks(cols)
                .flat_map(|row| pack(row, format.bits))
                .collect(),
            weight_scale,
            scale_type: format.scale_type,
            weight_zero_point,
            rows,
            cols,
            groups,
        })
    }
}
