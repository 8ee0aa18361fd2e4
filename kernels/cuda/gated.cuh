// The MLP's gated activations, act(gate) * up, defined once: activation.cu's kernels store
// them, and the GEMVs that read the down projection's input straight from the gate|up
// buffer (gemv.cuh's GatedX) compute them on the fly. One definition is what makes the fused
// product bit-identical to the activation kernel followed by the plain GEMV.
//
// Formulas and evaluation order are the CPU's (kernels/src/cpu/norm.rs):
//   silu_mul:      g / (1 + exp(-g)) * u              (accurate expf, IEEE divide)
//   gelu_tanh_mul: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x³))) * u
// The gelu products inside tanh's argument are rounded separately (__fmul_rn): an FMA there
// would move the f32 result off the CPU's by an ulp.
#pragma once
#include "common.cuh"

struct SiluOp {
  __device__ __forceinline__ static float apply(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
  }
};

struct GeluTanhOp {
  __device__ __forceinline__ static float apply(float x, float u) {
    const float SQRT_2_OVER_PI = 0.7978846f;
    const float KAPPA = 0.044715f;
    const float cube = __fmul_rn(__fmul_rn(x, x), x);
    const float inner = __fmul_rn(SQRT_2_OVER_PI, x + __fmul_rn(KAPPA, cube));
    return 0.5f * x * (1.0f + tanhf(inner)) * u;
  }
};

// One gated value: f32 math, one rounding to T (what activation.cu stores).
template <typename Op, typename T>
__device__ __forceinline__ T gated_value(T g, T u) {
  return from_f32<T>(Op::apply(to_f32(g), to_f32(u)));
}

// Two packed T values (low half first) of gate and of up -> the packed pair of
// act(gate) * up, as the GEMVs load their activation words.
template <typename Op, typename T>
__device__ __forceinline__ u32 gated_word(u32 g, u32 u) {
  const T lo = gated_value<Op>(from_bits<T>((u16)(g & 0xffffu)), from_bits<T>((u16)(u & 0xffffu)));
  const T hi = gated_value<Op>(from_bits<T>((u16)(g >> 16)), from_bits<T>((u16)(u >> 16)));
  return (u32)lo.bits | ((u32)hi.bits << 16);
}
