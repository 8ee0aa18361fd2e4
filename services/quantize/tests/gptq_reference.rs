//! ferrite's GPTQ against an independent numpy implementation of the reference algorithm
//! (`tests/fixtures/quant/gptq_reference.py`, which wrote the fixture) on the same layer and
//! Hessian: the same codes, scales and zero points, and the same output error.

use ferrite_kernels::wq::WqFormat;
use ferrite_quantize::gptq::{GptqOptions, quantize_gptq};
use serde_json::Value;

const FIXTURE: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tests/fixtures/quant/gptq_reference.json"
));

/// The generator's xorshift32 stream and layer, bit for bit (f32 arithmetic, no fused ops).
fn layer(rows: usize, cols: usize, tokens: usize) -> (Vec<f32>, Vec<f64>) {
    let mut s = 0x2545_f491u32;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 17;
        s ^= s << 5;
        s as f32 / 4_294_967_295.0f32 - 0.5
    };
    let w: Vec<f32> = (0..rows * cols).map(|_| next() * 0.2).collect();
    let mut x = vec![0f32; tokens * cols];
    for t in 0..tokens {
        let common = next();
        for c in 0..cols {
            let loud = if c % 13 == 5 { 6.0 } else { 1.0 };
            x[t * cols + c] = (next() + 0.5 * common) * loud;
        }
        x[t * cols + 7] = 0.0;
        x[t * cols + 100] = 0.0;
    }
    let mut h = vec![0f64; cols * cols];
    for xt in x.chunks_exact(cols) {
        for i in 0..cols {
            for j in 0..cols {
                h[i * cols + j] += f64::from(xt[i]) * f64::from(xt[j]);
            }
        }
    }
    (w, h)
}

#[test]
fn gptq_matches_the_numpy_reference() {
    let fx: Value = serde_json::from_str(FIXTURE).expect("fixture");
    let n = |k: &str| fx[k].as_u64().expect(k) as usize;
    let (rows, cols) = (n("rows"), n("cols"));
    let (w, h) = layer(rows, cols, n("tokens"));
    for case in fx["cases"].as_array().expect("cases") {
        let bits = case["bits"].as_u64().expect("bits");
        let group = case["group_size"].as_i64().expect("group");
        let sym = case["sym"].as_bool().expect("sym");
        let name = format!(
            "w{bits}{}{}",
            if group == -1 {
                "pc".to_owned()
            } else {
                format!("g{group}")
            },
            if sym { "-sym" } else { "" }
        );
        let format: WqFormat = name.parse().expect("format");
        let opts = GptqOptions {
            damp: 0.01,
            block_size: case["block_size"].as_u64().expect("block") as usize,
            act_order: case["act_order"].as_bool().expect("act_order"),
        };
        let label = format!("{name} act_order={} {opts:?}", opts.act_order);
        let (q, stats) = quantize_gptq(&w, rows, cols, &h, format, opts).expect(&label);
        let ints = |k: &str| -> Vec<u64> {
            case[k]
                .as_array()
                .expect(k)
                .iter()
                .map(|v| v.as_u64().expect(k))
                .collect()
        };
        let want_codes = ints("codes");
        let got_codes: Vec<u64> = q.codes().iter().map(|&c| u64::from(c)).collect();
        let differ = want_codes
            .iter()
            .zip(&got_codes)
            .filter(|(a, b)| a != b)
            .count();
        // Both compute in f64 from the same inputs; only the Hessian's summation order
        // differs (~1e-16), which can move a value across a rounding boundary only when it
        // sits within that distance of one: no code may differ.
        assert_eq!(differ, 0, "{label}: {differ} codes differ");
        let want_scales: Vec<f32> = case["scales"]
            .as_array()
            .expect("scales")
            .iter()
            .map(|v| v.as_f64().expect("scale") as f32)
            .collect();
        assert_eq!(q.scales(), want_scales.as_slice(), "{label}: scales");
        let want_zeros: Vec<u8> = ints("zeros").iter().map(|&z| z as u8).collect();
        assert_eq!(q.zeros(), want_zeros, "{label}: zeros");
        let want_err = case["output_error"].as_f64().expect("error");
        let rel = (stats.output_error - want_err).abs() / want_err;
        assert!(
            rel < 1e-9,
            "{label}: output error {} vs {want_err}",
            stats.output_error
        );
        assert_eq!(stats.damp, case["damp"].as_f64().expect("damp"), "{label}");
    }
}
