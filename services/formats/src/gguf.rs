//! GGUF v2/v3 reader: metadata and tensor directory, with tensor data left in the memory map.
//!
//! Every read is bounds-checked against the file: a truncated or corrupt file gives
//! [`FormatError::BadGguf`] naming what was wrong, never a panic or an out-of-bounds read.
//! Counts and lengths from the header are checked against the bytes left before anything is
//! allocated for them, so a corrupt count cannot ask for gigabytes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use ferrite_kernels::mapped::MappedFile;
use ferrite_kernels::quant::GgmlType;

use super::{TensorEntry, TensorMap};
use crate::error::{FormatError, Result};

const GGUF_MAGIC: &[u8; 4] = b"GGUF";
const DEFAULT_ALIGNMENT: u64 = 32;
const MAX_DIMS: u32 = 4;

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum GgufValue {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    String(String),
    Array(Vec<GgufValue>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer of any width.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            GgufValue::U8(v) => Some(v.into()),
            GgufValue::U16(v) => Some(v.into()),
            GgufValue::U32(v) => Some(v.into()),
            GgufValue::U64(v) => Some(v),
            GgufValue::I8(v) => u64::try_from(v).ok(),
            GgufValue::I16(v) => u64::try_from(v).ok(),
            GgufValue::I32(v) => u64::try_from(v).ok(),
            GgufValue::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            GgufValue::F32(v) => Some(v.into()),
            GgufValue::F64(v) => Some(v),
            _ => self.as_u64().map(|v| v as f64),
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::String(s) => Some(s),
            _ => None,
        }
    }

    pub fn as_bool(&self) -> Option<bool> {
        match *self {
            GgufValue::Bool(b) => Some(b),
            _ => None,
        }
    }

    pub fn as_array(&self) -> Option<&[GgufValue]> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }
}

/// A parsed GGUF file: its metadata, and its tensors as ranges of the mapped file.
#[derive(Debug)]
pub struct GgufFile {
    pub version: u32,
    pub metadata: HashMap<String, GgufValue>,
    pub tensors: TensorMap,
}

impl GgufFile {
    /// Maps and parses `path`. Tensor data is not read.
    pub fn open(path: &Path) -> Result<Self> {
        let file = MappedFile::open(path).map_err(|source| FormatError::Io {
            path: path.to_owned(),
            source,
        })?;
        let file = Arc::new(file);
        let mut reader = Reader {
            bytes: file.bytes(),
            pos: 0,
            path: path.to_owned(),
        };
        let (version, metadata, infos) = reader.header()?;
        let alignment = match metadata.get("general.alignment") {
            None => DEFAULT_ALIGNMENT,
            Some(v) => match v.as_u64() {
                Some(a) if a > 0 && a.is_power_of_two() => a,
                _ => {
                    return Err(
                        reader.bad(format!("general.alignment {v:?} is not a power of two"))
                    );
                }
            },
        };
        let data_start = (reader.pos as u64).next_multiple_of(alignment);
        let file_len = file.bytes().len() as u64;
        let mut tensors = TensorMap::new(vec![file.clone()]);
        for info in infos {
            let bytes = info.byte_len(&reader)?;
            if info.offset % alignment != 0 {
                return Err(reader.bad(format!(
                    "tensor `{}` offset {} is not aligned to {alignment}",
                    info.name, info.offset
                )));
            }
            let start = data_start
                .checked_add(info.offset)
                .ok_or_else(|| reader.bad(format!("tensor `{}` has a bad offset", info.name)))?;
            let end = start.checked_add(bytes).filter(|&e| e <= file_len).ok_or_else(|| {
                reader.bad(format!(
                    "tensor `{}` ({} bytes at offset {}) runs past the end of the file ({} bytes): truncated?",
                    info.name, bytes, start, file_len
                ))
            })?;
            // GGUF lists dimensions innermost first; ferrite stores shapes outermost first.
            let shape: Vec<usize> = info.dims.iter().rev().map(|&d| d as usize).collect();
            tensors.insert(
                info.name,
                TensorEntry {
                    ty: info.ty,
                    shape,
                    file: 0,
                    start: start as usize,
                    end: end as usize,
                },
            );
        }
        Ok(GgufFile {
            version,
            metadata,
            tensors,
        })
    }

