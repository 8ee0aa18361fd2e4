//! `ferrite quantize`, `bench kernels` and `bench forward` through the real binary: arguments,
//! output files and table columns (the numbers themselves are checked in the engine's tests).

mod common;

use std::path::PathBuf;

use common::{ferrite, json_of, stdout_of};

#[test]
fn quantize_writes_a_gptq_checkpoint_and_refuses_bad_arguments() {
    let tiny = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models/qwen2");
    let out_dir = std::env::temp_dir().join(format!("ferrite-cli-quantize-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out_dir);
    let (tiny_s, out_s) = (tiny.to_string_lossy(), out_dir.to_string_lossy());
    let text = stdout_of(&ferrite(&[
        "quantize",
        "--method",
        "rtn",
        "--bits",
        "4",
        "--group-size",
        "32",
        "--sym",
        &tiny_s,
        &out_s,
    ]));
    assert!(text.contains("14 layers quantized to w4g32-sym"), "{text}");
    let cfg: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("config.json")).expect("config"))
            .expect("json");
    let q = &cfg["quantization_config"];
    assert_eq!(
        (
            q["quant_method"].as_str(),
            q["bits"].as_u64(),
            q["group_size"].as_i64(),
            q["sym"].as_bool()
        ),
        (Some("gptq"), Some(4), Some(32), Some(true))
    );
    for bad in [
        vec!["quantize", "--bits", "5", &tiny_s, "/tmp/x"],
        vec![
            "quantize",
            "--bits",
            "4",
            "--group-size",
            "100",
            &tiny_s,
            "/tmp/x",
        ],
        vec!["quantize", "--bits", "4", &tiny_s, &out_s],
    ] {
        let out = ferrite(&bad);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?} succeeded");
        assert!(err.starts_with("error: "), "{bad:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    let _ = std::fs::remove_dir_all(&out_dir);
}

#[test]
fn bench_kernels_prints_the_seed_columns() {
    let text = stdout_of(&ferrite(&[
        "bench",
        "kernels",
        "--models",
        "small",
        "--formats",
        "f16,w4g128",
        "--batch-sizes",
        "1",
        "--runs",
        "1",
    ]));
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        lines[0],
        [
            "device",
            "stage",
            "mode",
            "model",
            "backend",
            "a_dtype",
            "b_dtype",
            "bs",
            "tokens",
            "group_size",
            "latency",
            "gb_per_s"
        ]
    );
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[1][4..7], ["ferrite-f16", "float32", "float16"]);
    assert_eq!(lines[2][4..7], ["ferrite", "float32", "uint4b"]);
    for l in &lines[1..] {
        let latency: f64 = l[10].parse().expect("latency");
        assert!(latency > 0.0, "{l:?}");
    }
    // Whole models run on the GPU: without one, a clear refusal (on the GPU host the mode
    // runs, and its rows are the closing note's).
    if !std::path::Path::new("/dev/nvidiactl").exists() {
        let out = ferrite(&["bench", "kernels", "--mode", "model"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("--mode model runs on cuda:0") && !err.contains("panicked"),
            "{err}"
        );
    }
}

#[test]
fn bench_forward_prints_the_seed_table() {
    let text = stdout_of(&ferrite(&[
        "bench",
        "forward",
        "--sizes",
        "small",
        "--contexts",
        "16",
        "--warmups",
        "0,1",
        "--trials",
        "2",
    ]));
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("| model_size | d_model | context_length |"),
        "{text}"
    );
    assert!(lines[1].starts_with("|:-----------|--------:|"), "{text}");
    assert_eq!(lines.len(), 4, "{text}");
    assert!(
        lines[2].starts_with("| small      |     768 |             16 |"),
        "{text}"
    );
}

/// `bench forward --device cuda` times prefill steps on the GPU over random weights made
/// there: on the GPU host it prints the seed's rows; elsewhere it is refused clearly.
#[test]
fn bench_forward_on_cuda_runs_or_is_refused_clearly() {
    let out = ferrite(&[
        "bench",
        "forward",
        "--device",
        "cuda",
        "--sizes",
        "small",
        "--contexts",
        "16,32",
        "--warmups",
        "1",
        "--trials",
        "2",
        "--json",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    if std::path::Path::new("/dev/nvidiactl").exists() {
        let rows = json_of(&out);
        let rows = rows.as_array().expect("rows");
        assert_eq!(rows.len(), 2, "{rows:?}");
        for r in rows {
            assert!(r["mean_time_ms"].as_f64().is_some_and(|t| t > 0.0), "{r}");
        }
    } else {
        assert!(!out.status.success(), "ran without a GPU: {err}");
        assert!(err.contains("use --device cpu"), "{err}");
    }
}
