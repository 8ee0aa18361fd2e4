//! Checkpoint formats: GGUF and safetensors, memory-mapped, tensors used in place; the
//! quantized checkpoints' layouts (GPTQ, AWQ, compressed-tensors, FP8 blocks); a projection's
//! [`Matrix`] in whatever storage it came in, quantized at load (`--quantize`) and cut into a
//! tensor-parallel rank's shard. What the engine loads, what `ferrite quantize` writes beside,
//! and what the tests read.
//!
//! Both formats produce a [`TensorMap`]: tensor name → type, shape (outermost first) and byte
//! range in one of the mapped files. Nothing is copied at load; the model borrows rows
//! straight from the map.
//!
//! It may use the kernels crate (the storage types and their CPU arithmetic) and nothing of
//! the engine: no model, no device, no serving.

pub mod awq;
pub mod compressed;
pub mod error;
pub mod fp8_blocks;
pub mod gguf;
pub mod gptq;
pub mod mxfp4;
mod packing;
pub mod quantized;
pub mod safetensors;
mod shard;

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use ferrite_kernels::cpu::matmul::{Weight, WeightView};
use ferrite_kernels::fp8::{Fp8Activations, Fp8Matrix, Fp8Scales, quantize_fp8_rtn};
use ferrite_kernels::mapped::MappedFile;
use ferrite_kernels::quant::GgmlType;
use ferrite_kernels::w8a8::{I8Matrix, quantize_int8_rtn};
use ferrite_kernels::wq::{WqFormat, WqMatrix, quantize_rtn};
use rayon::prelude::*;

use crate::error::{FormatError, Result};
use quantized::QuantConfig;

/// Where one tensor's bytes are.
#[derive(Debug, Clone)]
pub struct TensorEntry {
    pub ty: GgmlType,
    /// Outermost dimension first: a linear layer's weight is `[out_features, in_features]`.
    pub shape: Vec<usize>,
    pub file: usize,
    pub start: usize,
    pub end: usize,
}

/// The element types of quantized checkpoints' codes (and their I64 shapes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IntType {
    I32,
    I8,
    I64,
    /// FP8 e4m3 (`float8_e4m3fn`): codes, read by [`crate::compressed`].
    F8E4M3,
    /// Bytes: MXFP4's packed codes and exponents ([`crate::mxfp4`]).
    U8,
}

impl IntType {
    pub fn bytes(self) -> usize {
        match self {
            IntType::I32 => 4,
            IntType::I8 | IntType::F8E4M3 | IntType::U8 => 1,
            IntType::I64 => 8,
        }
    }
}

/// Where one little-endian integer (or FP8) tensor's bytes are (codes of a quantized
/// checkpoint).
#[derive(Debug, Clone)]
pub struct IntTensor {
    pub ty: IntType,
    pub shape: Vec<usize>,
    pub file: usize,
    pub start: usize,
    pub end: usize,
}

/// Tensors of a checkpoint, by name, over one or more mapped files.
#[derive(Debug)]
pub struct TensorMap {
    files: Vec<Arc<MappedFile>>,
    entries: HashMap<String, TensorEntry>,
    ints: HashMap<String, IntTensor>,
    /// Set for quantized checkpoints: their linear layers are stored in the format's tensors
    /// (`<stem>.qweight`, `<stem>.weight_packed`, an int8 or FP8 `<stem>.weight`, ...), and
    /// [`Self::matrix`] converts them on request of `<stem>.weight` (see [`quantized`]).
    quant: Option<QuantConfig>,
}

impl TensorMap {
    pub fn new(files: Vec<Arc<MappedFile>>) -> Self {
        Self {
            files,
            entries: HashMap::new(),
            ints: HashMap::new(),
            quant: None,
        }
    }

    pub fn insert(&mut self, name: String, entry: TensorEntry) {
        self.entries.insert(name, entry);
    }

    /// Adds a mapped file, numbered after those before it (what [`TensorEntry::file`] and
    /// [`IntTensor::file`] index).
    pub fn add_file(&mut self, file: Arc<MappedFile>) {
        self.files.push(file);
    }

    pub fn insert_i32(&mut self, name: String, entry: IntTensor) {
        self.ints.insert(name, entry);
    }

