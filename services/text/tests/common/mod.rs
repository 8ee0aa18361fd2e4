//! Test helpers: a minimal GGUF metadata reader (enough to build a
//! [`GgufVocab`] from a model file) and fixture loading.
//!
//! The reader is test-only on purpose: production code gets its vocabulary
//! from the engine's GGUF loader, and this crate must not depend on it.

#![allow(dead_code)] // each test binary uses a different subset

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use ferrite_text::GgufVocab;

/// Path of the GGUF the model tests use: `FERRITE_TEST_GGUF` (the test command sets it), else
/// where `ferrite model pull smollm2-135m` puts it. Panics with instructions if absent, so a
/// missing download is not mistaken for a tokenizer bug.
pub fn gguf_path() -> PathBuf {
    let path = match std::env::var_os("FERRITE_TEST_GGUF") {
        Some(p) => PathBuf::from(p),
        None => default_cache_dir().join("models/smollm2-135m/SmolLM2-135M-Instruct.Q4_1.gguf"),
    };
    assert!(
        path.is_file(),
        "test model not found at {}: run `ferrite model pull smollm2-135m` or set FERRITE_TEST_GGUF",
        path.display()
    );
    path
}

/// ferrite's model cache, as its registry finds it (this crate cannot depend on the engine).
fn default_cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("FERRITE_CACHE_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_CACHE_HOME") {
        return PathBuf::from(d).join("ferrite");
    }
    PathBuf::from(std::env::var_os("HOME").unwrap_or_default()).join(".cache/ferrite")
}

/// Path of a file in `tests/fixtures/text/` at the repository root.
pub fn fixture_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/text")
        .join(name)
}

/// Parsed JSON fixture.
pub fn fixture(name: &str) -> serde_json::Value {
    let path = fixture_path(name);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("parsing {}: {e}", path.display()))
}

/// A GGUF metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Meta {
    Uint(u64),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
}

impl Meta {
    fn as_str(&self) -> Option<&str> {
        match self {
            Meta::Str(s) => Some(s),
            _ => None,
        }
    }
    fn as_u32(&self) -> Option<u32> {
        match self {
            Meta::Uint(v) => u32::try_from(*v).ok(),
            Meta::Int(v) => u32::try_from(*v).ok(),
            _ => None,
        }
    }
    fn as_bool(&self) -> Option<bool> {
        match self {
            Meta::Bool(b) => Some(*b),
            _ => None,
        }
    }
    fn as_array(&self) -> Option<&[Meta]> {
        match self {
            Meta::Array(a) => Some(a),
            _ => None,
        }
    }
}

struct Reader<R> {
    r: R,
}

impl<R: Read> Reader<R> {
    fn bytes<const N: usize>(&mut self) -> std::io::Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r.read_exact(&mut b)?;
        Ok(b)
    }
    fn u32(&mut self) -> std::io::Result<u32> {
        Ok(u32::from_le_bytes(self.bytes()?))
    }
    fn u64(&mut self) -> std::io::Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }
    fn string(&mut self) -> std::io::Result<String> {
        let len = self.u64()?;
        let mut buf = vec![0u8; usize::try_from(len).map_err(std::io::Error::other)?];
        self.r.read_exact(&mut buf)?;
        String::from_utf8(buf).map_err(std::io::Error::other)
    }
    fn value(&mut self, ty: u32) -> std::io::Result<Meta> {
        Ok(match ty {
            0 => Meta::Uint(u64::from(self.bytes::<1>()?[0])),
            1 => Meta::Int(i64::from(i8::from_le_bytes(self.bytes()?))),
            2 => Meta::Uint(u64::from(u16::from_le_bytes(self.bytes()?))),
            3 => Meta::Int(i64::from(i16::from_le_bytes(self.bytes()?))),
            4 => Meta::Uint(u64::from(self.u32()?)),
            5 => Meta::Int(i64::from(i32::from_le_bytes(self.bytes()?))),
            6 => Meta::Float(f64::from(f32::from_le_bytes(self.bytes()?))),
            7 => Meta::Bool(self.bytes::<1>()?[0] != 0),
            8 => Meta::Str(self.string()?),
            9 => {
                let elem = self.u32()?;
                let n = self.u64()?;
                let mut items = Vec::with_capacity(usize::try_from(n).unwrap_or(0).min(1 << 24));
                for _ in 0..n {
                    items.push(self.value(elem)?);
                }
                Meta::Array(items)
            }
            10 => Meta::Uint(self.u64()?),
            11 => Meta::Int(i64::from_le_bytes(self.bytes()?)),
            12 => Meta::Float(f64::from_le_bytes(self.bytes()?)),
            other => {
                return Err(std::io::Error::other(format!(
                    "unknown GGUF value type {other}"
                )));
            }
        })
    }
}

