//! The op-test harness: one test body per op, run on the CPU always and on CUDA when a device
//! is present, each result compared with an independent reference: the values of a fixture
//! (`tests/fixtures/ops/*.json`, computed by numpy from the ops' definitions, see
//! [`fixture`]) or a naive f64 loop in the test. At the sizes real models use, which a fixture
//! would make large, the CUDA ops are compared with the CPU ops the fixtures check.
//!
//! A backend takes f32 inputs, rounds them to the dtype under test (so both backends see the
//! same values), runs the op and returns f32. On the GPU host `FERRITE_REQUIRE_CUDA=1` turns
//! "no CUDA device" into a failure, so the CUDA half cannot silently skip there.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;

use cudarc::driver::CudaSlice;
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::{DevPtr, Gpu};

pub enum Backend {
    Cpu,
    Cuda(Box<Gpu>),
}

impl Backend {
    pub fn name(&self) -> String {
        match self {
            Self::Cpu => "cpu".into(),
            Self::Cuda(gpu) => format!("cuda ({})", gpu.device),
        }
    }

    pub fn is_gpu(&self) -> bool {
        matches!(self, Self::Cuda(_))
    }
}

/// The CPU, and cuda:0 when this machine has one.
pub fn backends() -> Vec<Backend> {
    let mut out = vec![Backend::Cpu];
    match ferrite_kernels::device::cuda_devices() {
        Ok(devices) if !devices.is_empty() => {
            let cache = cache_dir();
            let (gpu, _) = Gpu::open(0, &cache).unwrap_or_else(|e| panic!("cuda:0: {e}"));
            out.push(Backend::Cuda(Box::new(gpu)));
        }
        other => {
            assert!(
                std::env::var_os("FERRITE_REQUIRE_CUDA").is_none(),
                "FERRITE_REQUIRE_CUDA is set but there is no CUDA device: {other:?}"
            );
        }
    }
    out
}

fn cache_dir() -> PathBuf {
    std::env::var_os("FERRITE_KERNEL_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("ferrite-test-kernels"))
}

pub const DTYPES: [Dtype; 2] = [Dtype::F16, Dtype::Bf16];

/// `xs` rounded to `dtype`.
pub fn round(dtype: Dtype, xs: &[f32]) -> Vec<f32> {
    xs.iter()
        .map(|&x| dtype.value_of(dtype.bits_of(x)))
        .collect()
}

/// Deterministic values in `[-scale, scale)` (xorshift).
pub fn random(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// `m` rows of `cols` activations in `dtype` for the 8-bit projections: row 1 (when there is
/// one) all zero, which must quantize to zeros, and one outlier that sets its token's scale.
pub fn activation_rows(dtype: Dtype, m: usize, cols: usize, seed: u64) -> Vec<f32> {
    let mut x = random(m * cols, seed, 2.0);
    if m > 1 {
        x[cols..2 * cols].fill(0.0);
    }
    x[cols / 3] = 30.0;
    round(dtype, &x)
}

/// `x[m, cols] · wᵀ` for row-major `w` (`rows` × `cols`), each dot product in f64 (every
/// product exact) and rounded to f32 once.
pub fn product_f64(w: &[f32], x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    use rayon::prelude::*;
    let mut out = vec![0f32; x.len() / cols.max(1) * rows];
    out.par_chunks_mut(rows.max(1))
        .zip(x.par_chunks(cols.max(1)))
        .for_each(|(o, xi)| {
            for (o, wr) in o.iter_mut().zip(w.chunks(cols)) {
                *o = dot_f64(wr, xi) as f32;
            }
        });
    out
}

/// `a · b` in f64, in four interleaved sums (so it vectorizes; every product is exact).
pub fn dot_f64(a: &[f32], b: &[f32]) -> f64 {
    let mut acc = [0f64; 4];
    let (a4, b4) = (a.chunks_exact(4), b.chunks_exact(4));
    let tail: f64 = a4
        .remainder()
        .iter()
        .zip(b4.remainder())
        .map(|(&p, &q)| f64::from(p) * f64::from(q))
        .sum();
    for (p, q) in a4.zip(b4) {
        for k in 0..4 {
            acc[k] += f64::from(p[k]) * f64::from(q[k]);
        }
    }
    acc.iter().sum::<f64>() + tail
}

/// `tests/fixtures/ops/<name>`, written by `generate.py` there. Its inputs are not stored but
/// named as `{"seed", "scale"}` of [`random`] (see [`drawn`]), which the script reproduces: the
/// fixture's own first outputs of it are checked here, so the two cannot drift apart unseen.
pub fn fixture(name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../tests/fixtures/ops")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let doc: Value = serde_json::from_str(&text).expect("parse fixture");
    let check = &doc["random_check"];
    assert_eq!(
        drawn(check, 8),
        floats(&check["values"]),
        "{name}: generate.py's `random` draws other inputs than common::random"
    );
    doc
}

/// `n` values of [`random`] with the `seed` and `scale` of a fixture entry.
pub fn drawn(entry: &Value, n: usize) -> Vec<f32> {
    let seed = entry["seed"].as_u64().expect("seed");
    random(n, seed, entry["scale"].as_f64().expect("scale") as f32)
}

/// A fixture's array of numbers, as f32.
pub fn floats(v: &Value) -> Vec<f32> {
    let items = v.as_array().unwrap_or_else(|| panic!("not an array: {v}"));
    items
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

/// A fixture's number, as f32.
pub fn num(v: &Value) -> f32 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}")) as f32
}

/// A fixture's non-negative integer.
pub fn uint(v: &Value) -> usize {
    v.as_u64().unwrap_or_else(|| panic!("not a count: {v}")) as usize
}

/// A fixture's array of non-negative integers.
pub fn uints(v: &Value) -> Vec<usize> {
    v.as_array().expect("array").iter().map(uint).collect()
}

/// A fixture's array of objects.
pub fn items(v: &Value) -> &[Value] {
    v.as_array().unwrap_or_else(|| panic!("not an array: {v}"))
}

/// Relative precision of a dtype's stored values (one unit in the last place at 1.0).
pub fn ulp(dtype: Dtype) -> f32 {
    match dtype {
        Dtype::F16 => 1.0 / 1024.0,
        Dtype::Bf16 => 1.0 / 128.0,
    }
}

/// Asserts `|got - want| <= ulps * ulp(dtype) * (|want| + mean |want|)` everywhere: a few
/// roundings of the stored type, relative to each value and to the tensor's typical size
/// (so values that cancel to near zero are judged on the tensor's scale).
pub fn assert_close(what: &str, dtype: Dtype, got: &[f32], want: &[f32], ulps: f32) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mean = want.iter().map(|w| w.abs()).sum::<f32>() / want.len().max(1) as f32;
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let tol = ulps * ulp(dtype) * (w.abs() + mean);
        assert!(
            (g - w).abs() <= tol || (g.is_nan() && w.is_nan()),
            "{what} ({}) [{i}]: got {g}, want {w} (tolerance {tol})",
            dtype.name()
        );
    }
}

