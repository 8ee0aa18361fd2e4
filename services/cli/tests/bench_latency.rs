//! `ferrite bench latency` through the real binary: seed 003's layout, throughputs that follow
//! from the latencies, configurations too long for the model skipped, bad arguments refused.

mod common;

use std::path::PathBuf;

use common::{ferrite, stdout_of};

/// The tiny random-weight Qwen2 checkpoint (2 layers, hidden 64): runs in milliseconds.
fn tiny_model() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/models/qwen2")
        .to_string_lossy()
        .into_owned()
}

/// The number after `prefix` on a detailed-results line, without its unit (`s`, ` tok/s`).
fn number_after(line: &str, prefix: &str) -> f64 {
    let rest = line.trim().strip_prefix(prefix).unwrap_or_else(|| {
        panic!("{line:?} does not start with {prefix:?}");
    });
    let num = rest.trim_end_matches(" tok/s").trim_end_matches('s');
    num.parse()
        .unwrap_or_else(|e| panic!("{num:?} in {line:?}: {e}"))
}

#[test]
fn bench_latency_prints_the_seed_tables() {
    // The `small` preset (d768, 12 layers) makes latencies of ~0.3 s: large enough that the
    // 2-decimal rounding of the printed latency bounds the throughputs to a few percent.
    let (batch, input_len, output_len) = (2.0, 32.0, 8.0);
    let text = stdout_of(&ferrite(&[
        "bench",
        "latency",
        "--load-format",
        "dummy",
        "--model",
        "small",
        "--batch-size",
        "2",
        "--input-len",
        "32",
        "--output-len",
        "8",
        "--runs",
        "2",
    ]));
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "# Performance Benchmark Results", "{text}");
    assert!(
        lines[2].starts_with("**Device:** cpu (") && lines[2].contains("**Model:** small ("),
        "{text}"
    );
    let at = |l: &str| {
        lines
            .iter()
            .position(|x| *x == l)
            .unwrap_or_else(|| panic!("no {l:?} in {text}"))
    };
    let table = at("### Summary Table");
    assert_eq!(
        lines[table - 2],
        "## Configuration: batch_size=2, input_len=32, output_len=8"
    );
    assert_eq!(
        lines[table + 2],
        "| Model | Runs | Latency (s) | Output Throughput (tok/s) | Overall Throughput (tok/s) | Input Throughput (tok/s) |"
    );
    assert_eq!(
        lines[table + 3],
        "|-------|------|-------------|---------------------------|----------------------------|--------------------------|"
    );
    let row: Vec<&str> = lines[table + 4].split(" | ").collect();
    assert_eq!(row[..2], ["| `ferrite-f16_custom`", "2"], "{text}");
    assert_eq!(row[5], "0.00 |", "{text}");

    // Each run: output = batch × output_len / latency and overall = batch × (input_len +
    // output_len) / latency, within the latency's rounding to 0.01 s (and the throughputs' to
    // 0.01 tok/s).
    let mut output_sum = 0.0;
    for run in ["1", "2"] {
        let i = at(&format!("  - `ferrite-f16_custom_run{run}`:"));
        let latency = number_after(lines[i + 1], "- Latency: ");
        let output = number_after(lines[i + 2], "- Output Throughput: ");
        let overall = number_after(lines[i + 3], "- Overall Throughput: ");
        assert_eq!(lines[i + 4].trim(), "- Input Throughput: N/A");
        assert!(latency >= 0.05, "too fast to check the rounding: {text}");
        for (tokens, got) in [
            (batch * output_len, output),
            (batch * (input_len + output_len), overall),
        ] {
            let (lo, hi) = (tokens / (latency + 0.005), tokens / (latency - 0.005));
            assert!(
                lo - 0.01 <= got && got <= hi + 0.01,
                "{got} not in [{lo}, {hi}]: {text}"
            );
        }
        output_sum += output;
    }
    let mean: f64 = row[3]
        .split(" ± ")
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or_else(|| panic!("no mean in {text}"));
    assert!((mean - output_sum / 2.0).abs() <= 0.011, "{text}");
}

