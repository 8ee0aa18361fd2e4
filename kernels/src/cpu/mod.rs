//! CPU reference ops. Activations are f32 and row-major; weights are rows of any
//! [`crate::quant::GgmlType`] (a linear layer `y = x Wᵀ` reads `W` as `[out_features, in_features]`).

pub mod attention;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod exp16;
pub mod kv_elem;
pub mod matmul;
pub mod norm;
pub mod rope;

pub use crate::quant::scalar::dot_f32;
pub use norm::{
    add_bias, add_in_place, clamped_swiglu_in_place, gelu_in_place, gelu_tanh_mul_in_place,
    layer_norm, rms_norm, rms_norm_in_place, silu_mul_in_place, soft_cap_in_place,
};
