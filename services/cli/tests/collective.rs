//! `ferrite bench collective` across real rank processes: right sums for 3 ranks, and a rank
//! killed mid-run fails the pool within the timeout with an error naming it.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{ferrite, json_of};

#[test]
fn three_rank_processes_all_reduce_and_report_nccl_tests_columns() {
    let out = ferrite(&[
        "bench",
        "collective",
        "--tp",
        "3",
        "--sizes",
        "4K,64K",
        "--iters",
        "3",
        "--json",
    ]);
    let report = json_of(&out);
    assert_eq!(report["ranks"], 3, "{report}");
    let rows = report["rows"].as_array().expect("rows");
    assert_eq!(rows.len(), 2, "{report}");
    for row in rows {
        assert_eq!(row["correct"], true, "{report}");
        assert!(row["busbw_gb_s"].as_f64() > Some(0.0), "{report}");
    }
    assert_eq!(rows[1]["count"], 16384, "{report}");
}

#[test]
fn a_killed_rank_fails_the_pool_naming_it() {
    let leader = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port");
    let spawn = |rank: usize| {
        Command::new(env!("CARGO_BIN_EXE_ferrite"))
            .args([
                "bench",
                "collective-rank",
                "--rank",
                &rank.to_string(),
                "--world",
                "3",
            ])
            .args(["--leader", &leader.to_string(), "--sizes", "64K"])
            .args(["--iters", "100000000", "--timeout-s", "3"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn a rank")
    };
    let mut ranks: Vec<_> = (0..3).map(spawn).collect();
    let stderr = ranks[0].stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let formed = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains("formed"));
    assert!(formed, "rank 0 never formed the pool");
    std::thread::sleep(Duration::from_millis(300));
    let killed = Command::new("kill")
        .args(["-KILL", &ranks[2].id().to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    let started = Instant::now();
    let status = loop {
        if let Some(s) = ranks[0].try_wait().expect("wait") {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(8),
            "rank 0 hangs after rank 2 died"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let said: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(!status.success(), "rank 0 went on without rank 2");
    assert!(said.iter().any(|l| l.contains("rank 2")), "{said:?}");
    for mut r in ranks {
        let _ = r.kill();
        let _ = r.wait();
    }
}

/// `ferrite doctor` on this host (no GPU): the all-reduce across real rank processes is exact,
/// NVRTC is found at its version where the test command installs it, NCCL is looked for under
/// its real soname first, and nothing a CPU host does not need is marked FIX.
#[test]
fn doctor_checks_the_libraries_and_an_all_reduce_across_local_ranks() {
    let report = json_of(&ferrite(&["doctor", "--tp", "3", "--json"]));
    let checks = report["checks"].as_array().expect("checks");
    let line = |name: &str| {
        checks
            .iter()
            .find(|c| c["check"] == name)
            .unwrap_or_else(|| panic!("no {name} line: {report}"))
    };
    let all_reduce = line("all-reduce (CPU)");
    assert_eq!(all_reduce["verdict"], "ok", "{report}");
    assert!(
        all_reduce["detail"]
            .as_str()
            .is_some_and(|d| d.contains("3 rank processes")),
        "{report}"
    );
    if std::env::var_os("FERRITE_REQUIRE_NVRTC").is_some() {
        assert_eq!(line("NVRTC")["verdict"], "ok", "{report}");
    }
    let nccl = line("NCCL")["detail"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(
        nccl.contains("libnccl.so.2") || nccl.starts_with('2'),
        "{nccl}"
    );
    assert!(checks.iter().all(|c| c["verdict"] != "FIX"), "{report}");
}

/// `bench decode --tp 3`: the engine as rank 0 of a pool of three rank processes it starts,
/// measured like the single-process one (and its ranks gone when it ends).
#[test]
fn bench_decode_runs_a_pool_of_rank_processes() {
    let out = ferrite(&[
        "bench",
        "decode",
        "--tp",
        "3",
        "--batch-sizes",
        "2",
        "--prompt-tokens",
        "16",
        "--new-tokens",
        "4",
        "--runs",
        "1",
        "--kv-cache-mib",
        "100",
        "--max-model-len",
        "256",
        "--json",
    ]);
    let rows = json_of(&out);
    let row = &rows[0];
    assert_eq!(row["tp"], 3, "{rows}");
    assert!(row["decode_tok_s"]["mean"].as_f64() > Some(0.0), "{rows}");
}
