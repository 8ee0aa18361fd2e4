//! Safetensors checkpoints: one `model.safetensors`, or shards listed by
//! `model.safetensors.index.json`. Each file is mapped; tensors stay in place.
//!
//! The header is parsed here (it is a length-prefixed JSON object) so every problem is reported
//! with the file and tensor it concerns.

use std::path::Path;
use std::sync::Arc;

use ferrite_kernels::mapped::MappedFile;
use ferrite_kernels::quant::GgmlType;
use serde::Deserialize;

use super::{IntTensor, IntType, TensorEntry, TensorMap};
use crate::error::{FormatError, Result};

#[derive(Deserialize)]
struct HeaderEntry {
    dtype: String,
    shape: Vec<usize>,
    data_offsets: [usize; 2],
}

#[derive(Deserialize)]
struct ShardIndex {
    weight_map: std::collections::BTreeMap<String, String>,
}

/// Opens the safetensors weights of a Hugging Face model directory.
pub fn open_dir(dir: &Path) -> Result<TensorMap> {
    let index_path = dir.join("model.safetensors.index.json");
    let shard_names: Vec<String> = if index_path.exists() {
        let raw = std::fs::read(&index_path).map_err(|source| FormatError::Io {
            path: index_path.clone(),
            source,
        })?;
        let index: ShardIndex =
            serde_json::from_slice(&raw).map_err(|e| FormatError::BadSafetensors {
                path: index_path.clone(),
                reason: format!("bad index: {e}"),
            })?;
        let mut names: Vec<String> = index.weight_map.into_values().collect();
        names.sort();
        names.dedup();
        names
    } else if dir.join("model.safetensors").exists() {
        vec!["model.safetensors".to_owned()]
    } else {
        return Err(FormatError::BadSafetensors {
            path: dir.to_owned(),
            reason: "no model.safetensors or model.safetensors.index.json".into(),
        });
    };
    let mut files = Vec::new();
    for name in &shard_names {
        if name.contains('/') || name.contains("..") {
            return Err(FormatError::BadSafetensors {
                path: index_path.clone(),
                reason: format!("shard name `{name}` is not a plain file name"),
            });
        }
        let path = dir.join(name);
        let file = MappedFile::open(&path).map_err(|source| FormatError::Io {
            path: path.clone(),
            source,
        })?;
        files.push(Arc::new(file));
    }
    let mut map = TensorMap::new(files.clone());
    for (i, (file, name)) in files.iter().zip(&shard_names).enumerate() {
        read_header(&dir.join(name), file.bytes(), i, &mut map)?;
    }
    Ok(map)
}

/// Opens one safetensors file (a LoRA adapter's `adapter_model.safetensors`).
pub fn open_file(path: &Path) -> Result<TensorMap> {
    let file = MappedFile::open(path).map_err(|source| FormatError::Io {
        path: path.to_owned(),
        source,
    })?;
    let file = Arc::new(file);
    let mut map = TensorMap::new(vec![file.clone()]);
    read_header(path, file.bytes(), 0, &mut map)?;
    Ok(map)
}

fn read_header(path: &Path, bytes: &[u8], file_index: usize, map: &mut TensorMap) -> Result<()> {
    let bad = |reason: String| FormatError::BadSafetensors {
        path: path.to_owned(),
        reason,
    };
    let len_bytes: [u8; 8] = bytes
        .get(..8)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(|| bad("file shorter than its 8-byte header length".into()))?;
    let header_len = u64::from_le_bytes(len_bytes);
    let data_start = usize::try_from(header_len)
        .ok()
        .and_then(|n| n.checked_add(8))
        .filter(|&s| s <= bytes.len())
        .ok_or_else(|| {
            bad(format!(
                "header length {header_len} runs past the end of the file"
            ))
        })?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&bytes[8..data_start])
            .map_err(|e| bad(format!("bad header JSON: {e}")))?;
    let data_len = bytes.len() - data_start;
    for (name, value) in header {
        if name == "__metadata__" {
            continue;
        }
        let entry: HeaderEntry = serde_json::from_value(value)
            .map_err(|e| bad(format!("tensor `{name}`: bad header entry: {e}")))?;
        // Integer and FP8 tensors are the codes of quantized checkpoints (GPTQ's and AWQ's packed
        // I32, compressed-tensors' I8, packed I32, FP8 and its I64 `weight_shape`).
        let (ty, int_ty) = match entry.dtype.as_str() {
            "F32" => (Some(GgmlType::F32), None),
            "F16" => (Some(GgmlType::F16), None),
            "BF16" => (Some(GgmlType::BF16), None),
            "I32" => (None, Some(IntType::I32)),
            "I8" => (None, Some(IntType::I8)),
            "I64" => (None, Some(IntType::I64)),
            "F8_E4M3" => (None, Some(IntType::F8E4M3)),
            "U8" => (None, Some(IntType::U8)),
            other => {
                return Err(FormatError::UnsupportedTensorType(format!(
                    "{other} (tensor `{name}` in {}; supported: F32, F16, BF16, I32, I8, I64, F8_E4M3, U8)",
                    path.display()
                )));
            }
        };
        let [start, end] = entry.data_offsets;
        let elems = entry
            .shape
            .iter()
            .try_fold(1usize, |acc, &d| acc.checked_mul(d))
            .ok_or_else(|| bad(format!("tensor `{name}` is impossibly large")))?;
        let elem_bytes = match (ty, int_ty) {
            (Some(t), _) => t.block_bytes(),
            (None, Some(i)) => i.bytes(),
            (None, None) => 4,
        };
        let want = elems.checked_mul(elem_bytes);
        if start > end || end > data_len || want != Some(end - start) {
            return Err(bad(format!(
                "tensor `{name}`: offsets [{start}, {end}] do not fit its shape {:?} {} or the file's {data_len} data bytes",
                entry.shape, entry.dtype
            )));
        }
        let (start, end) = (data_start + start, data_start + end);
        match ty {
            Some(ty) => map.insert(
                name,
                TensorEntry {
                    ty,
                    shape: entry.shape,
                    file: file_index,
                    start,
                    end,
                },
            ),
            None => map.insert_i32(
                name,
                IntTensor {
                    ty: int_ty.unwrap_or(IntType::I32),
                    shape: entry.shape,
                    file: file_index,
                    start,
                    end,
                },
            ),
        }
    }
    Ok(())
}