    /// Renames every tensor whose name starts with `from` to start with `to` instead (a
    /// multimodal checkpoint's text model under its own prefix read as a text-only one's).
    pub fn rename_prefix(&mut self, from: &str, to: &str) {
        fn renamed<T>(map: HashMap<String, T>, from: &str, to: &str) -> HashMap<String, T> {
            map.into_iter()
                .map(|(k, v)| match k.strip_prefix(from) {
                    Some(rest) => (format!("{to}{rest}"), v),
                    None => (k, v),
                })
                .collect()
        }
        self.entries = renamed(std::mem::take(&mut self.entries), from, to);
        self.ints = renamed(std::mem::take(&mut self.ints), from, to);
    }

    /// Whether a tensor (or, in a quantized checkpoint, a quantized linear layer) has this name.
    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name) || self.quantized_stem(name).is_some()
    }

    /// The names of the float tensors, then of the integer ones.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.entries
            .keys()
            .chain(self.ints.keys())
            .map(String::as_str)
    }

    /// A float tensor's stored bytes.
    pub fn bytes(&self, name: &str) -> Option<&[u8]> {
        let e = self.entries.get(name)?;
        Some(&self.files[e.file].bytes()[e.start..e.end])
    }

    /// The shape and stored bytes of integer (or FP8) tensor `name` of type `ty`.
    pub fn int_bytes(&self, name: &str, ty: IntType) -> Result<(Vec<usize>, &[u8])> {
        let e = self
            .ints
            .get(name)
            .filter(|e| e.ty == ty)
            .ok_or_else(|| FormatError::MissingTensor(format!("{name} ({ty:?})")))?;
        Ok((e.shape.clone(), &self.files[e.file].bytes()[e.start..e.end]))
    }

    /// The type of integer (or FP8) tensor `name`, if there is one.
    pub fn int_type(&self, name: &str) -> Option<IntType> {
        self.ints.get(name).map(|e| e.ty)
    }

    /// An i32 tensor's shape and values.
    pub fn i32_tensor(&self, name: &str) -> Result<(Vec<usize>, Vec<i32>)> {
        let (shape, bytes) = self.int_bytes(name, IntType::I32)?;
        let values = bytes
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok((shape, values))
    }

    /// An i64 tensor's shape and values.
    pub fn i64_tensor(&self, name: &str) -> Result<(Vec<usize>, Vec<i64>)> {
        let (shape, bytes) = self.int_bytes(name, IntType::I64)?;
        let values = bytes
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
            .collect();
        Ok((shape, values))
    }

    /// An i8 tensor's shape and values.
    pub fn i8_tensor(&self, name: &str) -> Result<(Vec<usize>, Vec<i8>)> {
        let (shape, bytes) = self.int_bytes(name, IntType::I8)?;
        Ok((shape, bytes.iter().map(|&b| b as i8).collect()))
    }

    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.entries.get(name)
    }

    pub fn len(&self) -> usize {
        self.entries.len() + self.ints.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Reads every mapped file into memory (see [`MappedFile::load_pages`]); returns the bytes.
    pub fn load_pages(&self) -> usize {
        self.files.iter().map(|f| f.load_pages()).sum()
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> usize {
        let ints: usize = self.ints.values().map(|e| e.end - e.start).sum();
        ints + self
            .entries
            .values()
            .map(|e| e.end - e.start)
            .sum::<usize>()
    }

    /// A 2-D tensor as a matrix kept in place in the map (or, for a quantized layer,
    /// converted to the layout ferrite computes it in).
    pub fn matrix(&self, name: &str) -> Result<Matrix> {
        if let Some(stem) = self.quantized_stem(name) {
            return self.quantized_matrix(stem);
        }
        self.mapped_matrix(name, None)
    }

    /// A 3-D tensor `[count, rows, cols]` (GGUF's stacked experts) as one `[count * rows,
    /// cols]` matrix kept in place: each of its `count` parts is a run of whole rows.
    pub fn stacked_matrix(&self, name: &str, count: usize) -> Result<Matrix> {
        self.mapped_matrix(name, Some(count))
    }

    /// Tensor `name` as a matrix in place: 2-D, or 3-D with `stack` parts laid row after row.
    fn mapped_matrix(&self, name: &str, stack: Option<usize>) -> Result<Matrix> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor(name.to_owned()))?;
        let (rows, cols) = match (e.shape.as_slice(), stack) {
            ([r, c], None) => (*r, *c),
            ([n, r, c], Some(count)) if *n == count => (n * r, *c),
            (other, _) => {
                let want =
                    stack.map_or("2 dimensions".to_owned(), |n| format!("[{n}, rows, cols]"));
                return Err(FormatError::BadTensor {
                    name: name.to_owned(),
                    reason: format!("expected {want}, found shape {other:?}"),
                });
            }
        };
        // Validate once here so `view()` cannot fail later.
        let file = self.files[e.file].clone();
        WeightView::new(e.ty, rows, cols, &file.bytes()[e.start..e.end]).map_err(|err| {
            FormatError::BadTensor {
                name: name.to_owned(),
                reason: err.to_string(),
            }
        })?;
        Ok(Matrix {
            rows,
            cols,
            storage: Storage::Mapped {
                ty: e.ty,
                file,
                start: e.start,
                end: e.end,
            },
        })
    }

    /// A tensor of any shape, dequantized to f32 (norm weights, biases: small tensors).
    pub fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| FormatError::MissingTensor(name.to_owned()))?;
        let n: usize = e.shape.iter().product();
        let mut out = vec![0f32; n];
        let bytes = &self.files[e.file].bytes()[e.start..e.end];
        ferrite_kernels::quant::dequantize(e.ty, bytes, &mut out).map_err(|err| {
            FormatError::BadTensor {
                name: name.to_owned(),
                reason: err.to_string(),
            }
        })?;
        Ok(out)
    }

    /// Like [`Self::vector`], checking the element count.
    pub fn vector_of_len(&self, name: &str, len: usize) -> Result<Vec<f32>> {
        let v = self.vector(name)?;
        if v.len() != len {
            return Err(FormatError::BadTensor {
                name: name.to_owned(),
                reason: format!("expected {len} elements, found {}", v.len()),
            });
        }
        Ok(v)
    }
}