/// Device memory for a test, freed at the end of the test.
pub struct Buffers<'g> {
    pub gpu: &'g Gpu,
    held: Vec<CudaSlice<u8>>,
}

impl<'g> Buffers<'g> {
    pub fn new(gpu: &'g Gpu) -> Self {
        Self {
            gpu,
            held: Vec::new(),
        }
    }

    fn hold(&mut self, bytes: Vec<u8>) -> DevPtr {
        let buf = self.gpu.upload(&bytes).expect("upload");
        let p = self.gpu.ptr(&buf);
        self.held.push(buf);
        p
    }

    /// `xs` rounded to `dtype`, on the device.
    pub fn half(&mut self, dtype: Dtype, xs: &[f32]) -> DevPtr {
        let bytes = xs
            .iter()
            .flat_map(|&x| dtype.bits_of(x).to_le_bytes())
            .collect();
        self.hold(bytes)
    }

    pub fn f32s(&mut self, xs: &[f32]) -> DevPtr {
        self.hold(xs.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    pub fn i32s(&mut self, xs: &[i32]) -> DevPtr {
        self.hold(xs.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    pub fn u64s(&mut self, xs: &[u64]) -> DevPtr {
        self.hold(xs.iter().flat_map(|x| x.to_le_bytes()).collect())
    }

    pub fn bytes(&mut self, xs: &[u8]) -> DevPtr {
        self.hold(xs.to_vec())
    }

    /// `n` zero bytes.
    pub fn zeroed(&mut self, n: usize) -> DevPtr {
        self.hold(vec![0; n.max(1)])
    }

    /// The `n` values of `dtype` at `p` (which must be one of this set's buffers), as f32.
    pub fn read_half(&self, dtype: Dtype, p: DevPtr, n: usize) -> Vec<f32> {
        self.read(p, 2 * n)
            .chunks_exact(2)
            .map(|b| dtype.value_of(u16::from_le_bytes([b[0], b[1]])))
            .collect()
    }

    /// The raw 16-bit values at `p`.
    pub fn read_u16(&self, p: DevPtr, n: usize) -> Vec<u16> {
        self.read(p, 2 * n)
            .chunks_exact(2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
            .collect()
    }

    pub fn read_f32(&self, p: DevPtr, n: usize) -> Vec<f32> {
        self.read(p, 4 * n)
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    pub fn read_i8(&self, p: DevPtr, n: usize) -> Vec<i8> {
        self.read(p, n).iter().map(|&b| b as i8).collect()
    }

    pub fn read_i32(&self, p: DevPtr, n: usize) -> Vec<i32> {
        self.read(p, 4 * n)
            .chunks_exact(4)
            .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }

    fn read(&self, p: DevPtr, bytes: usize) -> Vec<u8> {
        let buf = self
            .held
            .iter()
            .find(|b| self.gpu.ptr(b) == p)
            .expect("a buffer of this set");
        let all = self.gpu.download(buf, buf.len()).expect("download");
        all[..bytes].to_vec()
    }
}
