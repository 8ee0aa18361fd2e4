//! One rank of a worker pool.
//!
//! # Layout
//!
//! - [`service`]: the `ferrite.worker.v1.Worker` gRPC service over the engine thread's handle,
//!   (or the synthetic backend), and the engine-error → gRPC-status mapping; the pool's KV
//!   events (`WatchKvCache`) for the gateways' KV-aware routing.
//! - [`guide`]: constrained decoding: the model's vocabulary for grammars, and each
//!   constrained request's guide (llguidance, through `ferrite-structured`).
//! - [`synthetic`]: fixed-rate tokens without a model, for measuring the gateway.
//! - [`lifecycle`]: rank 0, the leader: load → serve → register (Starting, then Ready once
//!   every rank is up) → on shutdown: Draining, finish in-flight requests (bounded),
//!   deregister, exit.
//! - [`follower`]: ranks > 0: load the shard → join → run the leader's step plans, serving
//!   gRPC health only, until the leader stops the pool or the pool is lost.
//! - [`rendezvous`]: how a pool forms through placement (`pools/{pool}/nccl`).
//!
//! Rank 0 of a pool leads: it registers `pools/{pool}` as well as its own rank key; every
//! other rank registers its rank key. A pool of one rank is a rank 0 with no followers.

pub mod follower;
pub mod guide;
pub mod lifecycle;
pub mod rendezvous;
pub mod service;
mod streams;
pub mod synthetic;

pub use follower::RunningFollower;
pub use lifecycle::{RunningWorker, WorkerConfig, model_info};
pub use rendezvous::{CommLeader, TpConfig};
pub use service::{Backend, WorkerService};
pub use synthetic::SyntheticEngine;