    pub fn get(&self, key: &str) -> Option<&GgufValue> {
        self.metadata.get(key)
    }

    pub fn get_str(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(GgufValue::as_str)
    }

    pub fn get_u64(&self, key: &str) -> Option<u64> {
        self.get(key).and_then(GgufValue::as_u64)
    }

    pub fn get_f64(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(GgufValue::as_f64)
    }

    pub fn get_bool(&self, key: &str) -> Option<bool> {
        self.get(key).and_then(GgufValue::as_bool)
    }

    /// A string array (e.g. `tokenizer.ggml.tokens`).
    pub fn get_strings(&self, key: &str) -> Option<Vec<String>> {
        let arr = self.get(key)?.as_array()?;
        arr.iter().map(|v| v.as_str().map(str::to_owned)).collect()
    }
}

struct TensorInfo {
    name: String,
    dims: Vec<u64>,
    ty: GgmlType,
    offset: u64,
}

impl TensorInfo {
    fn byte_len(&self, reader: &Reader<'_>) -> Result<u64> {
        let mut elems: u64 = 1;
        for &d in &self.dims {
            elems = elems
                .checked_mul(d)
                .ok_or_else(|| reader.bad(format!("tensor `{}` is impossibly large", self.name)))?;
        }
        let inner = self.dims.first().copied().unwrap_or(1);
        let block = self.ty.block_elems() as u64;
        if inner % block != 0 {
            return Err(reader.bad(format!(
                "tensor `{}`: row length {inner} is not a multiple of the {} block size {block}",
                self.name, self.ty
            )));
        }
        // Checked too: a count near 2^64 would wrap to a small byte length that fits in the
        // file, and the tensor's readers would then size buffers from the count (found by the
        // fuzzer: tests/fuzz/regressions/gguf/).
        (elems / block)
            .checked_mul(self.ty.block_bytes() as u64)
            .ok_or_else(|| reader.bad(format!("tensor `{}` is impossibly large", self.name)))
    }
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    path: PathBuf,
}

