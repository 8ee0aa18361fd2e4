//! A real etcd for tests (feature `testing`): this crate's and the
//! cross-service tests in `/tests`.
//!
//! Runs the `etcd` binary (`$FERRITE_ETCD_BIN`, else `etcd` on the `PATH`) as a
//! single member on free loopback ports with a fresh data dir. Only ever binds
//! 127.0.0.1. The helpers panic on failure: they are test fixtures.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Env var naming the etcd binary to run.
pub const ETCD_BIN_ENV: &str = "FERRITE_ETCD_BIN";

/// How long etcd may take to answer `/health` after a (re)start.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a SIGTERM may take before we SIGKILL.
const STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// A running (or stopped) etcd member. Killed, and its data dir removed, on drop.
#[derive(Debug)]
pub struct EtcdServer {
    bin: PathBuf,
    /// Parent of the data dir and the log; removed on drop.
    root: PathBuf,
    client_port: u16,
    peer_port: u16,
    /// Plain HTTP `/health` (and metrics), so health is checked the same with TLS or without.
    metrics_port: u16,
    tls: Option<EtcdTls>,
    child: Option<Child>,
}

/// etcd's TLS on its client port: its certificate and key, and the CA whose client
/// certificates it requires (`--client-cert-auth`).
#[derive(Debug, Clone)]
pub struct EtcdTls {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: PathBuf,
}

impl EtcdServer {
    /// Starts etcd and waits until it is healthy (has a leader).
    pub fn start() -> Self {
        Self::start_with(None)
    }

    /// [`EtcdServer::start`], serving clients over TLS with `tls` when given (its endpoint is
    /// then `https://`).
    pub fn start_with(tls: Option<EtcdTls>) -> Self {
        let bin =
            std::env::var_os(ETCD_BIN_ENV).map_or_else(|| PathBuf::from("etcd"), PathBuf::from);
        let root = unique_temp_dir();
        let [client_port, peer_port, metrics_port] = free_ports();
        let mut server = Self {
            bin,
            root,
            client_port,
            peer_port,
            metrics_port,
            tls,
            child: None,
        };
        server.spawn();
        server
    }

    /// `http://127.0.0.1:{client port}` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
    }

    /// `[endpoint()]`, the shape `Store::connect` takes.
    pub fn endpoints(&self) -> Vec<String> {
        vec![self.endpoint()]
    }

    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Stops etcd (SIGTERM, then SIGKILL after 5 s) and waits for it to exit.
    /// The data dir stays, for `restart`.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // std can only SIGKILL; ask `kill` for a graceful SIGTERM first so etcd
        // closes its connections the way it does in production shutdowns.
        let _ = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    /// Kills etcd with SIGKILL (a crash: no graceful connection shutdown) and
    /// waits for it. The data dir stays, for `restart`.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts etcd again on the same ports with the same data (keys and
    /// unexpired leases survive) and waits until it is healthy.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    fn data_dir(&self) -> PathBuf {
        self.root.join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.root.join("etcd.log")
    }

    fn spawn(&mut self) {
        let client = self.endpoint();
        let metrics = format!("http://127.0.0.1:{}", self.metrics_port);
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let log = File::options()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap_or_else(|e| panic!("cannot create {}: {e}", self.log_path().display()));
        let log_err = log
            .try_clone()
            .unwrap_or_else(|e| panic!("cannot clone log file handle: {e}"));
        let child = Command::new(&self.bin)
            .arg("--name=ferrite-test")
            .arg(format!("--data-dir={}", self.data_dir().display()))
            .arg(format!("--listen-client-urls={client}"))
            .arg(format!("--advertise-client-urls={client}"))
            .arg(format!("--listen-peer-urls={peer}"))
            .arg(format!("--initial-advertise-peer-urls={peer}"))
            .arg(format!("--initial-cluster=ferrite-test={peer}"))
            .arg("--initial-cluster-state=new")
            .arg(format!("--listen-metrics-urls={metrics}"))
            .args(self.tls.iter().flat_map(|t| {
                [
                    format!("--cert-file={}", t.cert.display()),
                    format!("--key-file={}", t.key.display()),
                    format!("--trusted-ca-file={}", t.client_ca.display()),
                    "--client-cert-auth".into(),
                ]
            }))
            .arg("--logger=zap")
            .arg("--log-level=warn")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot run etcd ({}): {e}; install etcd-server (Debian/Ubuntu: \
                     `apt-get install etcd-server`) or set {ETCD_BIN_ENV}",
                    self.bin.display()
                )
            });
        self.child = Some(child);
        self.wait_healthy();
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                self.child = None;
                panic!(
                    "etcd exited during start-up ({status}); log:\n{}",
                    self.log_tail()
                );
            }
            if health_ok(self.metrics_port) {
                return;
            }
            sleep(Duration::from_millis(50));
        }
        panic!(
            "etcd did not become healthy within {START_TIMEOUT:?}; log:\n{}",
            self.log_tail()
        );
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let start = log.len().saturating_sub(4000);
        log.get(start..).unwrap_or(&log).to_owned()
    }
}

impl Drop for EtcdServer {
    fn drop(&mut self) {
        self.kill();
        let _ = fs::remove_dir_all(&self.root);
    }
}

/// GET /health over plain HTTP/1.0 (etcd serves it on the client port):
/// `{"health":"true"}` once there is a leader.
fn health_ok(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
    if stream
        .write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut response = String::new();
    let _ = stream.read_to_string(&mut response);
    response.contains(r#""health":"true""#)
}

/// Three distinct free ports below the kernel's ephemeral range (all listeners are
/// held until all are chosen). Below it, because `restart` binds the same ports again
/// after etcd dies: a port from the ephemeral range can meanwhile become the source
/// port of any outgoing connection (another test's client), and then etcd cannot bind
/// it ("address already in use", seen in CI). Below the range only an explicit bind
/// can take it. Each process starts at its own offset and walks on from there.
fn free_ports() -> [u16; 3] {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (low, high) = (10_000u32, ephemeral_low().max(10_100));
    let span = high - low;
    let start = std::process::id().wrapping_mul(7_919) % span;
    let bind = || {
        for _ in 0..span {
            let offset = (start + NEXT.fetch_add(1, Ordering::Relaxed)) % span;
            let port = u16::try_from(low + offset).unwrap_or(u16::MAX);
            if let Ok(listener) = TcpListener::bind((Ipv4Addr::LOCALHOST, port)) {
                return listener;
            }
        }
        panic!("no free loopback port in {low}..{high}")
    };
    let listeners = [bind(), bind(), bind()];
    listeners.map(|l| {
        l.local_addr()
            .map(|a| a.port())
            .unwrap_or_else(|e| panic!("no local address: {e}"))
    })
}

/// The first port of the kernel's ephemeral range (Linux's default 32768 elsewhere).
fn ephemeral_low() -> u32 {
    fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(32_768)
}

fn unique_temp_dir() -> PathBuf {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let name = format!(
        "ferrite-etcd-{}-{}-{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let dir = std::env::temp_dir().join(name);
    create_dir(&dir);
    dir
}

fn create_dir(dir: &Path) {
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("cannot create {}: {e}", dir.display()));
}
