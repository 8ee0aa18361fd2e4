//! The GEMVs that read the MLP's gate|up buffer and compute the gated activation as they load
//! it ([`Gpu::linear_gated`], [`Gpu::wq_gemv_gated`]): on the GPU their output must be the
//! activation kernel's followed by the plain GEMV, bit for bit, for SiLU and GELU-tanh, f16 and
//! bf16, one and two n8 tiles of rows, and a weight-only format with and without per-group
//! minimums. They exist only on CUDA, so on a machine without one this test has nothing to
//! run (`FERRITE_REQUIRE_CUDA=1` makes that a failure on the GPU host, see `common`).
//! `tests/gpu/emu/check_gated.cpp` holds the same equality under the CPU emulation.

// The GPU wrappers take raw device pointers; every pointer comes from a `Buffers` set that
// outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{Backend, Buffers, DTYPES, backends, random};
use ferrite_kernels::cuda::Gpu;
use ferrite_kernels::cuda::gemm::{Linear, OutType};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::wq::WqDevice;
use ferrite_kernels::wq::{ScaleType, WqFormat, quantize_rtn};

/// Rows of the down projection's output: not a multiple of a block's 16. (d_ff, in the test:
/// 1536 is whole steps of every GEMV, 592 ends on half a step of the dense one, 576 on half a
/// step of the 4-bit one.)
const ROWS: usize = 200;

/// One case's inputs: `m` rows of gate|up (gate wide enough to reach the activations' curved
/// parts) on the device.
struct Inputs<'g> {
    mem: Buffers<'g>,
    dtype: Dtype,
    gelu: bool,
    m: usize,
    ff: usize,
}

impl<'g> Inputs<'g> {
    fn new(gpu: &'g Gpu, dtype: Dtype, gelu: bool, m: usize, ff: usize) -> Self {
        Self {
            mem: Buffers::new(gpu),
            dtype,
            gelu,
            m,
            ff,
        }
    }

    fn gate_up(&mut self) -> ferrite_kernels::cuda::DevPtr {
        let gu = random(self.m * 2 * self.ff, self.ff as u64 + self.m as u64, 4.0);
        self.mem.half(self.dtype, &gu)
    }

    fn what(&self, kernel: &str) -> String {
        let act = if self.gelu { "gelu" } else { "silu" };
        format!(
            "{kernel} {act} {} m={} d_ff={}",
            self.dtype.name(),
            self.m,
            self.ff
        )
    }
}

/// The two outputs agree bit for bit and are not all zero.
fn assert_same_bits(what: &str, fused: &[u16], two_kernels: &[u16]) {
    assert!(fused.iter().any(|b| b & 0x7fff != 0), "{what}: all zero");
    for (i, (f, t)) in fused.iter().zip(two_kernels).enumerate() {
        assert_eq!(
            f, t,
            "{what} [{i}]: fused {f:#06x}, activation then GEMV {t:#06x}"
        );
    }
}

fn dense_case(gpu: &Gpu, dtype: Dtype, gelu: bool, m: usize, ff: usize) {
    let mut c = Inputs::new(gpu, dtype, gelu, m, ff);
    let gu = c.gate_up();
    let w = c.mem.half(dtype, &random(ROWS * ff, 7, 0.05));
    let (act, two, one) = (
        c.mem.zeroed(2 * m * ff),
        c.mem.zeroed(2 * m * ROWS),
        c.mem.zeroed(2 * m * ROWS),
    );
    let plain = Linear {
        m,
        n: ROWS,
        k: ff,
        x_stride: ff,
        out_stride: ROWS,
    };
    let fused = Linear {
        x_stride: 2 * ff,
        ..plain
    };
    unsafe {
        gpu.gated_activation(dtype, gelu, act, gu, m, ff)
            .expect("activation");
        gpu.linear(dtype, OutType::Same, two, act, w, plain)
            .expect("linear");
        gpu.linear_gated(dtype, gelu, one, gu, w, fused)
            .expect("linear_gated");
    }
    let what = c.what("dense");
    assert_same_bits(
        &what,
        &c.mem.read_u16(one, m * ROWS),
        &c.mem.read_u16(two, m * ROWS),
    );
}

fn wq_case(gpu: &Gpu, dtype: Dtype, gelu: bool, m: usize, ff: usize, with_mins: bool) {
    let mut f: WqFormat = "w4g64".parse().expect("format");
    f.scale_type = match dtype {
        Dtype::F16 => ScaleType::F16,
        Dtype::Bf16 => ScaleType::Bf16,
    };
    let q = quantize_rtn(&random(ROWS * ff, 8, 0.08), ROWS, ff, f).expect("quantize");
    let mut c = Inputs::new(gpu, dtype, gelu, m, ff);
    let gu = c.gate_up();
    let group_size = f.group_len(ff);
    let w = WqDevice {
        codes: c.mem.bytes(q.packed_codes()),
        scales: c.mem.half(dtype, q.scales()),
        zeros: f.zero_point.then(|| c.mem.bytes(&q.zeros())),
        bits: f.bits,
        rows: ROWS,
        cols: ff,
        group_size,
    };
    let mins = with_mins.then(|| {
        let n = ROWS * ff.div_ceil(group_size);
        c.mem.half(dtype, &random(n, 9, 0.1))
    });
    let (act, two, one) = (
        c.mem.zeroed(2 * m * ff),
        c.mem.zeroed(2 * m * ROWS),
        c.mem.zeroed(2 * m * ROWS),
    );
    unsafe {
        gpu.gated_activation(dtype, gelu, act, gu, m, ff)
            .expect("activation");
        gpu.wq_gemv(dtype, two, act, &w, m, mins).expect("wq_gemv");
        gpu.wq_gemv_gated(dtype, gelu, one, gu, &w, m, mins)
            .expect("wq_gemv_gated");
    }
    let what = c.what(if with_mins { "w4g64 mins" } else { "w4g64" });
    assert_same_bits(
        &what,
        &c.mem.read_u16(one, m * ROWS),
        &c.mem.read_u16(two, m * ROWS),
    );
}

#[test]
fn the_gemvs_reading_gate_up_match_the_activation_then_the_gemv() {
    for b in backends() {
        let Backend::Cuda(gpu) = &b else {
            continue; // no fused kernel on the CPU: it always runs the activation first
        };
        for dtype in DTYPES {
            for gelu in [false, true] {
                for m in [1, 5, 8, 9, 16] {
                    for ff in [1536, 592] {
                        dense_case(gpu, dtype, gelu, m, ff);
                    }
                    for ff in [1536, 576] {
                        wq_case(gpu, dtype, gelu, m, ff, false);
                        wq_case(gpu, dtype, gelu, m, ff, true);
                    }
                }
            }
        }
    }
}
