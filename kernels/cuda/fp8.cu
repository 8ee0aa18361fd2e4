// FP8 (e4m3) W8A8 on sm_89+ tensor cores, as the CPU computes it (kernels/src/fp8.rs):
// activations rounded through e4m3 at run time, x' = e4m3(clamp(x / s, ±448)) with one scale s
// per run of `group` inputs of each token (a whole row for per-token scales): s = max|x| / 448
// (f32's epsilon for an all-zero run), or the checkpoint's static scale; then
// out = Σ over scale blocks of s_w · s_x · Σ e4m3(w) · e4m3(x).
//
// Layout: weight codes [n][k] e4m3 row-major; weight scales a row-major grid of one f32 per
// block of block_rows × block_cols weights (per tensor: one block; per channel: 1 × k);
// activation codes [m][k] and scales [m][k / group] (fp8_quantize's output); out [m][n] T.
// fp8_quantize can write the scales [k / group][m] instead (token-major within a run), the
// layout cuBLASLt's 1 × 128 block scales take (fp8.rs); the tiles read the first.
// k, the scale run (the smaller of block_cols and group, which divides the other) and the
// GEMM's 64-byte chunks: k and the run are multiples of 64.
//
// GEMM: as w8a8.cu's (mma.sync m16n8k32 over tile8.cuh's warp tile), with the products of
// each scale run summed apart and scaled into the f32 total at the run's end.
#include "common.cuh"
#include "mma.cuh"
#include "tile8.cuh"

namespace fp8 {
constexpr float E4M3_MAX = 448.0f;

// One block per (token, run of `group` inputs); `static_scale` > 0 replaces the dynamic one.
// Token r's scale of run g goes to scales[r * token_stride + g * run_stride].
template <typename T>
__device__ __forceinline__ void quantize(u8* q, float* scales, const T* x, i32 m, i32 k,
                                         i32 group, float static_scale, i32 token_stride,
                                         i32 run_stride) {
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
    if (threadIdx.x == 0) scales[(i64)r * token_stride + (i64)g * run_stride] = s;
  }
}

struct Weights {
  const u8* codes;
  const float* scales;
  i32 block_rows, block_cols, grid_cols;
};

template <typename T, int TOK>
__device__ __forceinline__ void gemm(T* out, const u8* xq, const float* xs, i32 group,
                                     Weights w, i32 m, i32 n, i32 k, i32 run) {
  tile8::Tile<TOK> tile;
  if (!tile.init(w.codes, xq, m, n, k, TOK == 1)) return;
  float acc[TOK][4] = {};
  const i32 runs_x = k / group;
  for (i32 k0 = 0; k0 < k; k0 += run) {
    float part[TOK][4] = {};
    if (TOK == 1) {  // decode: each run's chunks split among the block's warps (tile8.cuh)
      tile.chunks_split(k0, k0 + run, part[0], mma16832_e4m3);
    } else {
      for (i32 kc = k0; kc < k0 + run; kc += 64) tile.chunk(kc, part, mma16832_e4m3);
    }
    // One weight scale per row half of the tile, one activation scale per token.
    float sw[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const i32 row = tile.row(2 * h);
      sw[h] = row < n ? w.scales[(row / w.block_rows) * w.grid_cols + k0 / w.block_cols] : 0.0f;
    }
#pragma unroll
    for (int t = 0; t < TOK; ++t) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const i32 tok = tile.tok(t, j);
        const float sx = tok < m ? xs[(i64)tok * runs_x + k0 / group] : 0.0f;
        acc[t][j] += part[t][j] * (sw[j >> 1] * sx);
      }
    }
  }
  // Split decode: the warps' scaled partial sums added (the same scales: a sum of products).
  if (TOK == 1 && !tile8::sum_warps(acc[0])) return;
#pragma unroll
  for (int t = 0; t < TOK; ++t) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const i32 row = tile.row(j), tok = tile.tok(t, j);
      if (row < n && tok < m) out[(i64)tok * n + row] = from_f32<T>(acc[t][j]);
    }
  }
}

}  // namespace fp8

// fp8_quantize_{f16,bf16}(q, scales, x, m, k, group, static_scale, token_stride, run_stride):
// block a multiple of 32, grid any (jobs are strided); group divides k and is even;
// static_scale 0 for dynamic; strides (k / group, 1) for the tiles, (1, m) for cuBLASLt's blocks.
#define FP8_QUANTIZE(T)                                                                         \
  extern "C" __global__ void __launch_bounds__(1024) fp8_quantize_##T(                          \
      u8* q, float* scales, const T* x, i32 m, i32 k, i32 group, float static_scale,           \
      i32 token_stride, i32 run_stride) {                                                      \
    fp8::quantize<T>(q, scales, x, m, k, group, static_scale, token_stride, run_stride);       \
  }
FP8_QUANTIZE(f16)
FP8_QUANTIZE(bf16)

// fp8_gemm_t{1,8}_{f16,bf16}(out, q, x_scales, group, codes, w_scales, block_rows, block_cols,
// grid_cols, m, n, k, run): block 128 threads, grid (ceil(n / 16), 1) for t1 (decode, m ≤ 8),
// (ceil(n / 64), ceil(m / 64)) for t8.
#define FP8_GEMM(T, TOK)                                                                        \
  extern "C" __global__ void __launch_bounds__(32 * tile8::WARPS) fp8_gemm_t##TOK##_##T(           \
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
