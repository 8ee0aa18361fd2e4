//! ferrite's compute kernels.
//!
//! # Layout
//!
//! - [`quant`]: the GGUF tensor types (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K): block
//!   layouts, dequantization, and dot products of a quantized row with f32 activations.
//! - [`cpu`]: the CPU reference ops the engine runs (matmul over any [`quant::GgmlType`], RMSNorm,
//!   RoPE, SiLU/GELU-and-mul, soft caps, causal or sliding-window attention over a paged KV
//!   cache). They are the test oracle for every other backend.
//! - [`wq`]: weight-only quantization (8/4/2-bit codes in groups, f16/bf16 scales, optional zero
//!   points): RTN quantizing, the CPU layout and its matmul kernel.
//! - [`w8a8`]: int8 weights (per-channel scales) times int8 activations quantized per token,
//!   i32 sums: AVX-VNNI, AVX2 and portable kernels chosen at run time.
//! - [`fp8`]: FP8 (e4m3) weights and activations on the CPU, by dequantizing the weights to f32
//!   and rounding activations through e4m3 (correct, not fast).
//! - [`cuda`]: the CUDA backend — kernel sources (`kernels/cuda/*.cu`) compiled by NVRTC into a
//!   CUBIN cache, the opened device, launch wrappers, cuBLAS projections.
//! - [`device`]: `--device cpu|cuda[:N]|auto`, with CUDA probed at run time without panicking.
//! - [`mapped`]: read-only memory-mapped files, so model weights are used in place.
//!
//! `unsafe` is denied workspace-wide; this crate allows it only in the modules that need it
//! (SIMD intrinsics, the mmap call, the CUDA driver/NVRTC calls and kernel launches), each
//! block with a `SAFETY:` comment or a `# Safety` contract.

pub mod cpu;
pub mod cuda;
pub mod device;
pub mod fp8;
pub mod mapped;
pub mod quant;
pub mod w8a8;
pub mod wq;
