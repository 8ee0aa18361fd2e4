//! ferrite's model definitions: a model's shape, its weights loaded from a checkpoint, and the
//! forward on the CPU. Whatever runs a model (the engine's executor, the GPU runner, the offline
//! tools) starts from here.
//!
//! # Layout
//!
//! - [`config`]: a model's shape ([`config::ModelConfig`]) from GGUF metadata or `config.json`.
//! - [`load()`] and its kin (`load.rs`): find the checkpoint format, read the config, borrow the
//!   weights, build the tokenizer ([`LoadedModel`]); or only the shape of random weights to be
//!   made on a device ([`EngineModel::DeviceRandom`]).
//! - [`llama`]: the Llama family and Gemma 2, one layer struct with `load` and `forward`; the
//!   face the offline tools drive layer by layer.
//! - `gemma.rs`, `variants.rs`: families that are options of the Llama forward (Gemma 2 and 3;
//!   SmolLM3's layers without rotation, Granite's multipliers; OLMo 2's are in `config.rs`),
//!   read from their configs.
//! - [`encoder`]: BERT-family encoders (embeddings): their shape, weights and forward.
//! - [`moe`]: mixture-of-experts MLPs (Mixtral, Qwen2-MoE, Qwen3-MoE): their shape, weights
//!   and CPU forward.
//! - [`schedule`]: a decoder layer's steps and tensor parallelism's all-reduce points, the one
//!   order both backends run ([`schedule::LayerOps`]: the CPU's in `llama_ops.rs`, the GPU
//!   runner's in `ferrite-gpu`).
//! - [`step`]: what one forward step is given on any backend ([`SeqChunk`], [`LogitsWanted`],
//!   [`DeviceSampling`]).
//! - [`kv`]: the K/V storage the CPU forward writes and reads, block by block.
//! - [`tp`]: tensor parallelism: which share of the model a rank holds.
//! - [`lora`]: LoRA adapters (PEFT's), applied beside the base weights, per request.
//! - [`pooling`]: how a model's embeddings are pooled, from sentence-transformers' files or GGUF.
//! - [`classify`]: sequence classifiers' heads (rerankers, classifiers), over the last token.
//! - [`presets`] and `dummy.rs`: named shapes with random weights (`--load-format dummy`).
//! - [`BatchForward`] (`batch.rs`): whole sequences through the model outside any engine.
//! - [`error`]: what loading or a forward refuses or fails at.
//!
//! It may use the formats, kernels, text and collective crates, and nothing that serves: which
//! blocks a sequence holds, scheduling and sampling are the engine's (`ferrite-engine`), which
//! re-exports this crate as `ferrite_engine::model` (and [`config`], [`tp`] under their old
//! paths).

mod batch;
pub mod classify;
pub mod config;
mod dummy;
pub mod encoder;
pub mod error;
mod ffn;
mod gemma;
mod gpt_oss;
mod gpt_oss_config;
pub mod kv;
pub mod llama;
mod load;
pub mod lora;
pub mod moe;
mod moe_config;
mod naming;
pub mod pooling;
pub mod presets;
pub mod rope;
pub mod schedule;
pub mod step;
pub mod tp;
mod variants;
mod window;

pub use batch::BatchForward;
pub use error::ModelError;
pub use ferrite_formats::LoadQuantize;
pub use llama::{LlamaModel, WeightNaming};
pub use load::{
    EngineModel, LoadOptions, LoadedEncoder, LoadedModel, RandomShape, STARTUP_TARGET,
    WeightFormat, device_random_shape, is_encoder_dir, load, load_dummy, load_encoder, load_with,
    parse_quantize,
};
pub use step::{
    Carried, DeviceSampling, DrawExtras, Draws, LogitsWanted, MaskSource, Penalties, SeqChunk,
    TokenLogprobs,
};
