//! ferrite's inference engine: load a model, schedule requests, run the forward, sample.
//!
//! # Layout
//!
//! - [`weights`]: GGUF and safetensors readers (tensors stay in the memory map) and GPTQ
//!   conversion (quantized layers become [`ferrite_kernels::wq::WqMatrix`]).
//! - [`config`]: a model's shape ([`config::ModelConfig`]) from GGUF metadata or `config.json`.
//! - [`model`]: loading ([`model::load`]) and the Llama-family forward.
//! - [`kv_cache`]: the paged KV cache (block pool, block tables, storage).
//! - [`scheduler`]: continuous batching with chunked prefill and preemption by recompute.
//! - [`sampler`]: sampling parameters and token selection.
//! - [`engine`]: the step loop (`schedule → forward → sample → update`) tying them together.
//! - [`handle`]: the engine on its own thread; an async handle submits requests and streams tokens.
//! - [`registry`]: models known by name, pulled into the cache on first use.
//! - [`eval`]: perplexity on a text (the quality check for quantized weights).
//! - [`quantize`]: `ferrite quantize`, a safetensors checkpoint to a GPTQ-format one by RTN.
//!
//! The engine is synchronous and owns its state: one thread drives [`engine::Engine::step`]
//! ([`handle::EngineHandle`] runs that thread for servers).

pub mod config;
pub mod engine;
pub mod error;
pub mod eval;
pub mod gpu;
pub mod handle;
pub mod kv_cache;
pub mod model;
pub mod quantize;
pub mod registry;
pub mod sampler;
pub mod scheduler;
pub mod weights;

pub use error::{EngineError, Result};
