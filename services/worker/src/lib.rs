//! One rank of a worker pool.
//!
//! # Layout
//!
//! - [`service`]: the `ferrite.worker.v1.Worker` gRPC service over the engine thread's handle,
//!   and the engine-error → gRPC-status mapping.
//! - [`lifecycle`]: load → serve → register (Starting, then Ready once start-up finished) →
//!   on shutdown: Draining, finish in-flight requests (bounded), deregister, exit.
//!
//! Rank 0 of a pool leads: it registers `pools/{pool}` as well as its own rank key. With one
//! rank per pool on the CPU, every worker is a rank 0.

pub mod lifecycle;
pub mod service;

pub use lifecycle::{RunningWorker, WorkerConfig, model_info};
pub use service::WorkerService;