#[test]
fn bench_latency_json_throughputs_and_skips() {
    let tiny = tiny_model();
    let text = stdout_of(&ferrite(&[
        "bench",
        "latency",
        "--model",
        &tiny,
        "--configs",
        "interactive,long_context",
        "--max-model-len",
        "256",
        "--runs",
        "2",
        "--json",
    ]));
    let objects: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(objects.len(), 2, "{text}");
    let interactive = &objects[0];
    assert_eq!(interactive["config"], "interactive");
    assert_eq!(
        (
            &interactive["batch_size"],
            &interactive["input_len"],
            &interactive["output_len"]
        ),
        (&1.into(), &128.into(), &64.into())
    );
    let runs = interactive["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 2);
    for r in runs {
        let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
        let latency = f("latency_s");
        assert!(f("ttft_s") > 0.0 && f("ttft_s") <= latency, "{r}");
        assert!(
            (f("output_throughput") * latency - 64.0).abs() < 1e-9,
            "{r}"
        );
        assert!(
            (f("overall_throughput") * latency - 192.0).abs() < 1e-9,
            "{r}"
        );
    }
    // 16384 + 32 tokens do not fit in 256: skipped with the reason, not an error.
    let long = &objects[1];
    assert_eq!(long["config"], "long_context");
    let reason = long["skipped"].as_str().expect("skipped");
    assert!(
        reason.contains("16416") && reason.contains("256"),
        "{reason}"
    );

    let text = stdout_of(&ferrite(&[
        "bench",
        "latency",
        "--model",
        &tiny,
        "--configs",
        "long_context",
        "--max-model-len",
        "256",
    ]));
    assert!(
        text.contains(
            "## Configuration: batch_size=1, input_len=16384, output_len=32\n\nskipped long_context: input_len + output_len = 16416 tokens exceeds the max model length 256"
        ),
        "{text}"
    );
    assert!(!text.contains("Summary Table"), "{text}");
}

/// Two models as seed 003's rows: both in each configuration's table, ranked by output
/// throughput; the sparse rows listed as not measured with the reason; the ranking closes.
#[test]
fn bench_latency_rows_are_ranked_like_the_seeds() {
    let fixtures = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/models");
    let row = |name: &str, dir: &str| format!("{name}={}", fixtures.join(dir).display());
    let text = stdout_of(&ferrite(&[
        "bench",
        "latency",
        "--row",
        &row("original", "qwen2"),
        "--row",
        &row("w8a16_awq", "llama31"),
        "--batch-size",
        "2",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--runs",
        "2",
    ]));
    assert!(text.contains("**Models:**"), "{text}");
    assert!(text.contains("**Total models tested:** 2"), "{text}");
    let table: Vec<&str> = text.lines().filter(|l| l.starts_with("| `")).collect();
    assert_eq!(table.len(), 2, "{text}");
    let mean = |l: &str| -> f64 {
        let cell = l.split(" | ").nth(3).expect("output column");
        cell.split(" ± ")
            .next()
            .and_then(|m| m.parse().ok())
            .expect("mean")
    };
    assert!(mean(table[0]) >= mean(table[1]), "not ranked: {text}");
    for name in ["w8a16_sparse_awq_custom", "w8a8_sparse_smooth_gptq_custom"] {
        assert!(
            text.contains(&format!(
                "- `{name}`: not measured: ferrite has no 2:4 sparse"
            )),
            "{text}"
        );
    }
    let ranking = text
        .split("## Performance Ranking (by Output Throughput)")
        .nth(1)
        .unwrap_or_else(|| panic!("no ranking: {text}"));
    assert!(
        ranking.contains("🥇 **") && ranking.contains("🥈 **"),
        "{text}"
    );
    assert!(!ranking.contains("sparse"), "{text}");
}

#[test]
fn bench_latency_refuses_bad_arguments() {
    let tiny = tiny_model();
    for (bad, says) in [
        (vec!["--runs", "0"], "--runs"),
        (vec!["--row", "original"], "NAME=MODEL"),
        (vec!["--configs", "interactive,nope"], "'nope'"),
        (vec!["--batch-size", "2"], "--input-len"),
        (
            vec!["--batch-size", "0", "--input-len", "8", "--output-len", "8"],
            "--batch-size",
        ),
        (
            vec![
                "--batch-size",
                "1",
                "--input-len",
                "8",
                "--output-len",
                "8",
                "--configs",
                "base",
            ],
            "cannot be used with",
        ),
    ] {
        let mut args = vec!["bench", "latency", "--model", &tiny];
        args.extend(&bad);
        let out = ferrite(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{bad:?} succeeded");
        assert!(
            err.contains("error: ") && err.contains(says),
            "{bad:?}: {err}"
        );
        assert!(!err.contains("panicked"), "{err}");
    }
}

/// `--tp 2`: rank 0 here and rank 1 a process of its own, as `serve --tp 2` runs them; a pool
/// size the model's heads do not divide by is refused before any rank starts.
#[test]
fn bench_latency_runs_a_tensor_parallel_pool() {
    let args = |tp: &'static str| {
        [
            "bench",
            "latency",
            "--load-format",
            "dummy",
            "--model",
            "small",
            "--batch-size",
            "2",
            "--input-len",
            "16",
            "--output-len",
            "4",
            "--runs",
            "1",
            "--json",
            "--tp",
            tp,
        ]
    };
    let v = common::json_of(&ferrite(&args("2")));
    let device = v["device"].as_str().unwrap_or_default();
    assert!(device.ends_with(", 2 ranks (tensor parallel)"), "{v}");
    assert!(v["output_throughput"]["mean"].as_f64() > Some(0.0), "{v}");

    // The `small` preset has 12 heads.
    let out = ferrite(&args("5"));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "--tp 5 succeeded");
    assert!(err.contains("5 tensor-parallel ranks"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
