//! Cutting a [`Matrix`] into one rank's shard (see [`crate::tp`]): rows for the column-parallel
//! projections, columns for the row-parallel ones.
//!
//! Rows are contiguous in every format, so a row slice of a mapped tensor stays in the map
//! (the rank reads only its rows' pages). A column slice is copied out, row by row, in whole
//! blocks of the stored type (whole groups of a weight-only format): the rank reads only its
//! columns, and the copy is its shard, never the whole matrix.

use std::ops::Range;
use std::sync::Arc;

use super::{Matrix, Storage};
use crate::error::{FormatError, Result};

impl Matrix {
    /// The column alignment a column slice needs: the block length of a GGUF type, the group
    /// length of a weight-only format (1 for the float types and per-channel formats).
    pub fn col_align(&self) -> usize {
        match &self.storage {
            Storage::Mapped { ty, .. } | Storage::Owned { ty, .. } => ty.block_elems(),
            Storage::Quantized(w) => w.format().group_size.unwrap_or(1),
            Storage::Int8(_) | Storage::Fp8(_) => 1,
        }
    }

    /// Rows `rows` of this matrix (named `name` in errors).
    pub fn slice_rows(&self, name: &str, rows: Range<usize>) -> Result<Matrix> {
        self.check_range(name, "rows", &rows, self.rows)?;
        if rows == (0..self.rows) {
            return Ok(self.clone());
        }
        let storage = match &self.storage {
            Storage::Mapped {
                ty,
                file,
                start,
                end: _,
            } => {
                let rb = self.row_bytes(name)?;
                Storage::Mapped {
                    ty: *ty,
                    file: file.clone(),
                    start: start + rows.start * rb,
                    end: start + rows.end * rb,
                }
            }
            Storage::Owned { ty, bytes } => {
                let rb = self.row_bytes(name)?;
                Storage::Owned {
                    ty: *ty,
                    bytes: Arc::from(&bytes[rows.start * rb..rows.end * rb]),
                }
            }
            Storage::Quantized(w) => Storage::Quantized(Arc::new(
                w.slice(rows.clone(), 0..self.cols)
                    .map_err(|e| bad(name, e.to_string()))?,
            )),
            Storage::Int8(w) => Storage::Int8(Arc::new(
                w.slice(rows.clone(), 0..self.cols)
                    .map_err(|e| bad(name, e.to_string()))?,
            )),
            Storage::Fp8(w) => Storage::Fp8(Arc::new(
                w.slice(rows.clone(), 0..self.cols)
                    .map_err(|e| bad(name, e.to_string()))?,
            )),
        };
        Ok(Matrix {
            rows: rows.len(),
            cols: self.cols,
            storage,
        })
    }

    /// Columns `cols` of this matrix (named `name` in errors), which must start and end on
    /// whole blocks (groups) of its stored format.
    pub fn slice_cols(&self, name: &str, cols: Range<usize>) -> Result<Matrix> {
        self.check_range(name, "columns", &cols, self.cols)?;
        if cols == (0..self.cols) {
            return Ok(self.clone());
        }
        let storage = match &self.storage {
            Storage::Mapped { ty, .. } | Storage::Owned { ty, .. } => {
                let be = ty.block_elems();
                if !cols.start.is_multiple_of(be) || !cols.end.is_multiple_of(be) {
                    return Err(bad(
                        name,
                        format!("columns {cols:?} are not whole blocks of {be} of {ty}"),
                    ));
                }
                let rb = self.row_bytes(name)?;
                let bb = ty.block_bytes();
                let within = cols.start / be * bb..cols.end / be * bb;
                let bytes = match self.view() {
                    ferrite_kernels::cpu::matmul::Weight::Ggml(v) => v.bytes,
                    _ => &[],
                };
                let mut out = Vec::with_capacity(self.rows * within.len());
                for row in bytes.chunks_exact(rb) {
                    out.extend_from_slice(&row[within.clone()]);
                }
                // The copy is the shard: the full rows' pages need not stay in memory.
                if let Storage::Mapped {
                    file, start, end, ..
                } = &self.storage
                {
                    file.release_range(*start, *end);
                }
                Storage::Owned {
                    ty: *ty,
                    bytes: Arc::from(out),
                }
            }
            Storage::Quantized(w) => Storage::Quantized(Arc::new(
                w.slice(0..self.rows, cols.clone())
                    .map_err(|e| bad(name, e.to_string()))?,
            )),
            Storage::Int8(w) => Storage::Int8(Arc::new(
                w.slice(0..self.rows, cols.clone())
                    .map_err(|e| bad(name, e.to_string()))?,
            )),
            Storage::Fp8(w) => Storage::Fp8(Arc::new(
                w.slice(0..self.rows, cols.clone())
                    .map_err(|e| bad(name, e.to_string()))?,
            )),
        };
        Ok(Matrix {
            rows: self.rows,
            cols: cols.len(),
            storage,
        })
    }

