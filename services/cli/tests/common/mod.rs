//! Running the real `ferrite` binary from the CLI tests.

#![allow(dead_code)]

use std::process::{Command, Output};

pub fn ferrite(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ferrite"))
        .args(args)
        .output()
        .expect("run ferrite")
}

/// The stdout of a run that must have succeeded.
pub fn stdout_of(out: &Output) -> String {
    assert!(
        out.status.success(),
        "ferrite failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The one JSON object a successful run printed.
pub fn json_of(out: &Output) -> serde_json::Value {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "ferrite failed: {err}");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not one JSON object on stdout ({e}): {err}"))
}
