//! Dequantization against gguf-py fixtures, and matmul (SIMD and scalar) against
//! dequantize + naive dot.

use ferrite_kernels::cpu::matmul::{
    Weight, WeightView, matmul, matmul_many, matmul_many_with, matmul_with,
};
use ferrite_kernels::quant::{GgmlType, Isa, QuantError, dequantize, vec_dot, vec_dot_with};

const FIXTURE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../tests/fixtures/quant/dequant.json"
);

struct Case {
    ty: GgmlType,
    note: String,
    bytes: Vec<u8>,
    values: Vec<f32>,
}

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex"))
        .collect()
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(FIXTURE).expect("read fixture");
    let doc: serde_json::Value = serde_json::from_str(&text).expect("parse fixture");
    let cases = doc["cases"].as_array().expect("cases");
    cases
        .iter()
        .map(|c| {
            let ty: GgmlType = c["type"]
                .as_str()
                .expect("type")
                .parse()
                .expect("known type");
            let values: Vec<f32> = c["values"]
                .as_array()
                .expect("values")
                .iter()
                .map(|v| v.as_f64().expect("number") as f32)
                .collect();
            assert_eq!(values.len() as u64, c["n_elems"].as_u64().expect("n_elems"));
            Case {
                ty,
                note: c["note"].as_str().unwrap_or("").to_owned(),
                bytes: hex(c["hex"].as_str().expect("hex")),
                values,
            }
        })
        .collect()
}

/// `bytes` copied to an odd address, to exercise unaligned reads.
fn misaligned(bytes: &[u8]) -> (Vec<u8>, std::ops::Range<usize>) {
    let mut buf = vec![0u8; bytes.len() + 3];
    let off = if buf.as_ptr().align_offset(4) == 0 {
        1
    } else {
        2
    };
    buf[off..off + bytes.len()].copy_from_slice(bytes);
    (buf, off..off + bytes.len())
}

#[test]
fn dequantize_matches_gguf_py() {
    let cases = cases();
    let mut seen: Vec<GgmlType> = cases.iter().map(|c| c.ty).collect();
    seen.sort_by_key(|t| t.ggml_id());
    seen.dedup();
    assert_eq!(seen.len(), GgmlType::ALL.len(), "fixture covers every type");

    for c in &cases {
        let (buf, range) = misaligned(&c.bytes);
        let mut out = vec![f32::NAN; c.values.len()];
        dequantize(c.ty, &buf[range], &mut out).expect("dequantize");
        // The scalar dequantizer performs the same f32 operations as gguf-py, in the same
        // order, so the results are bit-identical (signed zeros included).
        for (i, (&got, &want)) in out.iter().zip(&c.values).enumerate() {
            assert!(
                got.to_bits() == want.to_bits(),
                "{} ({}) element {i}: got {got:e}, want {want:e}",
                c.ty,
                c.note
            );
        }
    }
}

#[test]
fn vec_dot_matches_fixture_values() {
    let mut rng = Rng(7);
    for c in cases() {
        let x: Vec<f32> = (0..c.values.len()).map(|_| rng.normal()).collect();
        let (want, mag) = ref_dot(&c.values, &x);
        let (buf, range) = misaligned(&c.bytes);
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            let got = vec_dot_with(isa, c.ty, &buf[range.clone()], &x).expect("dot");
            check(got, want, mag, &format!("vec_dot {isa} {}", c.ty));
        }
        let got = vec_dot(c.ty, &c.bytes, &x).expect("dot");
        check(got, want, mag, &format!("vec_dot {}", c.ty));
    }
}

/// splitmix64
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn uniform(&mut self) -> f32 {
        (self.next() >> 40) as f32 / (1u64 << 24) as f32
    }
    fn normal(&mut self) -> f32 {
        // Irwin-Hall approximation; good enough for test data.
        (0..4).map(|_| self.uniform()).sum::<f32>() * 1.732 - 3.464
    }
    fn f16_bytes(&mut self, lo: f32, hi: f32, signed: bool) -> [u8; 2] {
        let mut v = lo + (hi - lo) * self.uniform();
        if signed && self.next() & 1 == 1 {
            v = -v;
        }
        half::f16::from_f32(v).to_le_bytes()
    }
}

/// `rows` random valid rows of `cols` elements of `ty`: random bits with finite f16 scales.
fn random_weight(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.normal().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| half::f16::from_f32(rng.normal()).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| ((rng.normal().to_bits() >> 16) as u16).to_le_bytes())
            .collect(),
        _ => {
            let nb = n / ty.block_elems();
            let bb = ty.block_bytes();
            let mut bytes: Vec<u8> = (0..nb * bb).map(|_| rng.next() as u8).collect();
            for b in bytes.chunks_exact_mut(bb) {
                match ty {
                    GgmlType::Q8_0 | GgmlType::Q4_0 => {
                        b[0..2].copy_from_slice(&rng.f16_bytes(0.001, 0.05, true))
                    }
                    GgmlType::Q4_1 => {
                        b[0..2].copy_from_slice(&rng.f16_bytes(0.001, 0.05, false));
                        b[2..4].copy_from_slice(&rng.f16_bytes(0.0, 0.3, true));
                    }
                    GgmlType::Q4_K | GgmlType::Q5_K => {
                        b[0..2].copy_from_slice(&rng.f16_bytes(0.0005, 0.01, false));
                        b[2..4].copy_from_slice(&rng.f16_bytes(0.0005, 0.01, false));
                    }
                    GgmlType::Q6_K => {
                        b[208..210].copy_from_slice(&rng.f16_bytes(0.0005, 0.01, true))
                    }
                    // Scales of 2^-10 to 2^-3.
                    GgmlType::MXFP4 => b[0] = 118 + (rng.next() % 8) as u8,
                    _ => unreachable!(),
                }
            }
            bytes
        }
    }
}

