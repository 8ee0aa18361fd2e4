//! Quantized checkpoints written by other tools load in ferrite and give the logits
//! transformers gives on them: llm-compressor's compressed-tensors (GPTQ W4A16 and W8A16
//! `pack-quantized`, AWQ W4A16 with zero points, SmoothQuant + GPTQ W8A8 and GPTQ W4A8
//! `int-quantized`, FP8
//! dynamic, static and block-scaled `float-quantized`), AutoAWQ's GEMM format, and
//! transformers' own block-scaled FP8 format (`quant_method: fp8`). The checkpoints, the
//! reference logits and how they were made: `tests/fixtures/quant/interop/generate.py`.
//!
//! # Tolerances
//!
//! - Weight-only checkpoints: ferrite multiplies the same integer codes by the same f16/bf16
//!   scales as compressed-tensors' decompression (or AutoAWQ's `dequantize_gemm`), exactly in
//!   f32, so the logits differ only by f32 summation order: [`TIGHT`] = 1e-4 on logits of
//!   magnitude ≤ 3 (observed ≤ 1e-5).
//! - Checkpoints that quantize activations at run time (W8A8, FP8) compare the same way, as long
//!   as no activation sits within float round-off of a rounding tie. One that does rounds either
//!   way depending on summation order, and the two sides then differ by one code step of that
//!   activation, as much as the reference itself moves when its inputs are perturbed by 1e-6
//!   (`perturbed_max_abs_diff`). A case may therefore miss [`TIGHT`] only when the generator
//!   found an activation within [`TIE`] (relative) of a tie, and then by at most twice that
//!   perturbation; at least half of a checkpoint's cases must match tightly.
//! - W8A8 and W4A8 int8 activations: ferrite (like vLLM's kernels) scales activations by `max|x| / 127`, while
//!   compressed-tensors' fake quantization in transformers uses `max|x| / 127.5`. The tight
//!   comparison is with a transformers run using vLLM's convention (`vllm_int8_cases`); against
//!   transformers' own W8A8 forward ferrite is as far as the two conventions are from each
//!   other in transformers (they round to grids 0.4% apart, which moves the logits about as
//!   much as activation rounding itself).
//! - Greedy tokens: teacher-forced on the reference's tokens, ferrite's argmax must be the
//!   reference's at every step whose top-2 margin exceeds twice the case's tolerance.

mod common;

use std::path::PathBuf;

use common::reference::{TIGHT, check_cases};
use common::*;
use ferrite_engine::model::{self, LlamaModel, LogitsWanted};
use serde_json::{Value, json};

fn dir(name: &str) -> PathBuf {
    fixtures().join("quant/interop").join(name)
}

