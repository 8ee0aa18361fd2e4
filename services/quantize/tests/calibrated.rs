//! `ferrite quantize` with calibration (GPTQ, AWQ, SmoothQuant) and from GGUF input, on the
//! tiny fixtures: what is written loads back and computes what the quantizer meant.

// The engine's test helpers (fixture paths, a one-sequence forward), shared rather than copied.
#[path = "../../engine/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};

use common::*;
use ferrite_engine::model::{self, LoadOptions, LoadQuantize, LogitsWanted};
use ferrite_kernels::fp8::Fp8Scales;
use ferrite_kernels::wq::WqFormat;
use ferrite_quantize::calib::{CalibOptions, LayerReport, Method, Scheme, SmoothWeights};
use ferrite_quantize::{CalibText, QuantizeJob, quantize_model};

fn tempdir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ferrite-calibrated-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Deterministic calibration token ids (the fixtures have no tokenizer).
fn calib_tokens(vocab: u32, n: usize) -> Vec<u32> {
    let mut s = 12345u32;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_103_515_245).wrapping_add(12345);
            (s >> 8) % vocab
        })
        .collect()
}

fn job(input: &Path, output: &Path, opts: CalibOptions) -> QuantizeJob {
    QuantizeJob {
        input: input.to_owned(),
        output: output.to_owned(),
        opts,
        calib: CalibText::Tokens(calib_tokens(256, 256)),
        calib_tokens: 256,
        format: None,
    }
}

fn logits(path: &Path, options: LoadOptions, prompt: &[u32]) -> Vec<f32> {
    let loaded = model::load_with(path, options).unwrap_or_else(|e| panic!("{e}"));
    prefill_logits(&loaded.model, prompt, LogitsWanted::All)
}

const PROMPT: [u32; 9] = [1, 17, 200, 42, 9, 99, 128, 3, 77];

/// A GGUF input becomes a Hugging Face directory: Llama's interleaved Q/K rows are put back
/// in Hugging Face order (the directory runs with rotate-half RoPE) and the logits are those
/// of quantizing the GGUF model at load.
#[test]
fn gguf_input_writes_a_hugging_face_directory_with_the_same_function() {
    let gguf = fixtures().join("models/llama2_tied/model.gguf");
    let format: WqFormat = "w4g32".parse().expect("format");
    let out = tempdir("gguf");
    let r = quantize_model(
        &job(
            &gguf,
            &out,
            CalibOptions::new(Method::Rtn, Scheme::WeightOnly(format)),
        ),
        &mut |_| {},
    )
    .expect("quantize");
    assert_eq!(r.quantized_layers, 14);
    let from_dir = logits(&out, LoadOptions::default(), &PROMPT);
    let at_load = logits(
        &gguf,
        LoadOptions {
            quantize: Some(LoadQuantize::Weights(format)),
            ..LoadOptions::default()
        },
        &PROMPT,
    );
    // Same codes; only the order of each head's dimensions in the attention sums differs.
    let d = max_abs_diff(&from_dir, &at_load);
    assert!(d < 1e-4, "logits differ by {d}");
    let _ = std::fs::remove_dir_all(&out);
    // Exported unquantized (`--scheme f32`): the GGUF model's own logits.
    let opts = CalibOptions::new(Method::Rtn, Scheme::F32);
    quantize_model(&job(&gguf, &out, opts), &mut |_| {}).expect("export");
    let exported = model::load(&out).expect("load");
    assert_eq!(exported.model.linear_storage(), "F32");
    let got = prefill_logits(&exported.model, &PROMPT, LogitsWanted::All);
    let d = max_abs_diff(&got, &logits(&gguf, LoadOptions::default(), &PROMPT));
    assert!(d < 1e-4, "exported logits differ by {d}");
    let _ = std::fs::remove_dir_all(&out);
}