/// Reads the key/value metadata of a GGUF v2/v3 file, stopping before the
/// tensor infos.
pub fn read_gguf_metadata(path: &Path) -> std::io::Result<HashMap<String, Meta>> {
    let mut r = Reader {
        r: BufReader::new(File::open(path)?),
    };
    let magic: [u8; 4] = r.bytes()?;
    if &magic != b"GGUF" {
        return Err(std::io::Error::other("not a GGUF file"));
    }
    let version = r.u32()?;
    if !(2..=3).contains(&version) {
        return Err(std::io::Error::other(format!(
            "unsupported GGUF version {version}"
        )));
    }
    let _tensor_count = r.u64()?;
    let kv_count = r.u64()?;
    let mut out = HashMap::new();
    for _ in 0..kv_count {
        let key = r.string()?;
        let ty = r.u32()?;
        let value = r.value(ty)?;
        out.insert(key, value);
    }
    Ok(out)
}

/// The `tokenizer.*` keys of a GGUF file as a [`GgufVocab`].
pub fn gguf_vocab(path: &Path) -> GgufVocab {
    let meta =
        read_gguf_metadata(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let get = |k: &str| meta.get(&format!("tokenizer.ggml.{k}"));
    let strings = |m: &Meta| -> Vec<String> {
        m.as_array()
            .unwrap_or_default()
            .iter()
            .map(|v| v.as_str().unwrap_or_default().to_string())
            .collect()
    };
    GgufVocab {
        model: get("model")
            .and_then(Meta::as_str)
            .unwrap_or_default()
            .to_string(),
        pre: get("pre").and_then(Meta::as_str).map(str::to_string),
        tokens: get("tokens").map(strings).unwrap_or_default(),
        scores: get("scores").and_then(Meta::as_array).map(|a| {
            a.iter()
                .map(|v| match v {
                    Meta::Float(f) => *f as f32,
                    _ => 0.0,
                })
                .collect()
        }),
        token_types: get("token_type").and_then(Meta::as_array).map(|a| {
            a.iter()
                .map(|v| match v {
                    Meta::Int(i) => *i as i32,
                    Meta::Uint(u) => *u as i32,
                    _ => 0,
                })
                .collect()
        }),
        merges: get("merges").map(strings),
        bos_id: get("bos_token_id").and_then(Meta::as_u32),
        eos_id: get("eos_token_id").and_then(Meta::as_u32),
        unk_id: get("unknown_token_id").and_then(Meta::as_u32),
        pad_id: get("padding_token_id").and_then(Meta::as_u32),
        add_bos: get("add_bos_token").and_then(Meta::as_bool),
        add_eos: get("add_eos_token").and_then(Meta::as_bool),
        add_space_prefix: get("add_space_prefix").and_then(Meta::as_bool),
        chat_template: meta
            .get("tokenizer.chat_template")
            .and_then(Meta::as_str)
            .map(str::to_string),
    }
}

/// `GgufVocab` for the SentencePiece fixture (`spm_vocab.json`).
pub fn spm_vocab() -> GgufVocab {
    let v = fixture("spm_vocab.json");
    let ids = |k: &str| v[k].as_u64().map(|x| x as u32);
    GgufVocab {
        model: v["model"].as_str().unwrap_or_default().to_string(),
        tokens: serde_json::from_value(v["tokens"].clone()).expect("tokens"),
        scores: Some(serde_json::from_value(v["scores"].clone()).expect("scores")),
        token_types: Some(serde_json::from_value(v["token_types"].clone()).expect("token_types")),
        bos_id: ids("bos_id"),
        eos_id: ids("eos_id"),
        unk_id: ids("unk_id"),
        add_space_prefix: v["add_space_prefix"].as_bool(),
        ..GgufVocab::default()
    }
}

/// Feeds `ids` one at a time through a [`ferrite_text::DecodeStream`] and
/// returns the concatenated deltas (plus the final flush) and the deltas.
pub fn stream_decode(
    tok: &ferrite_text::Tokenizer,
    ids: &[u32],
    skip_special: bool,
) -> (String, Vec<String>) {
    let mut stream = tok.decode_stream(skip_special);
    let mut deltas = Vec::new();
    for &id in ids {
        deltas.push(stream.step(id).expect("stream step"));
    }
    deltas.push(stream.flush().expect("stream flush"));
    (deltas.concat(), deltas)
}

/// JSON array of ids → `Vec<u32>`.
pub fn ids(v: &serde_json::Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).expect("id array")
}
