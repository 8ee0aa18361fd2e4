// Element-wise conversions between f32 and the 16-bit storage types, and the f32 soft cap.
//
// Flat, grid-strided over i64 element counts (a logits buffer of 256 rows of a 256k vocabulary
// already has 2^26 elements). Four elements per access when the pointers allow it: float4 on
// the f32 side, 8 bytes on the 16-bit side.
#include "common.cuh"

__device__ __forceinline__ bool is_aligned8(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 7) == 0;
}

// First thread index and stride of a flat grid-stride loop.
#define GRID_START ((i64)blockIdx.x * blockDim.x + threadIdx.x)
#define GRID_STEP ((i64)gridDim.x * blockDim.x)

template <typename T>
__device__ __forceinline__ void f32_to(T* out, const float* x, i64 n) {
  i64 head = 0;  // elements done by the vector loop
  if (is_aligned16(x) && is_aligned8(out)) {
    head = n & ~(i64)3;
    for (i64 q = GRID_START; q < n / 4; q += GRID_STEP) {
      const float4 f = reinterpret_cast<const float4*>(x)[q];
      const u32 lo = (u32)from_f32<T>(f.x).bits | ((u32)from_f32<T>(f.y).bits << 16);
      const u32 hi = (u32)from_f32<T>(f.z).bits | ((u32)from_f32<T>(f.w).bits << 16);
      reinterpret_cast<uint2*>(out)[q] = make_uint2(lo, hi);
    }
  }
  for (i64 i = head + GRID_START; i < n; i += GRID_STEP) out[i] = from_f32<T>(x[i]);
}

template <typename T>
__device__ __forceinline__ void to_f32_from(float* out, const T* x, i64 n) {
  i64 head = 0;
  if (is_aligned8(x) && is_aligned16(out)) {
    head = n & ~(i64)3;
    for (i64 q = GRID_START; q < n / 4; q += GRID_STEP) {
      const uint2 w = reinterpret_cast<const uint2*>(x)[q];
      reinterpret_cast<float4*>(out)[q] = make_float4(
          to_f32(from_bits<T>((u16)(w.x & 0xffffu))), to_f32(from_bits<T>((u16)(w.x >> 16))),
          to_f32(from_bits<T>((u16)(w.y & 0xffffu))), to_f32(from_bits<T>((u16)(w.y >> 16))));
    }
  }
  for (i64 i = head + GRID_START; i < n; i += GRID_STEP) out[i] = to_f32(x[i]);
}

// Launch (all five kernels): grid any gx >= 1 (grid-strided; natural gx = min(ceil(n / (4 *
// 256)), a few thousand)), block 256 (any size up to 1024), no dynamic shared memory. n >= 0.
// out and x must not overlap.
//
// f32_to_*: out[i] = round(x[i]) (to nearest even; NaN stays NaN, overflow gives ±inf).
extern "C" __global__ void __launch_bounds__(1024)
    f32_to_f16(f16* out, const float* x, i64 n) { f32_to(out, x, n); }

extern "C" __global__ void __launch_bounds__(1024)
    f32_to_bf16(bf16* out, const float* x, i64 n) { f32_to(out, x, n); }

// *_to_f32: out[i] = x[i] (exact).
extern "C" __global__ void __launch_bounds__(1024)
    f16_to_f32(float* out, const f16* x, i64 n) {
  to_f32_from(out, x, n);
}

extern "C" __global__ void __launch_bounds__(1024)
    bf16_to_f32(float* out, const bf16* x, i64 n) {
  to_f32_from(out, x, n);
}

__device__ __forceinline__ float soft_cap(float v, float cap) { return tanhf(v / cap) * cap; }

// soft_cap_f32: x[i] = tanh(x[i] / cap) * cap in place (Gemma 2's final logit cap). Divides by
// cap rather than multiplying by 1 / cap, as the CPU (and transformers) do: the last bit of a
// capped logit can decide a near-tie. cap > 0.
extern "C" __global__ void __launch_bounds__(1024)
    soft_cap_f32(float* x, i64 n, float cap) {
  i64 head = 0;
  if (is_aligned16(x)) {
    head = n & ~(i64)3;
    for (i64 q = GRID_START; q < n / 4; q += GRID_STEP) {
      float4 f = reinterpret_cast<float4*>(x)[q];
      f.x = soft_cap(f.x, cap);
      f.y = soft_cap(f.y, cap);
      f.z = soft_cap(f.z, cap);
      f.w = soft_cap(f.w, cap);
      reinterpret_cast<float4*>(x)[q] = f;
    }
  }
  for (i64 i = head + GRID_START; i < n; i += GRID_STEP) x[i] = soft_cap(x[i], cap);
}
