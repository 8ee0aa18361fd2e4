//! `ferrite generate` end to end: the real binary on the default model, compared with the
//! transformers fixture, and its refusals of bad input.

mod common;

use std::path::PathBuf;
use std::process::Output;

use common::{ferrite, json_of};

fn fixture() -> serde_json::Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/golden/smollm2_q4_1.json");
    serde_json::from_slice(&std::fs::read(&p).expect("fixture")).expect("json")
}

fn ids(v: &serde_json::Value) -> Vec<u64> {
    v.as_array()
        .expect("ids")
        .iter()
        .map(|x| x.as_u64().expect("id"))
        .collect()
}

fn case(name: &str) -> serde_json::Value {
    fixture()["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or_else(|| panic!("no case {name}"))
}

#[test]
fn greedy_json_matches_the_reference() {
    let c = case("plain_english");
    let out = json_of(&ferrite(&[
        "generate",
        "--prompt",
        c["prompt"].as_str().expect("prompt"),
        "--max-tokens",
        "16",
        "--temperature",
        "0",
        "--ignore-eos",
        "--json",
        // transformers' arithmetic: the exact path (int8 activations, the default, may flip
        // a near tie).
        "--cpu-activations",
        "f32",
    ]));
    assert_eq!(ids(&out["prompt_token_ids"]), ids(&c["prompt_token_ids"]));
    assert_eq!(ids(&out["token_ids"]), ids(&c["greedy_token_ids"])[..16]);
    assert_eq!(out["finish_reason"], "length");
    assert!(!out["text"].as_str().expect("text").is_empty());
}

#[test]
fn chat_applies_the_template() {
    let c = fixture()["cases"]
        .as_array()
        .expect("cases")
        .iter()
        .find(|c| c["messages"].as_array().is_some_and(|m| m.len() == 1))
        .cloned()
        .expect("a single-message chat case");
    let prompt = c["messages"][0]["content"].as_str().expect("content");
    let out = json_of(&ferrite(&[
        "generate",
        "--chat",
        "--prompt",
        prompt,
        "--max-tokens",
        "8",
        "--json",
        "--cpu-activations",
        "f32",
    ]));
    assert_eq!(out["rendered_prompt"], c["rendered"]);
    assert_eq!(ids(&out["prompt_token_ids"]), ids(&c["prompt_token_ids"]));
    let want = ids(&c["greedy_token_ids"]);
    let got = ids(&out["token_ids"]);
    assert_eq!(got[..], want[..got.len()], "greedy chat continuation");
}

#[test]
fn seeded_sampling_is_reproducible_and_streaming_prints_text() {
    let args = [
        "generate",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "12",
        "--temperature",
        "0.9",
        "--seed",
        "42",
        "--json",
    ];
    let a = json_of(&ferrite(&args));
    let b = json_of(&ferrite(&args));
    assert_eq!(a["token_ids"], b["token_ids"]);
    let streamed = ferrite(&[
        "generate",
        "--prompt",
        "Once upon a time",
        "--max-tokens",
        "12",
        "--temperature",
        "0.9",
        "--seed",
        "42",
    ]);
    assert!(streamed.status.success());
    let text = String::from_utf8(streamed.stdout).expect("utf-8");
    assert_eq!(
        text.trim_end_matches('\n'),
        a["text"].as_str().expect("text")
    );
}

#[test]
fn stop_strings_end_the_text_before_the_stop() {
    let c = case("plain_english");
    let full = json_of(&ferrite(&[
        "generate",
        "--prompt",
        c["prompt"].as_str().expect("p"),
        "--max-tokens",
        "16",
        "--json",
    ]));
    let text = full["text"].as_str().expect("text");
    // Stop at the first word of the continuation past its first character.
    let stop = text.split_whitespace().nth(1).expect("two words");
    let out = json_of(&ferrite(&[
        "generate",
        "--prompt",
        c["prompt"].as_str().expect("p"),
        "--max-tokens",
        "16",
        "--stop",
        stop,
        "--json",
    ]));
    let cut = out["text"].as_str().expect("text");
    assert!(
        !cut.contains(stop),
        "{cut:?} contains the stop string {stop:?}"
    );
    assert!(text.starts_with(cut), "{cut:?} is not a prefix of {text:?}");
    assert_eq!(out["finish_reason"], "stop");
}

fn assert_clean_error(out: &Output, needle: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "should fail");
    assert!(
        stderr.contains("error:") && stderr.contains(needle),
        "stderr: {stderr}"
    );
    assert!(
        !stderr.contains("panicked"),
        "panic reached the user: {stderr}"
    );
}

#[test]
fn bad_input_gets_a_clear_error() {
    assert_clean_error(&ferrite(&["generate", "--prompt", ""]), "prompt is empty");
    assert_clean_error(
        &ferrite(&[
            "generate",
            "--model",
            "/no/such/model.gguf",
            "--prompt",
            "hi",
        ]),
        "/no/such/model.gguf",
    );
    let long = "word ".repeat(50);
    assert_clean_error(
        &ferrite(&["generate", "--prompt", &long, "--max-model-len", "16"]),
        "context holds 16",
    );
    assert_clean_error(
        &ferrite(&["generate", "--prompt", "hi", "--top-p", "0"]),
        "top_p",
    );
}

/// Without a CUDA device, `--device cuda` is refused before anything loads, with the reason
/// and the way out; `--device cpu` and the default run. (On a GPU host `--device cuda` runs:
/// the engine's CUDA tests cover it there.)
#[test]
fn device_cuda_is_refused_clearly_and_cpu_runs() {
    let gpu_host = std::path::Path::new("/dev/nvidiactl").exists();
    let out = ferrite(&[
        "generate",
        "--device",
        "cuda",
        "--prompt",
        "Hi",
        "--max-tokens",
        "1",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    if !gpu_host {
        assert!(!out.status.success(), "--device cuda ran: {err}");
        assert!(err.contains("--device cuda:0: "), "{err}");
        assert!(err.contains("use --device cpu"), "{err}");
    }
    let out = ferrite(&["generate", "--device", "gpu", "--prompt", "Hi"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("cpu, cuda, cuda:N or auto"));
    for device in ["cpu", "auto"] {
        let out = ferrite(&[
            "generate",
            "--device",
            device,
            "--prompt",
            "Hi",
            "--max-tokens",
            "2",
            "--json",
        ]);
        json_of(&out);
    }
}

/// int8 activations are the CPU default for GGUF block weights (llama.cpp's arithmetic):
/// the logprobs of a one-token step differ from the exact path's, slightly.
#[test]
fn int8_activations_are_the_default_and_f32_the_exact_choice() {
    let run = |extra: &[&str]| {
        let mut args = vec![
            "generate",
            "--prompt",
            "The capital of France is",
            "--max-tokens",
            "4",
            "--logprobs",
            "1",
            "--json",
        ];
        args.extend_from_slice(extra);
        let out = json_of(&ferrite(&args));
        out["logprobs"]
            .as_array()
            .expect("logprobs")
            .iter()
            .map(|t| t["logprob"].as_f64().expect("logprob"))
            .collect::<Vec<f64>>()
    };
    let default = run(&[]);
    let int8 = run(&["--cpu-activations", "int8"]);
    let exact = run(&["--cpu-activations", "f32"]);
    assert_eq!(default, int8);
    assert_ne!(default, exact);
    for (a, b) in default.iter().zip(&exact) {
        assert!((a - b).abs() < 0.1, "{default:?} vs {exact:?}");
    }
}
