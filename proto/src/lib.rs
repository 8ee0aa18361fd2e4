//! ferrite's gRPC APIs, generated from `proto/ferrite/**.proto`.
//!
//! - [`v1`]: the public `ferrite.v1.Inference` service (text in, text out).
//! - [`worker::v1`]: the internal `ferrite.worker.v1.Worker` service (token ids in and out).
//! - [`FILE_DESCRIPTOR_SET`]: for gRPC server reflection.
//! - [`sampling`]: the valid ranges of the sampling parameters (checked by the gateway and the
//!   engine alike).
//! - [`prefix`]: the chained hashes that name full KV blocks (the engine's prefix cache and the
//!   gateway's KV-aware routing compute them alike).

#![allow(missing_debug_implementations)] // generated code

pub mod prefix;
pub mod sampling;

pub mod v1 {
    tonic::include_proto!("ferrite.v1");
}

pub mod worker {
    pub mod v1 {
        tonic::include_proto!("ferrite.worker.v1");
    }
}

/// The encoded descriptors of both packages.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("ferrite_descriptor");