/// Exact-ish reference: f64 dot, plus `Σ|a·b|` to scale the tolerance.
fn ref_dot(a: &[f32], b: &[f32]) -> (f64, f64) {
    a.iter().zip(b).fold((0.0, 0.0), |(s, m), (&x, &y)| {
        let p = f64::from(x) * f64::from(y);
        (s + p, m + p.abs())
    })
}

fn check(got: f32, want: f64, mag: f64, what: &str) {
    let err = (f64::from(got) - want).abs();
    assert!(
        err <= 1e-5 * mag + 1e-30,
        "{what}: got {got:e}, want {want:e} (err {err:e}, Σ|w·x| {mag:e})"
    );
}

fn dequant_all(w: &WeightView<'_>) -> Vec<f32> {
    let mut out = vec![0f32; w.rows * w.cols];
    dequantize(w.ty, w.bytes, &mut out).expect("dequantize weight");
    out
}

fn check_matmul(x: &[f32], m: usize, w: &WeightView<'_>, out: &[f32], what: &str) {
    let wf = dequant_all(w);
    let k = w.cols;
    for i in 0..m {
        for j in 0..w.rows {
            let (want, mag) = ref_dot(&x[i * k..(i + 1) * k], &wf[j * k..(j + 1) * k]);
            check(
                out[i * w.rows + j],
                want,
                mag,
                &format!("{what} {} m={m} n={} k={k} [{i},{j}]", w.ty, w.rows),
            );
        }
    }
}

#[test]
fn matmul_matches_dequantize_then_dot() {
    let mut rng = Rng(42);
    let isas = [Isa::Scalar, Isa::Avx2, Isa::Avx512];
    for ty in GgmlType::ALL {
        let be = ty.block_elems();
        let ks: Vec<usize> = if be == 1 {
            vec![1, 31, 32, 37, 96, 200]
        } else {
            vec![be, 2 * be, if be == 32 { 5 * be } else { 3 * be }]
        };
        for &k in &ks {
            for &(n, m) in &[
                (1, 1),
                (9, 2),
                (7, 3),
                (6, 4),
                (3, 5),
                (33, 8),
                (67, 1),
                (130, 11),
                (5, 17),
            ] {
                let bytes = random_weight(&mut rng, ty, n, k);
                let (buf, range) = misaligned(&bytes);
                let w = WeightView::new(ty, n, k, &buf[range]).expect("view");
                let x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
                for isa in isas {
                    let mut out = vec![f32::NAN; m * n];
                    matmul_with(isa, &x, m, w, &mut out);
                    check_matmul(&x, m, &w, &out, isa.name());
                }
                let mut out = vec![f32::NAN; m * n];
                matmul(&x, m, w, &mut out);
                check_matmul(&x, m, &w, &out, "best");
            }
        }
    }
}

#[test]
fn matmul_parallel_large() {
    // Big enough to be split over several rayon tasks, with a ragged last chunk.
    let mut rng = Rng(3);
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q6_K,
        GgmlType::F16,
    ] {
        let (n, k) = (1001, 512);
        let bytes = random_weight(&mut rng, ty, n, k);
        let w = WeightView::new(ty, n, k, &bytes).expect("view");
        for m in [1, 8, 9] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
            let mut out = vec![f32::NAN; m * n];
            matmul(&x, m, w, &mut out);
            check_matmul(&x, m, &w, &out, "parallel");
            let mut out_s = vec![f32::NAN; m * n];
            matmul_with(Isa::Scalar, &x, m, w, &mut out_s);
            check_matmul(&x, m, &w, &out_s, "parallel scalar");
        }
    }
}

#[test]
fn matmul_many_matches_separate() {
    let mut rng = Rng(9);
    let k = 256;
    let shapes = [
        (GgmlType::Q4_1, 300),
        (GgmlType::Q8_0, 77),
        (GgmlType::Q4_K, 129),
        (GgmlType::BF16, 3),
    ];
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&(ty, n)| random_weight(&mut rng, ty, n, k))
        .collect();
    let views: Vec<WeightView<'_>> = shapes
        .iter()
        .zip(&data)
        .map(|(&(ty, n), b)| WeightView::new(ty, n, k, b).expect("view"))
        .collect();
    let ws: Vec<Weight<'_>> = views.iter().map(Weight::from).collect();
    for m in [1, 3, 8] {
        let x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
        for isa in [Isa::Scalar, Isa::Avx2, Isa::Avx512] {
            let mut bufs: Vec<Vec<f32>> = ws.iter().map(|w| vec![f32::NAN; m * w.rows()]).collect();
            let mut outs: Vec<&mut [f32]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            if isa == Isa::best() {
                matmul_many(&x, m, &ws, &mut outs);
            } else {
                matmul_many_with(isa, &x, m, &ws, &mut outs);
            }
            for (w, out) in views.iter().zip(&bufs) {
                check_matmul(&x, m, w, out, &format!("many {isa}"));
            }
        }
    }
}