fn load(name: &str) -> (LlamaModel, Value) {
    let loaded = model::load(&dir(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    (loaded.model, read_json(&dir(name).join("expected.json")))
}

#[test]
fn weight_only_checkpoints_match_transformers() {
    for (name, storage) in [
        ("ct_gptq_w4a16", "w4g32-sym-bf16"),
        ("ct_gptq_w8a16", "w8pc-sym"),
        ("ct_awq_w4a16_asym", "w4g32-bf16"),
        ("autoawq_gemm", "w4g32"),
    ] {
        let (model, exp) = load(name);
        assert_eq!(model.linear_storage(), storage, "{name}");
        let d = check_cases(name, &model, &exp["cases"], None);
        eprintln!("{name}: max |Δ logit| {d:.2e}");
    }
}

#[test]
fn fp8_checkpoints_match_transformers() {
    for (name, storage) in [
        ("ct_fp8_dynamic", "fp8-e4m3"),
        ("ct_fp8_static", "fp8-e4m3"),
        ("ct_fp8_block", "fp8-e4m3-b16x32"),
        ("hf_fp8_block", "fp8-e4m3-b16x32"),
    ] {
        let (model, exp) = load(name);
        assert_eq!(model.linear_storage(), storage, "{name}");
        let perturbed = exp["perturbed_max_abs_diff"].as_f64().map(|v| v as f32);
        let d = check_cases(name, &model, &exp["cases"], perturbed);
        eprintln!("{name}: max |Δ logit| {d:.2e} (tight cases)");
        // Activation rounding matters: without it the logits move by far more.
        for (case, wo) in exp["cases"]
            .as_array()
            .expect("cases")
            .iter()
            .zip(exp["weights_only_first_logits"].as_array().expect("array"))
        {
            let moved = max_abs_diff(&floats(&case["first_logits"]), &floats(wo));
            assert!(
                moved > 100.0 * TIGHT,
                "{name}: activation rounding moved {moved}"
            );
        }
    }
}

#[test]
fn int8_activation_checkpoints_match_vllms_int8_convention() {
    for (name, storage) in [
        ("ct_smoothquant_w8a8", "w8a8-int8"),
        ("ct_gptq_w4a8", "w4g32-sym-bf16-a8"),
    ] {
        check_int8_activations(name, storage);
    }
}

fn check_int8_activations(name: &str, storage: &str) {
    let (model, exp) = load(name);
    assert_eq!(model.linear_storage(), storage, "{name}");
    let perturbed = exp["perturbed_max_abs_diff"].as_f64().map(|v| v as f32);
    let d = check_cases(name, &model, &exp["vllm_int8_cases"], perturbed);
    eprintln!("{name}: max |Δ logit| vs vLLM's convention {d:.2e}");
    // Against compressed-tensors' own fake quantization (max|x| / 127.5): as far as the two
    // conventions are from each other in transformers.
    let cases = exp["cases"].as_array().expect("cases");
    let vllm = exp["vllm_int8_cases"].as_array().expect("array");
    let weights_only = exp["weights_only_first_logits"].as_array().expect("array");
    for (i, (case, v)) in cases.iter().zip(vllm).enumerate() {
        let want = floats(&case["first_logits"]);
        let got = prefill_logits(&model, &ids(&case["prompt_token_ids"]), LogitsWanted::Last);
        let d = max_abs_diff(&got, &want);
        let conventions = max_abs_diff(&floats(&v["first_logits"]), &want);
        let rounding = max_abs_diff(&floats(&weights_only[i]), &want);
        eprintln!(
            "{name} case {i}: vs transformers' own int8 rounding {d:.4} (conventions differ by \
             {conventions:.4}; activation rounding moves {rounding:.4})"
        );
        assert!(
            d <= conventions + 2.0 * perturbed.unwrap_or(0.0),
            "{name} case {i}: {d}"
        );
    }
}

/// Copies fixture `name` to a temporary directory with `edit` applied to its
/// `quantization_config`, and loads it.
fn load_with_config(name: &str, edit: impl Fn(&mut Value)) -> model::error::Result<LlamaModel> {
    let tmp = std::env::temp_dir().join(format!("ferrite-interop-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).expect("temp dir");
    std::fs::copy(
        dir(name).join("model.safetensors"),
        tmp.join("model.safetensors"),
    )
    .expect("copy");
    let mut cfg = read_json(&dir(name).join("config.json"));
    edit(&mut cfg["quantization_config"]);
    std::fs::write(tmp.join("config.json"), cfg.to_string()).expect("write");
    let loaded = model::load(&tmp).map(|l| l.model);
    let _ = std::fs::remove_dir_all(&tmp);
    loaded
}

/// [`load_with_config`]'s error.
fn load_error_with(name: &str, edit: impl Fn(&mut Value)) -> String {
    load_with_config(name, edit)
        .map(|_| ())
        .expect_err("unsupported checkpoint loaded")
        .to_string()
}

/// compressed-tensors' `naive-quantized` stores integer codes as `int-quantized` does (its
/// compressor is int-quantized's base class): the W4A8 checkpoint named so computes the same.
#[test]
fn naive_quantized_reads_as_int_quantized() {
    let name = "ct_gptq_w4a8";
    let (int_quantized, exp) = load(name);
    let naive = load_with_config(name, |q| {
        q["format"] = "naive-quantized".into();
        q["config_groups"]["group_0"]["format"] = "naive-quantized".into();
    })
    .expect("naive-quantized");
    for case in exp["cases"].as_array().expect("cases") {
        let prompt = ids(&case["prompt_token_ids"]);
        assert_eq!(
            prefill_logits(&naive, &prompt, LogitsWanted::Last),
            prefill_logits(&int_quantized, &prompt, LogitsWanted::Last)
        );
    }
}

#[test]
fn unsupported_variants_are_refused_with_the_reason() {
    let group = |q: &mut Value| q["config_groups"]["group_0"].clone();
    let e = load_error_with("ct_gptq_w4a16", |q| {
        let mut g = group(q);
        g["weights"]["actorder"] = "group".into();
        q["config_groups"]["group_0"] = g;
    });
    assert!(e.contains("act-order"), "{e}");
    let e = load_error_with("ct_smoothquant_w8a8", |q| {
        let mut g = group(q);
        g["input_activations"]["dynamic"] = false.into();
        g["input_activations"]["strategy"] = "tensor".into();
        q["config_groups"]["group_0"] = g;
    });
    assert!(e.contains("static int8 activation"), "{e}");
    let e = load_error_with("ct_gptq_w4a16", |q| {
        q["sparsity_config"] = serde_json::json!({"format": "sparse-24-bitmask"});
    });
    assert!(e.contains("2:4"), "{e}");
    let e = load_error_with("autoawq_gemm", |q| q["version"] = "gemv".into());
    assert!(e.contains("version `gemv`"), "{e}");
    let e = load_error_with("hf_fp8_block", |q| q["scale_fmt"] = "ue8m0".into());
    assert!(e.contains("scale_fmt `ue8m0`"), "{e}");
    // A scale grid of the wrong shape names the tensor and the grid it should be.
    let e = load_error_with("hf_fp8_block", |q| q["weight_block_size"] = json!([32, 16]));
    assert!(
        e.contains("weight_scale_inv has shape [4, 2], expected 2x4"),
        "{e}"
    );
}
