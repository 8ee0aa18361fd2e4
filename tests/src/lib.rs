//! ferrite's cross-service integration tests: a real etcd, real `ferrite worker` / `gateway` /
//! `serve` processes, and real clients (the Rust tonic client, Python `grpcio`, the official
//! `openai` package).
//!
//! # Layout
//!
//! - [`process`]: one child process of a test: piped output, the `ready` handshake, SIGTERM /
//!   SIGKILL, killed on drop.
//! - [`cluster`]: etcd + N workers (one pool each) + a gateway, and the handles to talk to them.
//! - [`grpc`]: request builders and a stream collector over the public `ferrite.v1` API, and
//!   `raw_call` (curl as a gRPC client that, unlike tonic's, leaves deadlines to the server).
//! - [`http`]: a minimal HTTP/1.1 client for the OpenAI-compatible endpoint (no extra crates).
//! - [`lora`]: LoRA adapters of random factors, written as PEFT saves them.
//! - [`metrics`]: `/metrics` scraped and parsed.
//! - [`python`]: runs the Python clients under `tests/clients/`.
//! - [`reference`]: `ferrite generate --json`, the single-process answer to compare with.
//! - [`wait`]: wait-until-a-condition-holds with a deadline (no fixed sleeps in the tests).
//!
//! The suites live in `tests/tests/*.rs`. Each test starts its own processes; [`serial`] makes
//! the tests of one binary take turns, since this runs on 2 shared cores and several tests
//! assert latencies (a failed stream within 2 s, a lease expiring within its TTL).
//!
//! Every address is on 127.0.0.1; processes bind port 0 and print what they bound.

pub mod cluster;
pub mod grpc;
pub mod http;
pub mod lora;
pub mod metrics;
pub mod process;
pub mod python;
pub mod reference;
pub mod wait;

use std::path::PathBuf;

use tokio::sync::{Mutex, MutexGuard};

pub use cluster::{Cluster, GatewayProc, RankProc, TpPool, WorkerOptions, WorkerProc};
pub use process::Proc;

/// The model every test serves: small, real, cached by `ferrite model pull smollm2-135m`.
pub const MODEL: &str = "smollm2-135m";

/// Env var naming the `ferrite` binary (default: `<workspace>/target/release/ferrite`).
pub const FERRITE_BIN_ENV: &str = "FERRITE_BIN";

/// The workspace root (the parent of this crate).
pub fn workspace_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.parent().map_or(here.clone(), PathBuf::from)
}

/// The tiny model fixture `name` (`tests/fixtures/models/{name}`, made by the scripts there).
pub fn fixture_model(name: &str) -> PathBuf {
    workspace_root().join("tests/fixtures/models").join(name)
}

/// The `ferrite` binary under test.
pub fn ferrite_bin() -> anyhow::Result<PathBuf> {
    let bin = std::env::var_os(FERRITE_BIN_ENV).map_or_else(
        || workspace_root().join("target/release/ferrite"),
        PathBuf::from,
    );
    anyhow::ensure!(
        bin.is_file(),
        "the ferrite binary {} does not exist: build it with `cargo build --release -p ferrite-cli` \
         (tests/run.sh does) or point {FERRITE_BIN_ENV} at one",
        bin.display()
    );
    Ok(bin)
}

/// Held for the whole of a test so that the tests of one binary run one at a time.
pub async fn serial() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::const_new(());
    TURN.lock().await
}
