//! Weight-only quantized matmul against the reference: dequantize to f32, then an f64 dot.

use ferrite_kernels::cpu::matmul::{Weight, matmul_many, matmul_with};
use ferrite_kernels::quant::Isa;
use ferrite_kernels::wq::{WqFormat, WqMatrix, quantize_rtn};

/// xorshift, so the test needs no RNG crate.
struct Rng(u64);

impl Rng {
    fn uniform(&mut self) -> f32 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 40) as f32 / (1u64 << 24) as f32 - 0.5
    }

    fn matrix(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.uniform()).collect()
    }
}

const FORMATS: [&str; 14] = [
    "w8g32",
    "w8g128",
    "w8pc-sym",
    "w8g64-sym-bf16",
    "w4g32",
    "w4g64",
    "w4g128",
    "w4pc",
    "w4g128-sym",
    "w3g64",
    "w3g128-sym",
    "w2g32",
    "w2g64",
    "w2g128-sym",
];

/// `|got - want| <= 1e-5 Σ|w||x|` per output: f32 summation error only.
fn check(x: &[f32], m: usize, w: &WqMatrix, got: &[f32], what: &str) {
    let (n, k) = (w.rows(), w.cols());
    let deq = w.dequantize();
    for i in 0..m {
        for j in 0..n {
            let (mut want, mut mag) = (0f64, 0f64);
            for t in 0..k {
                let p = f64::from(deq[j * k + t]) * f64::from(x[i * k + t]);
                want += p;
                mag += p.abs();
            }
            let d = (f64::from(got[i * n + j]) - want).abs();
            assert!(
                d <= 1e-5 * mag + 1e-6,
                "{what} {}: out[{i}, {j}] = {} but reference {want} (|Σ| {mag})",
                w.format(),
                got[i * n + j]
            );
        }
    }
}

#[test]
fn every_format_matches_its_dequantized_reference() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    // Large enough (n * k * m) that the parallel path splits rows into tasks.
    // 576 columns (SmolLM2-135M's hidden size): the g128 formats end rows with a short group;
    // 36 columns leave a tail after the vector loop of every format.
    for (n, k) in [(96, 576), (8, 36)] {
        formats_at(&mut rng, n, k);
    }
}

fn formats_at(rng: &mut Rng, n: usize, k: usize) {
    let w = rng.matrix(n * k);
    for name in FORMATS {
        let format: WqFormat = name.parse().expect("format");
        let q = quantize_rtn(&w, n, k, format).expect("quantize");
        for m in [1, 3, 8, 17] {
            let x = rng.matrix(m * k);
            for isa in [Isa::Scalar, Isa::Avx2] {
                let mut out = vec![f32::NAN; m * n];
                matmul_with(isa, &x, m, &q, &mut out);
                check(&x, m, &q, &out, &format!("{isa} m={m}"));
            }
        }
    }
}

#[test]
fn quantized_and_plain_weights_mix_in_one_call() {
    let mut rng = Rng(42);
    let k = 256;
    let a = quantize_rtn(&rng.matrix(40 * k), 40, k, "w4g64".parse().expect("f")).expect("q");
    let b = quantize_rtn(&rng.matrix(24 * k), 24, k, "w2g32-sym".parse().expect("f")).expect("q");
    let x = rng.matrix(2 * k);
    let (mut oa, mut ob) = (vec![0f32; 2 * 40], vec![0f32; 2 * 24]);
    matmul_many(
        &x,
        2,
        &[Weight::from(&a), Weight::from(&b)],
        &mut [&mut oa, &mut ob],
    );
    check(&x, 2, &a, &oa, "many");
    check(&x, 2, &b, &ob, "many");
}

#[test]
fn codes_scales_and_zeros_round_trip_through_from_codes() {
    let mut rng = Rng(7);
    let (n, k) = (8, 128);
    for name in FORMATS {
        let format: WqFormat = name.parse().expect("format");
        let q = quantize_rtn(&rng.matrix(n * k), n, k, format).expect("quantize");
        let zeros = q.zeros();
        let again = WqMatrix::from_codes(
            format,
            n,
            k,
            &q.codes(),
            q.scales(),
            format.zero_point.then_some(&zeros[..]),
        )
        .expect("rebuild");
        assert_eq!(again.dequantize(), q.dequantize(), "{name}");
        for r in 0..n {
            assert_eq!(again.packed_row(r), q.packed_row(r), "{name} row {r}");
        }
    }
}

/// The input widths of the projections of the models in the `bench kernels` table: gemma-2-9b
/// (hidden 3584, attention 4096, FFN 14336), Qwen2.5-32B (5120, 27648), Llama-3-70B (8192,
/// 28672). A few output rows each: the kernel computes rows independently, so the row count
/// does not change what is exercised, and the f64 reference stays cheap.
#[test]
fn every_format_at_the_benchmark_models_widths() {
    let mut rng = Rng(0x5eed);
    for k in [3584, 4096, 14336, 5120, 27648, 8192, 28672] {
        let w = rng.matrix(8 * k);
        for name in ["w8g128", "w4g128", "w2g128", "w4pc-sym", "w8g32-sym-bf16"] {
            let q = quantize_rtn(&w, 8, k, name.parse().expect("format")).expect("quantize");
            for m in [1, 16] {
                let x = rng.matrix(m * k);
                let mut out = vec![f32::NAN; m * 8];
                matmul_with(Isa::best(), &x, m, &q, &mut out);
                check(&x, m, &q, &out, &format!("k={k} m={m}"));
            }
        }
    }
}