/// A matrix in the weight-only layout ([`Matrix::as_wq`]): `w = scale·(q − zero) + min` per
/// group.
#[derive(Debug)]
pub struct WqView<'a> {
    pub matrix: Cow<'a, WqMatrix>,
    /// `rows * groups` minimums, row-major (GGUF's Q4_1, Q4_K and Q5_K); `None` where all are 0.
    pub mins: Option<Vec<f32>>,
}

/// A weight matrix `[rows, cols]`: bytes in place in a mapped file, or weight-only quantized
/// codes (converted from a GPTQ checkpoint, or quantized at load).
#[derive(Debug, Clone)]
pub struct Matrix {
    pub rows: usize,
    pub cols: usize,
    storage: Storage,
}

#[derive(Debug, Clone)]
enum Storage {
    Mapped {
        ty: GgmlType,
        file: Arc<MappedFile>,
        start: usize,
        end: usize,
    },
    /// A GGUF/float type in memory of its own: the columns of a rank's shard, copied out of
    /// the map (a column slice is not contiguous there).
    Owned {
        ty: GgmlType,
        bytes: Arc<[u8]>,
    },
    Quantized(Arc<WqMatrix>),
    /// W8A8: int8 codes with per-row scales; activations quantized per token at run time.
    Int8(Arc<I8Matrix>),
    /// FP8 e4m3 codes, dequantized to f32 for the CPU; activations rounded through FP8.
    Fp8(Arc<Fp8Matrix>),
}

impl Matrix {
    pub fn from_wq(w: WqMatrix) -> Self {
        Self {
            rows: w.rows(),
            cols: w.cols(),
            storage: Storage::Quantized(Arc::new(w)),
        }
    }

    pub fn from_i8(w: I8Matrix) -> Self {
        Self {
            rows: w.rows(),
            cols: w.cols(),
            storage: Storage::Int8(Arc::new(w)),
        }
    }

    pub fn from_fp8(w: Fp8Matrix) -> Self {
        Self {
            rows: w.rows(),
            cols: w.cols(),
            storage: Storage::Fp8(Arc::new(w)),
        }
    }

    /// A row-major f32 `[rows, cols]` matrix held in memory (calibration's working copies).
    ///
    /// # Panics
    /// If `w.len() != rows * cols`.
    pub fn from_f32(rows: usize, cols: usize, w: &[f32]) -> Self {
        assert_eq!(w.len(), rows * cols, "{rows}x{cols} f32 matrix");
        Self {
            rows,
            cols,
            storage: Storage::Owned {
                ty: GgmlType::F32,
                bytes: w.iter().flat_map(|v| v.to_le_bytes()).collect(),
            },
        }
    }

