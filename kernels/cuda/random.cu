// Random weights made on the device (`--load-format dummy` and `bench kernels --mode model`):
// a 70B model's worth of values never crosses PCIe or lives in host memory. Values are a pure
// function of (seed, index) — a SplitMix64 mix — so a fill is reproducible whatever the grid.
#include "common.cuh"

__device__ __forceinline__ u64 mix(u64 z) {
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// out[i] = offset + scale * u, u uniform in [-1, 1).
template <typename T>
__device__ void fill_uniform(T* out, i64 n, u64 seed, float scale, float offset) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x) {
    const u64 r = mix(seed ^ mix((u64)i));
    const float u = (float)(r >> 40) * (1.0f / 8388608.0f) - 1.0f;  // 24 bits -> [-1, 1)
    out[i] = from_f32<T>(offset + scale * u);
  }
}

// Launch: grid any gx >= 1 (grid-strided; a few thousand blocks is plenty), block 256, no
// dynamic shared memory. out: n elements.
extern "C" __global__ void fill_uniform_f16(f16* out, i64 n, u64 seed, float scale, float offset) {
  fill_uniform(out, n, seed, scale, offset);
}

extern "C" __global__ void fill_uniform_bf16(bf16* out, i64 n, u64 seed, float scale,
                                             float offset) {
  fill_uniform(out, n, seed, scale, offset);
}

// out[i] = random byte & mask (packed quantized codes: any byte is valid; zero points: mask the
// byte to the largest code). Launch as fill_uniform_*.
extern "C" __global__ void fill_bytes(u8* out, i64 n, u64 seed, u32 mask) {
  for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (i64)gridDim.x * blockDim.x)
    out[i] = (u8)(mix(seed ^ mix((u64)i)) >> 56) & (u8)mask;
}
