//! One child process of a test.
//!
//! stdout and stderr are piped and drained by two threads for the process's whole life (so it
//! never blocks on a full pipe); stdout lines are kept and also handed to [`Proc::wait_ready`],
//! which returns the lines printed before `ready`. The process is SIGKILLed and reaped on drop
//! if it still runs.
//!
//! `std::process` rather than `tokio::process`: the latter needs tokio's `process` feature,
//! which no other crate of the workspace enables, and unifying it in would rebuild tokio and
//! everything above it whenever the workspace and a single package are built in turn.

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow, bail};
use tokio::sync::mpsc;

/// How much of a process's stderr an error message quotes (the end of it).
const STDERR_TAIL_BYTES: usize = 6000;
/// How long the reader threads get to read the rest of a pipe after the process exited.
const DRAIN_GRACE: Duration = Duration::from_secs(2);
/// How often an exit is polled for.
const EXIT_POLL: Duration = Duration::from_millis(10);

/// A running (or exited) child process. See the module doc.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    ready_lines: mpsc::UnboundedReceiver<String>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    exit: Option<ExitStatus>,
}

impl Proc {
    /// Spawns `program args…` with piped output. `name` labels it in error messages.
    pub fn spawn(name: impl Into<String>, program: &Path, args: &[String]) -> Result<Self> {
        Self::spawn_with_env(name, program, args, &[])
    }

