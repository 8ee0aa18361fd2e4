//! ferrite's inference engine, the serving core: schedule requests, plan each step, run it on
//! every rank's executor, sample.
//!
//! # Layout
//!
//! - [`model`], [`config`], [`tp`]: the model definitions, the `ferrite-model` crate under
//!   these paths: a model's shape, loading ([`model::load`]), the Llama-family forward, presets,
//!   tensor-parallel shards, whole sequences through it outside the engine
//!   ([`model::BatchForward`]).
//! - [`weights`]: the checkpoint formats, the `ferrite-formats` crate under this path (GGUF and
//!   safetensors readers, tensors in the memory map; quantized checkpoints; matrices and their
//!   shards).
//! - [`gpu`]: the GPU runner, the `ferrite-gpu` crate under this path (weights on the device,
//!   the forward there, KV sizing, CUDA graphs), which [`executor`] builds on a GPU.
//! - [`kv_cache`]: the paged KV cache's block pool (reference counts, the index of cached
//!   blocks, least-recently-freed eviction) and block tables; the storage is the model's.
//! - [`scheduler`]: continuous batching with chunked prefill, preemption by recompute and
//!   prefix caching (a new sequence starts after its longest cached prefix).
//! - [`sampler`]: sampling parameters and token selection.
//! - [`plan`]: the step plan the leader sends every rank, and the block tables ranks keep.
//! - [`executor`]: one rank's forward over its shard and KV cache, driven by step plans
//!   (every rank has one; ranks > 0 run its follower loop).
//! - [`engine`]: the leader: request state, scheduler and sampling, on rank 0
//!   (`schedule → plan → execute → sample`); under async scheduling (`overlap`) it plans
//!   each step while the device runs the one before; under speculative decoding
//!   (`speculate`) each decoding sequence runs guesses of its next tokens with its last one;
//!   an embeddings request (`embed`) answers with its prompt's pooled final hidden state;
//!   a request with a LoRA adapter (`lora`) runs with it and caches its own prefix blocks.
//! - [`handle`]: the engine on its own thread; an async handle submits requests and streams tokens.
//! - [`failpoints`]: faults injected on purpose (`FERRITE_FAILPOINTS`), for the fault tests.
//! - [`registry`]: models known by name, pulled into the cache on first use; models and LoRA
//!   adapters named by their Hub repository.
//! - [`recommended`]: a model's recommended sampling (generation_config.json, GGUF metadata,
//!   the registry), for requests that leave a parameter unset.
//!
//! The engine is synchronous and owns its state: one thread drives [`engine::Engine::step`]
//! ([`handle::EngineHandle`] runs that thread for servers).
//!
//! It may use the model, gpu, formats, kernels, text, proto and collective crates, and nothing that
//! uses it: not the worker, and not the offline tools (calibration, `ferrite quantize`,
//! perplexity: the `ferrite-quantize` crate), which drive the model layer by layer through a
//! face the model crate keeps public for them (see [`model::llama`]).

mod complete;
pub mod constraint;
pub mod engine;
pub mod error;
pub mod executor;
pub mod failpoints;
pub mod handle;
mod inflight;
pub mod kv_cache;
pub mod ngram;
mod overlap;
pub mod plan;
pub mod recommended;
pub mod registry;
pub mod sampler;
pub mod scheduler;
/// The checkpoint formats, a crate of their own (`ferrite-formats`), under their old path.
pub use ferrite_formats as weights;
/// The GPU runner, a crate of its own (`ferrite-gpu`), under its old path.
pub use ferrite_gpu as gpu;
/// The model definitions, a crate of their own (`ferrite-model`), under their old paths.
pub use ferrite_model::{self as model, config, tp};

pub use error::{EngineError, Result};
