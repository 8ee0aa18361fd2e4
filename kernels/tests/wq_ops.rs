//! Weight-only quantized projections on every backend (see `common`): the GEMV kernel for
//! 1–8 activation rows (and 11, which takes two launches) and the dequantizer, for every bit
//! width, zero-point and group choice, at the input widths of gemma-2-9b (3584), Qwen2.5-32B
//! (5120) and Llama-3-70B's down projection (28672), plus SmolLM2's 576 whose last g128 group
//! is short. The reference is the CPU's dequantized matrix times the rounded activations.

// The GPU wrappers take raw device pointers; every pointer comes from a `Buffers` set that
// outlives the call and is sized as the wrapper requires.
#![allow(unsafe_code)]

mod common;

use common::{Backend, Buffers, DTYPES, assert_close, backends, random, round};
use ferrite_kernels::cuda::ops::Dtype;
use ferrite_kernels::cuda::wq::{WqDevice, check_layout};
use ferrite_kernels::wq::{ScaleType, WqFormat, WqMatrix, quantize_rtn};

fn format(name: &str, dtype: Dtype) -> WqFormat {
    let mut f: WqFormat = name.parse().expect("format");
    // Scales are kept in the activation type on the GPU; quantize with that type so both
    // backends use the same scale values.
    f.scale_type = match dtype {
        Dtype::F16 => ScaleType::F16,
        Dtype::Bf16 => ScaleType::Bf16,
    };
    f
}

fn upload<'g>(m: &mut Buffers<'g>, dtype: Dtype, w: &WqMatrix) -> WqDevice {
    let f = w.format();
    WqDevice {
        codes: m.bytes(w.packed_codes()),
        scales: m.half(dtype, w.scales()),
        zeros: f.zero_point.then(|| m.bytes(&w.zeros())),
        bits: f.bits,
        rows: w.rows(),
        cols: w.cols(),
        group_size: f.group_len(w.cols()),
    }
}

/// `x · Wᵀ` for `m` rows of `x`, and (GPU) the dequantized matrix.
fn gemv_on(b: &Backend, dtype: Dtype, w: &WqMatrix, x: &[f32], m: usize) -> (Vec<f32>, Vec<f32>) {
    let (rows, cols) = (w.rows(), w.cols());
    match b {
        Backend::Cpu => {
            let dense = w.dequantize();
            let x = round(dtype, x);
            let out: Vec<f32> = (0..m)
                .flat_map(|i| {
                    let xi = &x[i * cols..(i + 1) * cols];
                    dense
                        .chunks(cols)
                        .map(move |r| r.iter().zip(xi).map(|(a, b)| a * b).sum::<f32>())
                })
                .collect();
            (out, round(dtype, &dense))
        }
        Backend::Cuda(gpu) => {
            let mut mem = Buffers::new(gpu);
            let dev = upload(&mut mem, dtype, w);
            let xp = mem.half(dtype, x);
            let out = mem.zeroed(2 * m * rows);
            let dense = mem.zeroed(2 * rows * cols);
            unsafe {
                gpu.wq_gemv(dtype, out, xp, &dev, m, None).expect("gemv");
                gpu.wq_dequant(dtype, dense, &dev).expect("dequant");
            }
            (
                mem.read_half(dtype, out, m * rows),
                mem.read_half(dtype, dense, rows * cols),
            )
        }
    }
}

#[test]
fn gemv_and_dequant_match_the_cpu_for_every_format() {
    let shapes = [(256, 3584), (96, 5120), (64, 28672), (128, 576)];
    let formats = [
        "w8g128",
        "w8pc-sym",
        "w4g128",
        "w4g32",
        "w4g128-sym",
        "w4pc",
        "w2g64",
        "w2g32-sym",
    ];
    for b in backends() {
        for dtype in DTYPES {
            for (rows, cols) in shapes {
                let w_f32 = random(rows * cols, rows as u64 + cols as u64, 0.08);
                let x = random(17 * cols, 40, 1.0);
                for name in formats {
                    let f = format(name, dtype);
                    if check_layout(&f, cols).is_err() {
                        continue; // 2-bit rows of 576 are 144 bytes: whole vectors, but checked anyway
                    }
                    let w = quantize_rtn(&w_f32, rows, cols, f).expect("quantize");
                    let (want_all, want_dense) = gemv_on(&Backend::Cpu, dtype, &w, &x, 17);
                    // One n8 tile (1, 3, 8), two (11, 16), two then one launch (17).
                    for m in [1, 3, 8, 11, 16, 17] {
                        let (got, dense) = gemv_on(&b, dtype, &w, &x, m);
                        let want = &want_all[..m * rows];
                        let what = format!("{name} {rows}x{cols} m={m} on {}", b.name());
                        // Dot products of thousands of terms accumulated in another order,
                        // then rounded: a few ulps of the typical output.
                        assert_close(&what, dtype, &got, want, 4.0);
                        if m == 1 {
                            assert_eq!(dense, want_dense, "{what}: dequantized matrix");
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn layouts_the_kernels_cannot_read_are_refused() {
    // 2-bit rows of 48 columns are 12 bytes: not whole 16-byte vectors.
    assert!(check_layout(&"w2pc".parse().expect("format"), 48).is_err());
    assert!(check_layout(&"w4g128".parse().expect("format"), 4096).is_ok());
    assert!(check_layout(&"w8pc".parse().expect("format"), 576).is_ok());
}