    /// The matrix as the kernels see it. Checked at construction, so this cannot fail.
    pub fn view(&self) -> Weight<'_> {
        match &self.storage {
            Storage::Mapped {
                ty,
                file,
                start,
                end,
            } => Weight::Ggml(WeightView {
                ty: *ty,
                rows: self.rows,
                cols: self.cols,
                bytes: &file.bytes()[*start..*end],
            }),
            Storage::Owned { ty, bytes } => Weight::Ggml(WeightView {
                ty: *ty,
                rows: self.rows,
                cols: self.cols,
                bytes,
            }),
            Storage::Quantized(w) => Weight::Wq(w),
            Storage::Int8(w) => Weight::I8(w),
            Storage::Fp8(w) => Weight::F8(w),
        }
    }

    /// How the matrix is stored: a GGUF type name (`F16`, `Q4_K`) or a weight format (`w4g128`).
    pub fn storage_name(&self) -> String {
        match &self.storage {
            Storage::Mapped { ty, .. } | Storage::Owned { ty, .. } => ty.to_string(),
            Storage::Quantized(w) if w.int8_activations() => format!("{}-a8", w.format()),
            Storage::Quantized(w) => w.format().to_string(),
            Storage::Int8(_) => "w8a8-int8".to_owned(),
            Storage::Fp8(w) => match w.layout() {
                ferrite_kernels::fp8::Fp8Scales::Block { rows, cols } => {
                    format!("fp8-e4m3-b{rows}x{cols}")
                }
                _ => "fp8-e4m3".to_owned(),
            },
        }
    }

    /// Row `i` as f32.
    ///
    /// # Panics
    /// If `i >= rows` or `out.len() != cols`.
    pub fn dequantize_row(&self, i: usize, out: &mut [f32]) {
        match self.view() {
            Weight::Ggml(v) => {
                // The view was validated at construction, so the row has the right bytes.
                let _ = ferrite_kernels::quant::dequantize(v.ty, v.row(i), out);
            }
            Weight::Wq(w) => w.dequantize_row(i, out),
            Weight::I8(w) => w.dequantize_row(i, out),
            Weight::F8(w) => w.dequantize_row(i, out),
        }
    }

    /// The whole matrix as f32, row-major.
    pub fn to_f32(&self) -> Vec<f32> {
        let mut w = vec![0f32; self.rows * self.cols];
        w.par_chunks_mut(self.cols.max(1))
            .enumerate()
            .for_each(|(i, row)| self.dequantize_row(i, row));
        w
    }

    /// The codes of this matrix (named `name` in errors) quantized to `format` by
    /// round-to-nearest, rows dequantized to f32 first.
    pub fn rtn_codes(&self, name: &str, format: WqFormat) -> Result<WqMatrix> {
        quantize_rtn(&self.to_f32(), self.rows, self.cols, format).map_err(|e| {
            FormatError::BadTensor {
                name: name.to_owned(),
                reason: format!("cannot quantize to {format}: {e}"),
            }
        })
    }

    /// This matrix (named `name` in errors) quantized as `q` says by round-to-nearest, rows
    /// dequantized to f32 first.
    pub fn quantize_rtn(&self, name: &str, q: LoadQuantize) -> Result<Self> {
        let bad = |e: String| FormatError::BadTensor {
            name: name.to_owned(),
            reason: format!("cannot quantize to {q}: {e}"),
        };
        match q {
            LoadQuantize::Weights(f) => self.rtn_codes(name, f).map(Self::from_wq),
            LoadQuantize::W8A8 => quantize_int8_rtn(&self.to_f32(), self.rows, self.cols)
                .map(Self::from_i8)
                .map_err(|e| bad(e.to_string())),
            LoadQuantize::Fp8 => {
                let (layout, act) = (Fp8Scales::Channel, Fp8Activations::DynamicPerToken);
                quantize_fp8_rtn(&self.to_f32(), self.rows, self.cols, layout, act)
                    .map(Self::from_fp8)
                    .map_err(|e| bad(e.to_string()))
            }
        }
    }

    /// This matrix in the weight-only layout: a quantized matrix as it is, a GGUF block type
    /// repacked with its per-group minimums (Q8_0, Q4_0 and Q4_1 exactly; the K-quants within
    /// the bounds of `ferrite_kernels::wq::gguf`); `None` for the float types.
    pub fn as_wq(&self) -> Option<WqView<'_>> {
        match self.view() {
            Weight::Wq(w) => Some(WqView {
                matrix: Cow::Borrowed(w),
                mins: None,
            }),
            Weight::Ggml(v) => ferrite_kernels::wq::gguf::from_gguf(v.ty, v.rows, v.cols, v.bytes)
                .and_then(Result::ok)
                .map(|r| WqView {
                    matrix: Cow::Owned(r.matrix),
                    mins: r.mins,
                }),
            Weight::I8(_) | Weight::F8(_) => None,
        }
    }

    /// Whether `other` is this very matrix (the same bytes of the same file, or the same
    /// quantized copy): tied embeddings.
    pub fn same_storage(&self, other: &Matrix) -> bool {
        match (&self.storage, &other.storage) {
            (
                Storage::Mapped {
                    file: a, start: s1, ..
                },
                Storage::Mapped {
                    file: b, start: s2, ..
                },
            ) => Arc::ptr_eq(a, b) && s1 == s2,
            (Storage::Owned { bytes: a, .. }, Storage::Owned { bytes: b, .. }) => Arc::ptr_eq(a, b),
            (Storage::Quantized(a), Storage::Quantized(b)) => Arc::ptr_eq(a, b),
            (Storage::Int8(a), Storage::Int8(b)) => Arc::ptr_eq(a, b),
            (Storage::Fp8(a), Storage::Fp8(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    /// Stored bytes (what a forward reads).
    pub fn bytes_len(&self) -> usize {
        match &self.storage {
            Storage::Mapped { start, end, .. } => end - start,
            Storage::Owned { bytes, .. } => bytes.len(),
            Storage::Quantized(w) => w.bytes_len(),
            Storage::Int8(w) => w.bytes_len(),
            Storage::Fp8(w) => w.bytes_len(),
        }
    }

    /// The FP8 matrix of an FP8 weight.
    pub fn as_fp8(&self) -> Option<&Fp8Matrix> {
        match &self.storage {
            Storage::Fp8(w) => Some(w),
            _ => None,
        }
    }

    /// The int8 matrix of a W8A8 weight.
    pub fn as_i8(&self) -> Option<&I8Matrix> {
        match &self.storage {
            Storage::Int8(w) => Some(w),
            _ => None,
        }
    }

    /// Checks the shape is `[rows, cols]`.
    pub fn expect_shape(self, name: &str, rows: usize, cols: usize) -> Result<Self> {
        if self.rows != rows || self.cols != cols {
            return Err(FormatError::BadTensor {
                name: name.to_owned(),
                reason: format!(
                    "expected shape [{rows}, {cols}], found [{}, {}]",
                    self.rows, self.cols
                ),
            });
        }
        Ok(self)
    }
}

/// What `--quantize` rounds a model's projections to as it loads (round to nearest).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LoadQuantize {
    /// Weight-only codes (`rtn-w4g128`, `rtn-w8pc-sym`, ...).
    Weights(WqFormat),
    /// int8 weights per channel, int8 activations per token (`rtn-w8a8`).
    W8A8,
    /// FP8 e4m3 weights per channel, FP8 activations per token (`rtn-fp8`).
    Fp8,
}

impl LoadQuantize {
    /// The weight-only group length (what a column shard must keep whole).
    pub fn group_size(&self) -> Option<usize> {
        match self {
            Self::Weights(f) => f.group_size,
            Self::W8A8 | Self::Fp8 => None,
        }
    }
}

/// What follows `rtn-` in a `--quantize` value.
impl std::fmt::Display for LoadQuantize {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Weights(w) => write!(f, "{w}"),
            Self::W8A8 => f.write_str("w8a8"),
            Self::Fp8 => f.write_str("fp8"),
        }
    }
}

/// `w8a8`, `fp8`, or a weight format (`w4g128`): what [`LoadQuantize`]'s `Display` writes.
impl std::str::FromStr for LoadQuantize {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "w8a8" => Ok(Self::W8A8),
            "fp8" => Ok(Self::Fp8),
            f => f.parse().map(Self::Weights).map_err(|e| format!("{e}")),
        }
    }
}