/// FP8 blocks from a GGUF file: blocks holding whole heads (16 rows here) are written in Hugging
/// Face order and load back close to the original; blocks that split a head (8 rows) are
/// refused before any layer is quantized.
#[test]
fn gguf_input_to_fp8_blocks_keeps_whole_heads() {
    let gguf = fixtures().join("models/llama2_tied/model.gguf");
    let out = tempdir("fp8-blocks");
    let blocks = |side| {
        Scheme::Fp8(Fp8Scales::Block {
            rows: side,
            cols: side,
        })
    };
    let opts = CalibOptions::new(Method::Rtn, blocks(16));
    quantize_model(&job(&gguf, &out, opts), &mut |_| {}).expect("quantize");
    let loaded = model::load(&out).expect("load");
    assert_eq!(loaded.model.linear_storage(), "fp8-e4m3-b16x16");
    let got = prefill_logits(&loaded.model, &PROMPT, LogitsWanted::All);
    let want = logits(&gguf, LoadOptions::default(), &PROMPT);
    let range = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = max_abs_diff(&got, &want);
    // e4m3 keeps 3 mantissa bits of weights and activations: a few percent, not a scramble.
    assert!(d < 0.1 * range, "logits moved by {d} of {range}");
    let _ = std::fs::remove_dir_all(&out);
    let mut layers = 0;
    let opts = CalibOptions::new(Method::Rtn, blocks(8));
    let e = quantize_model(&job(&gguf, &out, opts), &mut |_| layers += 1).expect_err("8 rows");
    assert!(
        e.to_string()
            .contains("split the GGUF model's heads of 16 rows"),
        "{e}"
    );
    assert_eq!(layers, 0, "refused after quantizing");
    let _ = std::fs::remove_dir_all(&out);
}

/// `--quantize rtn-w8a8` and `rtn-fp8` at load compute exactly what the checkpoints
/// `ferrite quantize --method rtn` writes in those schemes compute.
#[test]
fn w8a8_and_fp8_at_load_equal_their_rtn_checkpoints() {
    let qwen2 = fixtures().join("models/qwen2");
    for (scheme, at_load, storage) in [
        (Scheme::W8A8, LoadQuantize::W8A8, "w8a8-int8"),
        (
            Scheme::Fp8(Fp8Scales::Channel),
            LoadQuantize::Fp8,
            "fp8-e4m3",
        ),
    ] {
        let out = tempdir(&format!("at-load-{storage}"));
        let opts = CalibOptions::new(Method::Rtn, scheme);
        quantize_model(&job(&qwen2, &out, opts), &mut |_| {}).expect("quantize");
        let from_dir = logits(&out, LoadOptions::default(), &PROMPT);
        let options = LoadOptions {
            quantize: Some(at_load),
            ..LoadOptions::default()
        };
        let loaded = model::load_with(&qwen2, options).expect("load");
        assert_eq!(loaded.model.linear_storage(), storage);
        let got = prefill_logits(&loaded.model, &PROMPT, LogitsWanted::All);
        assert_eq!(got, from_dir, "{storage}: at load vs checkpoint");
        let _ = std::fs::remove_dir_all(&out);
    }
    assert_eq!(model::parse_quantize("rtn-w8a8"), Ok(LoadQuantize::W8A8));
    assert_eq!(model::parse_quantize("rtn-fp8"), Ok(LoadQuantize::Fp8));
    assert!(model::parse_quantize("fp8").is_err(), "the method is named");
}

/// Mixtures of experts by round-to-nearest: every expert (and Qwen2-MoE's shared one) is
/// written quantized under its checkpoint's own names, the routers in float. The GPTQ
/// checkpoints pass the numpy check (every other tensor copied unchanged) and, like the W8A8
/// ones (compressed-tensors, routers in `ignore`), compute exactly what quantizing at load
/// does. Calibrating methods are refused before anything is written, naming `--method rtn`.
#[test]
fn mixtures_of_experts_quantize_by_rtn_and_load_back() {
    let w4: WqFormat = "w4g32".parse().expect("format");
    // Per layer: q, k, v, o, 4 experts' gate, up and down, and Qwen2-MoE's shared expert.
    for (dir, projections) in [("mixtral", 2 * (4 + 12)), ("qwen2_moe", 2 * (4 + 12 + 3))] {
        let src = fixtures().join("models").join(dir);
        for (scheme, at_load) in [
            (Scheme::WeightOnly(w4), LoadQuantize::Weights(w4)),
            (Scheme::W8A8, LoadQuantize::W8A8),
        ] {
            let out = tempdir(&format!("moe-{dir}-{scheme}"));
            let opts = CalibOptions::new(Method::Rtn, scheme);
            let report = quantize_model(&job(&src, &out, opts), &mut |_| {}).expect("quantize");
            assert_eq!(report.quantized_layers, projections, "{dir} {scheme}");
            if scheme == Scheme::W8A8 {
                let cfg = read_json(&out.join("config.json"));
                let ignore = cfg["quantization_config"]["ignore"].to_string();
                assert!(ignore.contains("block_sparse_moe\\\\.gate"), "{ignore}");
            } else {
                let check = std::process::Command::new("python3")
                    .arg(fixtures().join("quant/gptq_check.py"))
                    .args([&src, &out])
                    .output()
                    .expect("python3");
                let said = String::from_utf8_lossy(&check.stderr);
                assert!(check.status.success(), "{dir}: gptq_check.py: {said}");
            }
            let from_dir = logits(&out, LoadOptions::default(), &PROMPT);
            let options = LoadOptions {
                quantize: Some(at_load),
                ..LoadOptions::default()
            };
            let want = logits(&src, options, &PROMPT);
            assert_eq!(from_dir, want, "{dir} {scheme}: checkpoint vs at load");
            let _ = std::fs::remove_dir_all(&out);
        }
        let out = tempdir(&format!("moe-{dir}-gptq"));
        let opts = CalibOptions::new(Method::Gptq, Scheme::WeightOnly(w4));
        let e = quantize_model(&job(&src, &out, opts), &mut |_| {}).expect_err("calibrated");
        assert!(e.to_string().contains("--method rtn"), "{e}");
        assert!(!out.exists(), "{dir}: written before refusing");
    }
}