impl<'a> Reader<'a> {
    fn bad(&self, reason: String) -> FormatError {
        FormatError::BadGguf {
            path: self.path.clone(),
            reason,
        }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.bytes.len());
        match end {
            Some(end) => {
                let s = &self.bytes[self.pos..end];
                self.pos = end;
                Ok(s)
            }
            None => Err(self.bad(format!(
                "unexpected end of file at byte {} (wanted {n} more bytes; file is {} bytes): truncated?",
                self.pos,
                self.bytes.len()
            ))),
        }
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let s = self.take(N)?;
        let mut out = [0u8; N];
        out.copy_from_slice(s);
        Ok(out)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }

    /// A count that will drive a loop reading at least `min_item_bytes` per item: refused if
    /// the rest of the file cannot hold that many items.
    fn count(&mut self, what: &str, min_item_bytes: usize) -> Result<usize> {
        let n = self.u64()?;
        let left = (self.bytes.len() - self.pos) as u64;
        if n.saturating_mul(min_item_bytes.max(1) as u64) > left {
            return Err(self.bad(format!(
                "{what} count {n} is larger than the file could hold"
            )));
        }
        Ok(n as usize)
    }

    fn string(&mut self) -> Result<String> {
        let len = self.count("string length", 1)?;
        let raw = self.take(len)?;
        match std::str::from_utf8(raw) {
            Ok(s) => Ok(s.to_owned()),
            // Some converters wrote invalid UTF-8 in token strings; keep them readable.
            Err(_) => Ok(String::from_utf8_lossy(raw).into_owned()),
        }
    }

    fn header(&mut self) -> Result<(u32, HashMap<String, GgufValue>, Vec<TensorInfo>)> {
        let magic = self.take(4)?;
        if magic != GGUF_MAGIC {
            return Err(self.bad(format!("bad magic {magic:02x?}, expected \"GGUF\"")));
        }
        let version = self.u32()?;
        if !(2..=3).contains(&version) {
            return Err(self.bad(format!(
                "unsupported GGUF version {version} (supported: 2, 3)"
            )));
        }
        // Each tensor info is at least 8 (name len) + 4 (n_dims) + 4 (type) + 8 (offset) bytes.
        let tensor_count = self.count("tensor", 24)?;
        let kv_count = self.count("metadata", 12)?;
        let mut metadata = HashMap::with_capacity(kv_count);
        for _ in 0..kv_count {
            let key = self.string()?;
            let ty = self.u32()?;
            let value = self.value(ty, 0).map_err(|e| match e {
                FormatError::BadGguf { path, reason } => FormatError::BadGguf {
                    path,
                    reason: format!("metadata `{key}`: {reason}"),
                },
                e => e,
            })?;
            metadata.insert(key, value);
        }
        let mut infos = Vec::with_capacity(tensor_count);
        for _ in 0..tensor_count {
            let name = self.string()?;
            let n_dims = self.u32()?;
            if n_dims == 0 || n_dims > MAX_DIMS {
                return Err(self.bad(format!(
                    "tensor `{name}` has {n_dims} dimensions (1..=4 allowed)"
                )));
            }
            let dims = (0..n_dims)
                .map(|_| self.u64())
                .collect::<Result<Vec<_>>>()?;
            let ty_id = self.u32()?;
            let ty = GgmlType::from_ggml_id(ty_id).ok_or_else(|| {
                FormatError::UnsupportedTensorType(format!(
                    "ggml type id {ty_id} of tensor `{name}` in {} (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K)",
                    self.path.display()
                ))
            })?;
            let offset = self.u64()?;
            infos.push(TensorInfo {
                name,
                dims,
                ty,
                offset,
            });
        }
        Ok((version, metadata, infos))
    }

    fn value(&mut self, ty: u32, depth: u32) -> Result<GgufValue> {
        Ok(match ty {
            0 => GgufValue::U8(self.array::<1>()?[0]),
            1 => GgufValue::I8(i8::from_le_bytes(self.array()?)),
            2 => GgufValue::U16(u16::from_le_bytes(self.array()?)),
            3 => GgufValue::I16(i16::from_le_bytes(self.array()?)),
            4 => GgufValue::U32(self.u32()?),
            5 => GgufValue::I32(i32::from_le_bytes(self.array()?)),
            6 => GgufValue::F32(f32::from_le_bytes(self.array()?)),
            7 => match self.array::<1>()?[0] {
                0 => GgufValue::Bool(false),
                1 => GgufValue::Bool(true),
                b => return Err(self.bad(format!("bool value {b}"))),
            },
            8 => GgufValue::String(self.string()?),
            9 => {
                if depth > 0 {
                    return Err(self.bad("nested arrays are not supported".into()));
                }
                let elem_ty = self.u32()?;
                let min = match elem_ty {
                    0 | 1 | 7 => 1,
                    2 | 3 => 2,
                    4..=6 => 4,
                    8 | 10..=12 => 8,
                    _ => 1,
                };
                let n = self.count("array", min)?;
                let mut items = Vec::with_capacity(n);
                for _ in 0..n {
                    items.push(self.value(elem_ty, depth + 1)?);
                }
                GgufValue::Array(items)
            }
            10 => GgufValue::U64(self.u64()?),
            11 => GgufValue::I64(i64::from_le_bytes(self.array()?)),
            12 => GgufValue::F64(f64::from_le_bytes(self.array()?)),
            t => return Err(self.bad(format!("unknown value type {t}"))),
        })
    }
}
