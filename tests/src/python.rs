//! Runs the Python clients in `tests/clients/` (python3 with `grpcio`, `grpcio-tools` and
//! `openai`, which tests/run.sh installs). Each prints one JSON object as its last stdout line.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, Result};

use crate::{Proc, workspace_root};

/// Env var naming the Python interpreter (default `python3`).
pub const PYTHON_ENV: &str = "FERRITE_TEST_PYTHON";

/// `tests/clients/{name}`.
pub fn client_script(name: &str) -> PathBuf {
    workspace_root().join("tests/clients").join(name)
}

/// Runs `tests/clients/{script} args…` and parses the JSON object on its last stdout line.
/// Fails, quoting its stderr, if it exits non-zero, prints no JSON or runs past `timeout`.
pub async fn run_client(
    script: &str,
    args: &[String],
    timeout: Duration,
) -> Result<serde_json::Value> {
    let python = PathBuf::from(std::env::var(PYTHON_ENV).unwrap_or_else(|_| "python3".into()));
    let mut full = vec![client_script(script).to_string_lossy().into_owned()];
    full.extend_from_slice(args);
    let stdout = Proc::output(script, &python, &full, timeout)
        .await
        .map_err(|e| {
            let hint = if format!("{e}").contains("ModuleNotFoundError") {
                "\nhint: python3 -m pip install grpcio grpcio-tools openai cohere (tests/run.sh does)"
            } else {
                ""
            };
            e.context(format!("running {} {script}{hint}", python.display()))
        })?;
    let last = stdout
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    serde_json::from_str(last)
        .with_context(|| format!("{script} printed no JSON object last:\n{stdout}"))
}