    /// [`Proc::spawn`] with `env` added to the inherited environment.
    pub fn spawn_with_env(
        name: impl Into<String>,
        program: &Path,
        args: &[String],
        env: &[(String, String)],
    ) -> Result<Self> {
        let name = name.into();
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("{name}: cannot run {}", program.display()))?;
        let (tx, ready_lines) = mpsc::unbounded_channel();
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let out_pipe = child.stdout.take().context("stdout is not piped")?;
        let err_pipe = child.stderr.take().context("stderr is not piped")?;
        let out_sink = stdout.clone();
        let err_sink = stderr.clone();
        let readers = vec![
            std::thread::spawn(move || {
                read_lines(out_pipe, |line| {
                    lock(&out_sink).push(line.clone());
                    let _ = tx.send(line);
                });
            }),
            std::thread::spawn(move || {
                read_lines(err_pipe, |line| {
                    let mut s = lock(&err_sink);
                    s.push_str(&line);
                    s.push('\n');
                });
            }),
        ];
        Ok(Self {
            name,
            child,
            ready_lines,
            stdout,
            stderr,
            readers,
            exit: None,
        })
    }

    /// Runs `program args…` to its end and returns its stdout. Fails, quoting stderr, on a
    /// non-zero exit or after `timeout` (the process is killed then).
    pub async fn output(
        name: impl Into<String>,
        program: &Path,
        args: &[String],
        timeout: Duration,
    ) -> Result<String> {
        let mut proc = Self::spawn(name, program, args)?;
        let status = match proc.wait_exit(timeout).await {
            Ok(status) => status,
            Err(e) => bail!("{e}\n{}", proc.stderr_report().await),
        };
        if !status.success() {
            let stderr = proc.stderr_report().await;
            bail!("{} failed ({status})\n{stderr}", proc.name);
        }
        Ok(proc.stdout().join("\n"))
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits until the process prints a line that is exactly `ready`; returns the stdout lines
    /// before it. Fails, quoting the process's stderr, if it exits first or `timeout` passes.
    pub async fn wait_ready(&mut self, timeout: Duration) -> Result<Vec<String>> {
        let deadline = Instant::now() + timeout;
        let mut lines = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.ready_lines.recv()).await {
                Ok(Some(line)) if line.trim() == "ready" => return Ok(lines),
                Ok(Some(line)) => lines.push(line),
                Ok(None) => {
                    let status = self.wait_exit(DRAIN_GRACE).await;
                    let status = status.map_or_else(|e| e.to_string(), |s| s.to_string());
                    let stderr = self.stderr_report().await;
                    bail!(
                        "{} exited before printing `ready` ({status}); stdout: {lines:?}\n{stderr}",
                        self.name
                    );
                }
                Err(_) => {
                    let stderr = self.stderr_report().await;
                    bail!(
                        "{} did not print `ready` within {timeout:?}; stdout so far: {lines:?}\n{stderr}",
                        self.name
                    );
                }
            }
        }
    }

    /// Every stdout line so far.
    pub fn stdout(&self) -> Vec<String> {
        lock(&self.stdout).clone()
    }

    /// The stderr captured so far.
    pub fn stderr(&self) -> String {
        lock(&self.stderr).clone()
    }

    /// `--- NAME stderr (tail) ---` and the end of its stderr, for error messages. Gives the
    /// reader threads a moment to catch up if the process has exited.
    pub async fn stderr_report(&mut self) -> String {
        if self.exit.is_some() {
            self.join_readers().await;
        }
        let all = self.stderr();
        let mut start = all.len().saturating_sub(STDERR_TAIL_BYTES);
        while !all.is_char_boundary(start) {
            start += 1;
        }
        format!(
            "--- {} stderr (tail) ---\n{}--- end of {} stderr ---",
            self.name,
            &all[start..],
            self.name
        )
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.exit = Some(status);
                false
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// SIGKILL (`kill -9`) and reap.
    pub async fn kill_hard(&mut self) -> Result<()> {
        if self.is_running() {
            self.child
                .kill()
                .with_context(|| format!("killing {}", self.name))?;
        }
        self.wait_exit(Duration::from_secs(10)).await.map(|_| ())
    }

    /// Sends SIGTERM without waiting.
    pub fn signal_term(&mut self) -> Result<()> {
        self.signal("TERM")
    }

    /// Sends signal `name` (`TERM`, `STOP`, `CONT`, …) without waiting, as `kill -NAME` does.
    pub fn signal(&mut self, name: &str) -> Result<()> {
        if !self.is_running() {
            bail!("{} is not running", self.name);
        }
        let pid = self.child.id().to_string();
        let status = Command::new("kill")
            .args([&format!("-{name}"), &pid])
            .status()
            .with_context(|| format!("running `kill -{name}`"))?;
        anyhow::ensure!(status.success(), "`kill -{name} {pid}` failed: {status}");
        Ok(())
    }

    /// SIGTERM, then waits at most `timeout` for the exit status (SIGKILL after that, and an
    /// error quoting stderr).
    pub async fn terminate(&mut self, timeout: Duration) -> Result<ExitStatus> {
        self.signal_term()?;
        match self.wait_exit(timeout).await {
            Ok(status) => Ok(status),
            Err(e) => {
                let _ = self.kill_hard().await;
                Err(anyhow!("{e} after SIGTERM\n{}", self.stderr_report().await))
            }
        }
    }

    /// Waits at most `timeout` for the process to exit, then for its output to be read.
    pub async fn wait_exit(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.exit {
                break status;
            }
            if let Some(status) = self
                .child
                .try_wait()
                .with_context(|| format!("waiting for {}", self.name))?
            {
                self.exit = Some(status);
                break status;
            }
            if Instant::now() >= deadline {
                bail!("{} did not exit within {timeout:?}", self.name);
            }
            tokio::time::sleep(EXIT_POLL).await;
        };
        self.join_readers().await;
        Ok(status)
    }

    async fn join_readers(&mut self) {
        let deadline = Instant::now() + DRAIN_GRACE;
        while self.readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
            tokio::time::sleep(EXIT_POLL).await;
        }
        for r in std::mem::take(&mut self.readers) {
            if r.is_finished() {
                let _ = r.join();
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.is_running() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Reads `pipe` to its end, line by line (invalid UTF-8 replaced, so reading never stops early).
fn read_lines(pipe: impl Read, mut sink: impl FnMut(String)) {
    let mut reader = BufReader::new(pipe);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match reader.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {
                let line = String::from_utf8_lossy(&buf);
                sink(line.trim_end_matches(['\n', '\r']).to_owned());
            }
        }
    }
}
