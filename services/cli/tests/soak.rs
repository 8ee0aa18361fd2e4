//! `ferrite bench soak` for a few seconds against a real `ferrite serve` on the default model:
//! every outcome intended, nothing left held (the command itself fails otherwise); and its
//! `--device` reaching the server.

mod common;

use std::process::Output;

use common::{ferrite, json_of};

/// `ferrite bench soak` on the default model's file (tests/run.sh sets it), else its name
/// (pulled if need be), with `args`.
fn soak(args: &[&str]) -> Output {
    let model = std::env::var("FERRITE_TEST_GGUF").unwrap_or_else(|_| "smollm2-135m".into());
    let mut all = vec!["bench", "soak", "--model", &model];
    all.extend_from_slice(args);
    ferrite(&all)
}

#[test]
fn a_short_soak_leaves_nothing_held() {
    let out = soak(&["--minutes", "0.1", "--concurrency", "6", "--json"]);
    let report = json_of(&out);
    let outcomes = report["outcomes"].as_object().expect("outcomes");
    for kind in ["ok", "InvalidArgument"] {
        assert!(
            outcomes.get(kind).is_some_and(|n| n.as_u64() > Some(0)),
            "{report}"
        );
    }
    assert_eq!(report["device"], "cpu", "{report}");
    assert_eq!(report["kv_blocks_in_use"], 0, "{report}");
    assert_eq!(report["requests_running"], 0, "{report}");
    assert!(report["requests"].as_u64() > Some(10), "{report}");
}

/// `--device` reaches the soaked server: a device no machine has is refused by `ferrite serve`
/// itself (its error names the flag), and the soak fails rather than running on the CPU.
#[test]
fn the_soaked_server_runs_on_the_device_asked_for() {
    let out = soak(&["--device", "cuda:999", "--minutes", "0.05"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "soaked cuda:999: {err}");
    assert!(err.contains("--device cuda:999: "), "{err}");
    assert!(err.contains("exited before it was ready"), "{err}");
}
