// FP8 (e4m3) W8A8 on sm_89+ tensor cores, as the CPU computes it (kernels/src/fp8.rs):
// activations rounded through e4m3 at run time, x' = e4m3(clamp(x / s, ±448)) with one scale s
// per run of `group` inputs of each token (a whole row for per-token scales): s = max|x| / 448
// (f32's epsilon for an all-zero run), or the checkpoint's static scale; then
// out = Σ over scale blocks of s_w · s_x · Σ e4m3(w) · e4m3(x).
//
// Layout: weight codes [n][k] e4m3 row-major; weight scales a row-major grid of one f32 per
// block of block_rows × block_cols weights (per tensor: one block; per channel: 1 × k);
// activation codes [m][k] and scales [m][k / group] (fp8_quantize's output); out [m][n] T.
// k, the scale run (the smaller of block_cols and group, which divides the other) and the
// GEMM's 64-byte chunks: k and the run are multiples of 64.
//
// GEMM: as w8a8.cu's (mma.sync m16n8k32, a warp owning 16 weight rows and TOK 8-token tiles,
// lane (gid, tig) reading bytes [16·tig, +16) of each 64-byte chunk of its rows), with the
// products of each scale run summed apart and scaled into the f32 total at the run's end.
#include "common.cuh"
#include "mma.cuh"

namespace fp8 {

constexpr int WARPS = 4;
constexpr float E4M3_MAX = 448.0f;

// One block per (token, run of `group` inputs); `static_scale` > 0 replaces the dynamic one.
template <typename T>
__device__ __forceinline__ void quantize(u8* q, float* scales, const T* x, i32 m, i32 k,
                                         i32 group, float static_scale) {
  __shared__ float scratch[32];
  const i32 runs = k / group;
  for (i32 job = blockIdx.x; job < m * runs; job += gridDim.x) {
    const i32 r = job / runs, g = job % runs;
    const T* xr = x + (i64)r * k + (i64)g * group;
    u8* qr = q + (i64)r * k + (i64)g * group;
    float s = static_scale;
    if (s <= 0.0f) {
      float amax = 0.0f;
      for (i32 i = threadIdx.x; i < group; i += blockDim.x) {
        amax = fmaxf(amax, fabsf(to_f32(xr[i])));
      }
      amax = block_max(amax, scratch);
      s = amax / E4M3_MAX;
      if (s == 0.0f) s = 1.1920929e-7f;  // compressed-tensors' epsilon: zeros stay zeros
    }
    // IEEE divide (NVRTC's default), as the CPU divides; the cvt saturates to ±448.
    for (i32 i = 2 * threadIdx.x; i < group; i += 2 * blockDim.x) {
      const u16 pair = e4m3x2(to_f32(xr[i]) / s, to_f32(xr[i + 1]) / s);
      qr[i] = (u8)(pair & 0xff);
      qr[i + 1] = (u8)(pair >> 8);
    }
    if (threadIdx.x == 0) scales[(i64)r * runs + g] = s;
  }
}

__device__ __forceinline__ uint4 load16(const u8* p, bool valid) {
  uint4 v;
  v.x = v.y = v.z = v.w = 0;
  return valid ? ldg_v4(p) : v;
}

struct Weights {
  const u8* codes;
  const float* scales;
  i32 block_rows, block_cols, grid_cols;
};

template <typename T, int TOK>
__device__ __forceinline__ void gemm(T* out, const u8* xq, const float* xs, i32 group,
                                     Weights w, i32 m, i32 n, i32 k, i32 run) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int gid = lane >> 2, tig = lane & 3;
  const i32 row0 = (blockIdx.x * WARPS + warp) * 16;
  const i32 tok0 = blockIdx.y * 8 * TOK;
  if (row0 >= n) return;  // the whole warp: no mma is left half-issued
  const i32 ra = row0 + gid, rb = row0 + gid + 8;
  const bool va = ra < n, vb = rb < n;
  const u8* pa = w.codes + (i64)(va ? ra : 0) * k + 16 * tig;
  const u8* pb = w.codes + (i64)(vb ? rb : 0) * k + 16 * tig;
  const u8* px[TOK];
  bool vx[TOK];
  float acc[TOK][4];
#pragma unroll
  for (int t = 0; t < TOK; ++t) {
    const i32 tok = tok0 + 8 * t + gid;
    vx[t] = tok < m;
    px[t] = xq + (i64)(vx[t] ? tok : 0) * k + 16 * tig;
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[t][j] = 0.0f;
  }
  const i32 runs_x = k / group;
  for (i32 k0 = 0; k0 < k; k0 += run) {
    float part[TOK][4];
#pragma unroll
    for (int t = 0; t < TOK; ++t) {
#pragma unroll
      for (int j = 0; j < 4; ++j) part[t][j] = 0.0f;
    }
    for (i32 kc = k0; kc < k0 + run; kc += 64) {
      const uint4 a = load16(pa + kc, va), b = load16(pb + kc, vb);
      const u32 a_first[4] = {a.x, b.x, a.y, b.y};
      const u32 a_second[4] = {a.z, b.z, a.w, b.w};
#pragma unroll
      for (int t = 0; t < TOK; ++t) {
        const uint4 x = load16(px[t] + kc, vx[t]);
        const u32 x_first[2] = {x.x, x.y};
        const u32 x_second[2] = {x.z, x.w};
        mma16832_e4m3(part[t], a_first, x_first);
        mma16832_e4m3(part[t], a_second, x_second);
      }
    }
    // d[j]: weight row gid + 8·(j / 2), token 2·tig + j % 2 of the tile.
    const i32 wc = k0 / w.block_cols;
    const float sw[2] = {va ? w.scales[(ra / w.block_rows) * w.grid_cols + wc] : 0.0f,
                         vb ? w.scales[(rb / w.block_rows) * w.grid_cols + wc] : 0.0f};
#pragma unroll
    for (int t = 0; t < TOK; ++t) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const i32 tok = tok0 + 8 * t + 2 * tig + (j & 1);
        const float sx = tok < m ? xs[(i64)tok * runs_x + k0 / group] : 0.0f;
        acc[t][j] += part[t][j] * (sw[j >> 1] * sx);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < TOK; ++t) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const i32 row = row0 + gid + 8 * (j >> 1), tok = tok0 + 8 * t + 2 * tig + (j & 1);
      if (row < n && tok < m) out[(i64)tok * n + row] = from_f32<T>(acc[t][j]);
    }
  }
}

}  // namespace fp8

