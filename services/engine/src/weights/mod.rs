//! Weight files: GGUF and safetensors, memory-mapped, tensors used in place.
//!
//! Both formats produce a [`TensorMap`]: tensor name → type, shape (outermost first) and byte
//! range in one of the mapped files. Nothing is copied at load; the model borrows rows
//! straight from the map.

pub mod gguf;
pub mod safetensors;

use std::collections::HashMap;
use std::sync::Arc;

use ferrite_kernels::cpu::matmul::WeightView;
use ferrite_kernels::mapped::MappedFile;
use ferrite_kernels::quant::GgmlType;

use crate::error::{EngineError, Result};

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

/// Tensors of a checkpoint, by name, over one or more mapped files.
#[derive(Debug)]
pub struct TensorMap {
    files: Vec<Arc<MappedFile>>,
    entries: HashMap<String, TensorEntry>,
}

impl TensorMap {
    pub fn new(files: Vec<Arc<MappedFile>>) -> Self {
        Self {
            files,
            entries: HashMap::new(),
        }
    }

    pub fn insert(&mut self, name: String, entry: TensorEntry) {
        self.entries.insert(name, entry);
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    pub fn entry(&self, name: &str) -> Option<&TensorEntry> {
        self.entries.get(name)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Reads every mapped file into memory (see [`MappedFile::load_pages`]); returns the bytes.
    pub fn load_pages(&self) -> usize {
        self.files.iter().map(|f| f.load_pages()).sum()
    }

    /// Total bytes of tensor data.
    pub fn total_bytes(&self) -> usize {
        self.entries.values().map(|e| e.end - e.start).sum()
    }

    /// A 2-D tensor as a matrix kept in place in the map.
    pub fn matrix(&self, name: &str) -> Result<Matrix> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| EngineError::MissingTensor(name.to_owned()))?;
        let (rows, cols) = match e.shape.as_slice() {
            [r, c] => (*r, *c),
            other => {
                return Err(EngineError::BadTensor {
                    name: name.to_owned(),
                    reason: format!("expected 2 dimensions, found shape {other:?}"),
                });
            }
        };
        let m = Matrix {
            ty: e.ty,
            rows,
            cols,
            file: self.files[e.file].clone(),
            start: e.start,
            end: e.end,
        };
        // Validate once here so `view()` cannot fail later.
        m.try_view().map_err(|err| EngineError::BadTensor {
            name: name.to_owned(),
            reason: err.to_string(),
        })?;
        Ok(m)
    }

    /// A tensor of any shape, dequantized to f32 (norm weights, biases: small tensors).
    pub fn vector(&self, name: &str) -> Result<Vec<f32>> {
        let e = self
            .entries
            .get(name)
            .ok_or_else(|| EngineError::MissingTensor(name.to_owned()))?;
        let n: usize = e.shape.iter().product();
        let mut out = vec![0f32; n];
        let bytes = &self.files[e.file].bytes()[e.start..e.end];
        ferrite_kernels::quant::dequantize(e.ty, bytes, &mut out).map_err(|err| {
            EngineError::BadTensor {
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
            return Err(EngineError::BadTensor {
                name: name.to_owned(),
                reason: format!("expected {len} elements, found {}", v.len()),
            });
        }
        Ok(v)
    }
}

/// A weight matrix `[rows, cols]` whose bytes live in a mapped file.
#[derive(Debug, Clone)]
pub struct Matrix {
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    file: Arc<MappedFile>,
    start: usize,
    end: usize,
}

impl Matrix {
    fn try_view(&self) -> Result<WeightView<'_>, ferrite_kernels::quant::QuantError> {
        WeightView::new(
            self.ty,
            self.rows,
            self.cols,
            &self.file.bytes()[self.start..self.end],
        )
    }

    /// The matrix as the kernels see it. Checked at construction, so this cannot fail.
    pub fn view(&self) -> WeightView<'_> {
        let bytes = &self.file.bytes()[self.start..self.end];
        WeightView {
            ty: self.ty,
            rows: self.rows,
            cols: self.cols,
            bytes,
        }
    }

    pub fn bytes_len(&self) -> usize {
        self.end - self.start
    }

    /// Checks the shape is `[rows, cols]`.
    pub fn expect_shape(self, name: &str, rows: usize, cols: usize) -> Result<Self> {
        if self.rows != rows || self.cols != cols {
            return Err(EngineError::BadTensor {
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