#[test]
fn simd_and_scalar_agree_on_default_model_shapes() {
    let mut rng = Rng(11);
    for (ty, n, k) in [
        (GgmlType::Q4_1, 64, 576),
        (GgmlType::Q8_0, 96, 576),
        (GgmlType::Q4_1, 40, 1536),
    ] {
        let bytes = random_weight(&mut rng, ty, n, k);
        let w = WeightView::new(ty, n, k, &bytes).expect("view");
        for m in [1, 4, 8] {
            let x: Vec<f32> = (0..m * k).map(|_| rng.normal()).collect();
            let mut a = vec![0f32; m * n];
            let mut b = vec![0f32; m * n];
            matmul_with(Isa::Avx2, &x, m, w, &mut a);
            matmul_with(Isa::Scalar, &x, m, w, &mut b);
            for (p, q) in a.iter().zip(&b) {
                assert!(
                    (p - q).abs() <= 1e-4 * (1.0 + q.abs()),
                    "{ty} m={m}: {p} vs {q}"
                );
            }
        }
    }
}

#[test]
fn empty_shapes() {
    let w = WeightView::new(GgmlType::Q4_1, 0, 64, &[]).expect("empty view");
    let mut out: Vec<f32> = vec![];
    matmul(&[0.0; 128], 2, w, &mut out);
    let w = WeightView::new(GgmlType::F32, 2, 0, &[]).expect("zero-width view");
    let mut out = vec![f32::NAN; 6];
    matmul(&[], 3, w, &mut out);
    assert!(out.iter().all(|&v| v == 0.0));
    let mut none: [&mut [f32]; 0] = [];
    matmul_many(&[], 0, &[], &mut none);
}

#[test]
fn size_errors_are_errors_not_panics() {
    let mut out = vec![0f32; 64];
    // Wrong byte length.
    let e = dequantize(GgmlType::Q4_1, &[0u8; 39], &mut out).expect_err("short");
    assert!(
        matches!(
            e,
            QuantError::ByteLength {
                expected: 40,
                actual: 39,
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(e.kind(), "byte_length");
    let e = dequantize(GgmlType::F32, &[0u8; 257], &mut out).expect_err("long");
    assert!(matches!(e, QuantError::ByteLength { .. }));
    // Not a whole number of blocks.
    let mut out33 = vec![0f32; 33];
    let e = dequantize(GgmlType::Q8_0, &[0u8; 34], &mut out33).expect_err("33 elems");
    assert!(matches!(
        e,
        QuantError::NotBlockMultiple {
            n_elems: 33,
            block_elems: 32,
            ..
        }
    ));
    assert_eq!(e.kind(), "not_block_multiple");
    assert!(e.to_string().contains("Q8_0"), "{e}");
    let e = dequantize(GgmlType::Q6_K, &[0u8; 210], &mut out).expect_err("64 elems");
    assert!(matches!(e, QuantError::NotBlockMultiple { .. }));
    // Row sizes.
    assert!(GgmlType::Q4_K.row_bytes(255).is_err());
    assert_eq!(GgmlType::Q5_K.row_bytes(512).ok(), Some(352));
    // Weight views.
    assert!(WeightView::new(GgmlType::Q4_1, 2, 64, &[0u8; 79]).is_err());
    assert!(WeightView::new(GgmlType::Q4_1, 2, 48, &[0u8; 60]).is_err());
    assert!(WeightView::new(GgmlType::F32, usize::MAX, 2, &[]).is_err());
    let w = WeightView::new(GgmlType::Q4_1, 2, 64, &[0u8; 80]).expect("ok");
    assert_eq!(w.row(1).len(), 40);
    // Dots.
    assert!(vec_dot(GgmlType::Q4_0, &[0u8; 18], &[0.0; 31]).is_err());
    assert!(vec_dot(GgmlType::Q4_0, &[0u8; 17], &[0.0; 32]).is_err());
    // Names.
    let e = "Q3_K".parse::<GgmlType>().expect_err("unsupported");
    assert_eq!(e.kind(), "unknown_type");
    assert_eq!("q4_k".parse::<GgmlType>().ok(), Some(GgmlType::Q4_K));
}

#[test]
#[should_panic(expected = "output must be")]
fn matmul_panics_on_wrong_output_len() {
    let w = WeightView::new(GgmlType::Q8_0, 2, 32, &[0u8; 68]).expect("ok");
    let mut out = vec![0f32; 3];
    matmul(&[0.0; 32], 1, w, &mut out);
}
