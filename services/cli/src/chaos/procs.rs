//! The processes of a chaos run: `ferrite worker` and `ferrite gateway` children of this
//! binary, each read up to its `ready` line, signalled (`kill -STOP`, `-TERM`, `-KILL`) by the
//! faults, killed when dropped. Their stderr goes to a log file each, in the run's directory.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use tokio::sync::mpsc;

/// One child process.
#[derive(Debug)]
pub struct Node {
    pub name: String,
    child: Child,
    lines: mpsc::UnboundedReceiver<String>,
    exit: Option<ExitStatus>,
}

impl Drop for Node {
    fn drop(&mut self) {
        if self.exit.is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Node {
    /// Starts `ferrite args…` (this binary) with `env` added; stderr to `dir/name.log`.
    pub fn spawn(name: &str, args: &[String], env: &[(&str, &str)], dir: &Path) -> Result<Self> {
        let exe = std::env::current_exe().context("finding the ferrite binary")?;
        let log = std::fs::File::create(dir.join(format!("{name}.log")))
            .with_context(|| format!("the log of {name}"))?;
        let mut child = Command::new(exe)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let stdout = child.stdout.take().context("no stdout")?;
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        Ok(Self {
            name: name.to_owned(),
            child,
            lines,
            exit: None,
        })
    }

    /// The lines printed before `ready`; an error if it exits first or `timeout` passes.
    pub async fn ready(&mut self, timeout: Duration) -> Result<Vec<String>> {
        let mut before = Vec::new();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) if line.trim() == "ready" => return Ok(before),
                Ok(Some(line)) => before.push(line),
                Ok(None) => bail!("{} exited before it was ready (see its log)", self.name),
                Err(_) => bail!("{} was not ready within {timeout:?}", self.name),
            }
        }
    }

    /// Sends `kill -NAME`.
    pub fn signal(&mut self, name: &str) -> Result<()> {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .context("running kill")?;
        anyhow::ensure!(status.success(), "kill -{name} {}: {status}", self.name);
        Ok(())
    }

    /// Waits at most `timeout` for the process to exit.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while self.exit.is_none() && Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exit = Some(status);
            } else {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        self.exit
    }
}

/// The address after `marker` on one of `lines` (as the processes print them).
pub fn addr_after(lines: &[String], marker: &str) -> Result<SocketAddr> {
    lines
        .iter()
        .filter_map(|l| l.split_once(marker).map(|(_, rest)| rest))
        .flat_map(str::split_whitespace)
        .map(|t| t.trim_start_matches("http://").trim_end_matches([',', '/']))
        .find_map(|t| t.parse().ok())
        .with_context(|| format!("no address after {marker:?} in {lines:?}"))
}

/// A free loopback port (bound and released: the gateway comes back on the same one).
pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A directory for the run's logs and files.
pub fn run_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!("ferrite-chaos-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

/// A copy of `gguf` in `dir` with 8 MiB of its weights (from 60 MiB in, or its middle for a
/// smaller file) overwritten by 0xFF bytes: NaN in every float format.
pub fn poisoned_copy(gguf: &Path, dir: &Path) -> Result<PathBuf> {
    let mut bytes = std::fs::read(gguf).with_context(|| format!("reading {}", gguf.display()))?;
    let span = (8 << 20).min(bytes.len() / 4);
    let at = (60 << 20).min(bytes.len() / 2);
    bytes[at..at + span].fill(0xFF);
    let out = dir.join("poisoned.gguf");
    std::fs::write(&out, bytes)?;
    Ok(out)
}
