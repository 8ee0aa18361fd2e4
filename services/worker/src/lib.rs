//! One rank of a worker pool.
//!
//! # Layout
//!
//! - [`service`]: the `ferrite.worker.v1.Worker` gRPC service over the engine thread's handle,
//!   (or the synthetic backend), and the engine-error → gRPC-status mapping.
//! - [`synthetic`]: fixed-rate tokens without a model, for measuring the gateway.
//! - [`lifecycle`]: load → serve → register (Starting, then Ready once start-up finished) →
//!   on shutdown: Draining, finish in-flight requests (bounded), deregister, exit.
//!
//! Rank 0 of a pool leads: it registers `pools/{pool}` as well as its own rank key. With one
//! rank per pool on the CPU, every worker is a rank 0.

pub mod lifecycle;
pub mod service;
pub mod synthetic;

pub use lifecycle::{RunningWorker, WorkerConfig, model_info};
pub use service::{Backend, WorkerService};
pub use synthetic::SyntheticEngine;