    /// Brings this matrix's bytes into memory now: the pages of its rows in a mapped file
    /// (what a rank reads of a checkpoint). Returns the bytes.
    pub fn load_pages(&self) -> usize {
        match &self.storage {
            Storage::Mapped {
                file, start, end, ..
            } => file.load_range(*start, *end),
            Storage::Owned { bytes, .. } => bytes.len(),
            Storage::Quantized(w) => w.bytes_len(),
            Storage::Int8(w) => w.bytes_len(),
            Storage::Fp8(w) => w.bytes_len(),
        }
    }

    /// Columns `picks` of this float matrix (F32, F16 or BF16), in that order, as the rows of
    /// a matrix of its own type: what a checkpoint stored `[in, out]` (gpt-oss's experts in
    /// bf16) is to a projection, whose rows are its outputs. Copies: the transposed rows are
    /// not in the map.
    pub fn columns_as_rows(&self, name: &str, picks: &[usize]) -> Result<Matrix> {
        let bad = |reason: String| FormatError::BadTensor {
            name: name.to_owned(),
            reason: format!("cannot read its columns as rows: {reason}"),
        };
        let (ty, bytes) = match self.view() {
            ferrite_kernels::cpu::matmul::Weight::Ggml(v) if !v.ty.is_quantized() => {
                (v.ty, v.bytes)
            }
            _ => return Err(bad(format!("it is {}", self.storage_name()))),
        };
        if let Some(c) = picks.iter().find(|&&c| c >= self.cols) {
            return Err(bad(format!("column {c} of {}", self.cols)));
        }
        let size = ty.block_bytes();
        let mut out = Vec::with_capacity(picks.len() * self.rows * size);
        for &c in picks {
            for r in 0..self.rows {
                let at = (r * self.cols + c) * size;
                out.extend_from_slice(&bytes[at..at + size]);
            }
        }
        Ok(Matrix {
            rows: picks.len(),
            cols: self.rows,
            storage: Storage::Owned {
                ty,
                bytes: Arc::from(out),
            },
        })
    }

    fn check_range(&self, name: &str, what: &str, r: &Range<usize>, n: usize) -> Result<()> {
        if r.is_empty() || r.end > n {
            return Err(bad(name, format!("{what} {r:?} of {n}")));
        }
        Ok(())
    }

    fn row_bytes(&self, name: &str) -> Result<usize> {
        match &self.storage {
            Storage::Mapped { ty, .. } | Storage::Owned { ty, .. } => ty
                .row_bytes(self.cols)
                .map_err(|e| bad(name, e.to_string())),
            Storage::Quantized(_) | Storage::Int8(_) | Storage::Fp8(_) => {
                Err(bad(name, "quantized rows have no byte length".into()))
            }
        }
    }
}

fn bad(name: &str, reason: String) -> FormatError {
    FormatError::BadTensor {
        name: name.to_owned(),
        reason: format!("cannot cut a shard: {reason}"),
    }
}
