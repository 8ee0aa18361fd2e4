//! `ferrite quantize`'s writers checked by the tools that read their formats: the AWQ GEMM,
//! compressed-tensors `pack-quantized` (4- and 3-bit, with and without zero points) and FP8
//! `float-quantized` (per channel, and in blocks) directories it writes from the tiny llama31 fixture were loaded by
//! transformers (compressed-tensors) or dequantized by AutoAWQ's `dequantize_gemm`, and their
//! logits stored in `tests/fixtures/quant/interop/written.json` (`generate.py written`). Here
//! the same commands run again, and ferrite loading what they wrote must give those logits
//! (tolerances as in the engine's `interop.rs`).

mod common;
#[path = "../../engine/tests/common/mod.rs"]
mod engine_common;

use common::{ferrite, stdout_of};
use engine_common::reference::check_cases;
use engine_common::{fixtures, read_json};
use ferrite_engine::model;

fn temp_dir(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("ferrite-written-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

#[test]
fn written_checkpoints_give_the_logits_other_tools_read_from_them() {
    let exp = read_json(&fixtures().join("quant/interop/written.json"));
    let input = fixtures().join("models/llama31");
    let checkpoints = exp["checkpoints"].as_object().expect("checkpoints");
    assert_eq!(checkpoints.len(), 7);
    for (name, c) in checkpoints {
        let out = temp_dir(name);
        let mut args: Vec<String> = vec!["quantize".into()];
        args.extend(
            c["args"]
                .as_array()
                .expect("args")
                .iter()
                .map(|a| a.as_str().expect("string argument").to_owned()),
        );
        args.push(input.to_string_lossy().into_owned());
        args.push(out.to_string_lossy().into_owned());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        stdout_of(&ferrite(&argv));
        let loaded = model::load(&out).unwrap_or_else(|e| panic!("{name}: {e}"));
        let perturbed = c["perturbed_max_abs_diff"].as_f64().map(|v| v as f32);
        let d = check_cases(name, &loaded.model, &c["cases"], perturbed);
        eprintln!(
            "{name} ({}): max |Δ logit| {d:.2e}",
            loaded.model.linear_storage()
        );
        let _ = std::fs::remove_dir_all(&out);
    }
}

#[test]
fn formats_that_cannot_hold_the_scheme_are_refused() {
    let input = fixtures().join("models/llama31");
    let input = input.to_string_lossy();
    let out = temp_dir("refused");
    let out = out.to_string_lossy();
    for (args, want) in [
        (
            vec!["--scheme", "w8a8", "--format", "awq"],
            "compressed-tensors",
        ),
        (vec!["--scheme", "w8a16", "--format", "awq"], "4-bit"),
        (
            vec!["--scheme", "fp8", "--format", "gptq"],
            "compressed-tensors",
        ),
        (
            vec!["--scheme", "fp8", "--method", "gptq"],
            "rounded to nearest",
        ),
        // llama31's k and v are 32 rows: not whole blocks of 64.
        (
            vec!["--scheme", "fp8-block", "--group-size", "64"],
            "not whole 64x64 blocks",
        ),
        (
            vec!["--scheme", "fp8-block", "--group-size", "-1"],
            "needs a block side",
        ),
    ] {
        let mut argv = vec!["quantize"];
        argv.extend(&args);
        argv.extend([&*input, &*out]);
        let r = ferrite(&argv);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success(), "{args:?} succeeded");
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}
