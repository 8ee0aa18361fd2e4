// Shared by every ferrite kernel: 16-bit float storage types and their conversions, integer
// types, and warp/block reductions.
//
// Kernels are compiled at run time by NVRTC without the CUDA toolkit's headers (no
// cuda_fp16.h): the 16-bit types are plain 16-bit storage and conversions are one PTX
// instruction each. Every kernel computes in f32 and rounds to nearest-even when it stores.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef int i32;
typedef long long i64;
typedef unsigned long long u64;

// IEEE binary16 in storage.
struct f16 {
  u16 bits;
};
// bfloat16 in storage.
struct bf16 {
  u16 bits;
};

__device__ __forceinline__ float to_f32(f16 x) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x.bits));
  return f;
}

__device__ __forceinline__ float to_f32(bf16 x) {
  return __uint_as_float(((u32)x.bits) << 16);
}

__device__ __forceinline__ float to_f32(float x) { return x; }

// `T` rounded from an f32 (round to nearest even; NaN stays NaN).
template <typename T>
__device__ __forceinline__ T from_f32(float f);

template <>
__device__ __forceinline__ f16 from_f32<f16>(float f) {
  f16 h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

template <>
__device__ __forceinline__ bf16 from_f32<bf16>(float f) {
  bf16 h;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h.bits) : "f"(f));
  return h;
}

template <>
__device__ __forceinline__ float from_f32<float>(float f) {
  return f;
}

// -inf without <math.h>.
#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// result. `scratch` holds 32 floats of shared memory; the call synchronizes the block.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // `scratch` may still be read by a previous reduction
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

// Maximum over the whole block; as `block_sum`.
__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int warps = blockDim.x >> 5;
  v = lane < warps ? scratch[lane] : NEG_INF;
  return warp_max(v);
}

// ---- W8A8's per-token int8 rounding, as the CPU's (kernels/src/w8a8): codes
// round-half-away(x * 127 / max|x|) clamped to ±127 (IEEE divide, NVRTC's default), scale
// max|x| / 127; an all-zero row gives zero codes and scale 0. w8a8.cu's quantize and norm.cu's
// fused one both round with these.

__device__ __forceinline__ float int8_inv(float amax) { return amax > 0.0f ? 127.0f / amax : 0.0f; }
__device__ __forceinline__ float int8_scale(float amax) { return amax > 0.0f ? amax / 127.0f : 0.0f; }
__device__ __forceinline__ u8 int8_code(float x, float inv) {
  return (u8)(signed char)(int)fminf(fmaxf(roundf(x * inv), -127.0f), 127.0f);
}

// ---- 16-byte vector access (eight 16-bit values at a time) ----
// Callers check `is_aligned16` on every pointer (and that strides keep rows aligned) and fall
// back to scalar code otherwise: a misaligned vector access faults.

__device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<unsigned long long>(p) & 15) == 0;
}

template <typename T>
__device__ __forceinline__ T from_bits(u16 b) {
  T t;
  t.bits = b;
  return t;
}

// p[0..8] as f32 (p 16-byte aligned).
template <typename T>
__device__ __forceinline__ void load_vec8(const T* p, float* f) {
  const uint4 v = *reinterpret_cast<const uint4*>(p);
  const u32 w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    f[2 * i] = to_f32(from_bits<T>((u16)(w[i] & 0xffffu)));
    f[2 * i + 1] = to_f32(from_bits<T>((u16)(w[i] >> 16)));
  }
}

// p[0..8] = round(f[0..8]) (p 16-byte aligned).
template <typename T>
__device__ __forceinline__ void store_vec8(T* p, const float* f) {
  u32 w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
    w[i] = (u32)from_f32<T>(f[2 * i]).bits | ((u32)from_f32<T>(f[2 * i + 1]).bits << 16);
  *reinterpret_cast<uint4*>(p) = make_uint4(w[0], w[1], w[2], w[3]);
}

// N = 8 (one 16-byte access, p aligned) or N = 1 (scalar) consecutive elements as f32: lets a
// kernel be written once and instantiated for its vector and scalar paths.
template <int N, typename T>
__device__ __forceinline__ void load_elems(const T* p, float* f) {
  if constexpr (N == 8) {
    load_vec8(p, f);
  } else {
    static_assert(N == 1, "load_elems: N is 8 or 1");
    f[0] = to_f32(*p);
  }
}

template <int N, typename T>
__device__ __forceinline__ void store_elems(T* p, const float* f) {
  if constexpr (N == 8) {
    store_vec8(p, f);
  } else {
    static_assert(N == 1, "store_elems: N is 8 or 1");
    *p = from_f32<T>(f[0]);
  }
}