/// Checkpoints the writers cannot make are refused before any layer is quantized: Phi-3's
/// (fused projections), a multimodal Gemma 3's (its vision tower would be lost) and a
/// sequence classifier's (its head would be).
#[test]
fn phi3_multimodal_and_classifier_checkpoints_are_refused_before_quantizing() {
    let w4: WqFormat = "w4g32".parse().expect("format");
    let refused = [
        ("phi3", "fused"),
        ("gemma3_mm", "multimodal"),
        ("llama_classify", "sequence classifier"),
    ];
    for (dir, says) in refused {
        let src = fixtures().join("models").join(dir);
        let out = tempdir(&format!("refused-{dir}"));
        let opts = CalibOptions::new(Method::Rtn, Scheme::WeightOnly(w4));
        let mut layers = 0;
        let e = quantize_model(&job(&src, &out, opts), &mut |_| layers += 1).expect_err(dir);
        assert!(e.to_string().contains(says), "{dir}: {e}");
        assert_eq!(layers, 0, "{dir}: layers quantized before refusing");
        assert!(!out.exists(), "{dir}: written before refusing");
    }
}

/// GPTQ lowers every layer's output error below RTN's on the calibration inputs; AWQ and
/// SmoothQuant (scales folded into the norms and producers) keep the model's function.
#[test]
fn calibrated_methods_load_and_stay_close_to_the_original() {
    let qwen2 = fixtures().join("models/qwen2");
    let original = logits(&qwen2, LoadOptions::default(), &PROMPT);
    let format = Scheme::WeightOnly("w8g32".parse().expect("format"));
    let mut smooth_gptq = CalibOptions::new(Method::SmoothQuant, format);
    smooth_gptq.smooth_weights = SmoothWeights::Gptq;
    let mut smooth_awq = CalibOptions::new(Method::SmoothQuant, format);
    smooth_awq.smooth_weights = SmoothWeights::Awq;
    let mut w8a8_smooth_gptq = CalibOptions::new(Method::SmoothQuant, Scheme::W8A8);
    w8a8_smooth_gptq.smooth_weights = SmoothWeights::Gptq;
    let mut moved = Vec::new();
    for (name, opts) in [
        ("gptq", CalibOptions::new(Method::Gptq, format)),
        ("awq", CalibOptions::new(Method::Awq, format)),
        (
            "smoothquant",
            CalibOptions::new(Method::SmoothQuant, format),
        ),
        ("smoothquant-gptq", smooth_gptq),
        ("smoothquant-awq", smooth_awq),
        ("w8a8-rtn", CalibOptions::new(Method::Rtn, Scheme::W8A8)),
        ("w8a8-gptq", CalibOptions::new(Method::Gptq, Scheme::W8A8)),
        (
            "w8a8-smoothquant",
            CalibOptions::new(Method::SmoothQuant, Scheme::W8A8),
        ),
        ("w8a8-smoothquant-gptq", w8a8_smooth_gptq),
    ] {
        let mut opts = opts;
        opts.ctx = 64;
        let out = tempdir(name);
        let mut reports: Vec<LayerReport> = Vec::new();
        let r = quantize_model(&job(&qwen2, &out, opts), &mut |r| reports.push(r.clone()))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let tokens = if opts.method == Method::Rtn { 0 } else { 256 };
        assert_eq!(
            (r.quantized_layers, r.calibration_tokens),
            (14, tokens),
            "{name}"
        );
        assert_eq!(reports.len(), 2, "{name}: one report per layer");
        if opts.method == Method::Gptq || opts.smooth_weights == SmoothWeights::Gptq {
            for l in &reports {
                assert!(
                    l.gptq_error < l.rtn_error,
                    "{name}: layer {} gptq {} rtn {}",
                    l.index,
                    l.gptq_error,
                    l.rtn_error
                );
            }
        }
        if name == "w8a8-rtn" {
            // The compressed-tensors layout, checked by numpy alone.
            let check = std::process::Command::new("python3")
                .arg(fixtures().join("quant/compressed_check.py"))
                .arg(&qwen2)
                .arg(&out)
                .output()
                .expect("python3");
            assert!(
                check.status.success(),
                "compressed_check.py: {}{}",
                String::from_utf8_lossy(&check.stdout),
                String::from_utf8_lossy(&check.stderr)
            );
        }
        let loaded = model::load(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want_storage = if opts.scheme == Scheme::W8A8 {
            "w8a8-int8"
        } else {
            "w8g32"
        };
        assert_eq!(loaded.model.linear_storage(), want_storage, "{name}");
        let got = prefill_logits(&loaded.model, &PROMPT, LogitsWanted::All);
        let d = max_abs_diff(&got, &original);
        // 8-bit weights (and, for W8A8, 8-bit activations per token) on logits of magnitude
        // ~1: a few hundredths at most.
        eprintln!("{name}: max |Δ logit| {d}");
        // Logits reach ~2.6 here. 8-bit weights in groups of 32 move them by ~0.035 on this
        // random model; per-token int8 activations (W8A8) add about as much again.
        let bound = if opts.scheme == Scheme::W8A8 {
            0.15
        } else {
            0.05
        };
        assert!(d < bound, "{name}: logits moved by {d}");
        moved.push((name, d));
        let _ = std::fs::remove_dir_all(&out);
    }
    // SmoothQuant's point: W8A8 with smoothed activations is closer than without.
    let d = |n: &str| moved.iter().find(|(m, _)| *m == n).map(|(_, d)| *d);
    assert!(d("w8a8-smoothquant") < d("w8a8-rtn"), "{moved:?}");
}

/// SmolLM3 (layers without rotation), Granite (multipliers) and OLMo 2 (norms after attention
/// and the MLP only): an RTN checkpoint computes exactly what quantizing at load does (its
/// config and norms written back whole), and AWQ, which has no norm before OLMo 2's q/k/v or
/// gate/up to fold its scales into and scales o and down alone there, writes one that loads
/// and stays near the original.
#[test]
fn llama_variants_quantize_and_load_back() {
    let w8: WqFormat = "w8g32".parse().expect("format");
    for dir in ["smollm3", "granite", "olmo2"] {
        let src = fixtures().join("models").join(dir);
        let out = tempdir(&format!("variant-{dir}-rtn"));
        let opts = CalibOptions::new(Method::Rtn, Scheme::WeightOnly(w8));
        quantize_model(&job(&src, &out, opts), &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
        let options = LoadOptions {
            quantize: Some(LoadQuantize::Weights(w8)),
            ..LoadOptions::default()
        };
        let want = logits(&src, options, &PROMPT);
        assert_eq!(logits(&out, LoadOptions::default(), &PROMPT), want, "{dir}");
        let _ = std::fs::remove_dir_all(&out);

        let original = logits(&src, LoadOptions::default(), &PROMPT);
        let mut opts = CalibOptions::new(Method::Awq, Scheme::WeightOnly(w8));
        opts.ctx = 64;
        let out = tempdir(&format!("variant-{dir}-awq"));
        quantize_model(&job(&src, &out, opts), &mut |_| {}).unwrap_or_else(|e| panic!("{e}"));
        let d = max_abs_diff(&logits(&out, LoadOptions::default(), &PROMPT), &original);
        // 8-bit groups of 32 on these random models move the logits by 0.005-0.07 (RTN's
        // 0.039 on SmolLM3's, AWQ's 0.062: its search minimizes each projection's error, not
        // the logits'); a lost option moves them by 0.16 or more (their feature_effects).
        assert!(d < 0.1, "{dir}: AWQ moved the logits by {d}");
        let _ = std::fs::remove_dir_all(&out);
    }
}