// fp8_quantize_{f16,bf16}(q, scales, x, m, k, group, static_scale): block a multiple of 32,
// grid any (jobs are strided); group divides k and is even; static_scale 0 for dynamic.
#define FP8_QUANTIZE(T)                                                                         \
  extern "C" __global__ void __launch_bounds__(1024) fp8_quantize_##T(                          \
      u8* q, float* scales, const T* x, i32 m, i32 k, i32 group, float static_scale) {         \
    fp8::quantize<T>(q, scales, x, m, k, group, static_scale);                                 \
  }
FP8_QUANTIZE(f16)
FP8_QUANTIZE(bf16)

// fp8_gemm_t{1,8}_{f16,bf16}(out, q, x_scales, group, codes, w_scales, block_rows, block_cols,
// grid_cols, m, n, k, run): block 128 threads, grid (ceil(n / 64), ceil(m / (8 · TOK))).
#define FP8_GEMM(T, TOK)                                                                        \
  extern "C" __global__ void __launch_bounds__(32 * fp8::WARPS) fp8_gemm_t##TOK##_##T(           \
      T* out, const u8* q, const float* xs, i32 group, const u8* codes, const float* ws,       \
      i32 block_rows, i32 block_cols, i32 grid_cols, i32 m, i32 n, i32 k, i32 run) {           \
    fp8::gemm<T, TOK>(out, q, xs, group, fp8::Weights{codes, ws, block_rows, block_cols,       \
                                                      grid_cols},                              \
                      m, n, k, run);                                                           \
  }
FP8_GEMM(f16, 1)
FP8_GEMM(bf16, 1)
FP8_GEMM(f16, 8)
FP8_GEMM(bf16, 8)
