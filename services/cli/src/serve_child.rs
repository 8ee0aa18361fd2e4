//! A `ferrite serve` child process for the benchmarks that measure a whole server: started
//! from a configured command, read up to its `ready` line, killed when dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};

/// A running `ferrite serve`, killed (and reaped) on drop.
#[derive(Debug)]
pub struct ServeChild {
    child: Child,
    pub model: String,
    /// `host:port` of the gRPC API.
    pub grpc: String,
    /// `host:port` of the HTTP API (and `/metrics`).
    pub http: String,
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What `ferrite serve` prints before `ready`.
#[derive(Default)]
struct Printed {
    model: Option<String>,
    grpc: Option<String>,
    http: Option<String>,
}

impl ServeChild {
    /// `ferrite serve` (this binary) with `configure`'s arguments and environment; waits up
    /// to `timeout` for it to be ready.
    pub async fn start(configure: impl FnOnce(&mut Command), timeout: Duration) -> Result<Self> {
        let exe = std::env::current_exe().context("finding the ferrite binary")?;
        let mut cmd = Command::new(exe);
        cmd.arg("serve");
        configure(&mut cmd);
        let mut child = cmd
            .stdout(Stdio::piped())
            .spawn()
            .context("starting ferrite serve")?;
        let stdout = child.stdout.take().context("no stdout")?;
        let read = tokio::task::spawn_blocking(move || read_ready(stdout));
        let printed = match tokio::time::timeout(timeout, read).await {
            Ok(Ok(Ok(p))) => p,
            Ok(Ok(Err(e))) => return Err(e),
            Ok(Err(e)) => return Err(e.into()),
            Err(_) => {
                let _ = child.kill();
                bail!("ferrite serve did not get ready within {timeout:?}")
            }
        };
        match printed {
            Printed {
                model: Some(model),
                grpc: Some(grpc),
                http: Some(http),
            } => Ok(Self {
                child,
                model,
                grpc,
                http,
            }),
            _ => bail!("ferrite serve said ready without its model and addresses"),
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Reads `ferrite serve`'s stdout up to `ready`.
fn read_ready(stdout: std::process::ChildStdout) -> Result<Printed> {
    let mut p = Printed::default();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading ferrite serve's output")?;
        if let Some(m) = line.strip_prefix("ferrite serve: model ") {
            p.model = Some(m.trim().to_owned());
        } else if let Some(a) = line.split("(ferrite.v1.Inference):").nth(1) {
            p.grpc = Some(a.trim().to_owned());
        } else if let Some(a) = line.split("(OpenAI-compatible):").nth(1) {
            let a = a.trim().trim_start_matches("http://");
            p.http = Some(a.trim_end_matches("/v1").to_owned());
        } else if line.trim() == "ready" {
            return Ok(p);
        }
    }
    bail!("ferrite serve exited before it was ready")
}
