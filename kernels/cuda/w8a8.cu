// W8A8: int8 weights (one f32 scale per output row) times activations rounded to int8 per
// token at run time, as the CPU's W8A8 kernels compute them (kernels/src/w8a8): per row of x,
// s = max|x| / 127 and q = round-half-away(x · (127 / max|x|)) clamped to ±127 (all zero for
// an all-zero row); the products summed exactly in i32; out = s_x · s_w · sum, rounded once.
//
// Layout: weights [n][k] int8 row-major, scales [n] f32; x [m][k] T; the quantized rows
// [m][k] int8 and scales [m] f32 (w8a8_quantize's output, the GEMM's input); out [m][n] T.
// k is a multiple of 64: every lane reads 16-byte vectors of every row.
//
// GEMM: mma.sync m16n8k32 (s8 × s8 → s32) over tile8.cuh's warp tile (16 weight rows, TOK
// tiles of 8 tokens), so each weight byte a warp reads serves 8·TOK tokens: TOK = 1 for
// decode (m ≤ 8: the weights dominate the traffic, read once), TOK = 8 for prefill (64 tokens
// per warp, the weights read once per 64 tokens, from L2 after the first tile).
#include "common.cuh"
#include "mma.cuh"
#include "tile8.cuh"

namespace w8a8 {

// One block per row of x.
template <typename T>
__device__ __forceinline__ void quantize(u8* q, float* scales, const T* x, i32 m, i32 k) {
  __shared__ float scratch[32];
  for (i32 r = blockIdx.x; r < m; r += gridDim.x) {
    const T* xr = x + (i64)r * k;
    float amax = 0.0f;
    for (i32 i = threadIdx.x; i < k; i += blockDim.x) amax = fmaxf(amax, fabsf(to_f32(xr[i])));
    amax = block_max(amax, scratch);
    const float inv = int8_inv(amax);  // the CPU's arithmetic (common.cuh)
    for (i32 i = threadIdx.x; i < k; i += blockDim.x) q[(i64)r * k + i] = int8_code(to_f32(xr[i]), inv);
    if (threadIdx.x == 0) scales[r] = int8_scale(amax);
  }
}

template <typename T, int TOK>
__device__ __forceinline__ void gemm(T* out, const u8* xq, const float* xs, const u8* w,
                                     const float* ws, i32 m, i32 n, i32 k) {
  tile8::Tile<TOK> tile;
  if (!tile.init(w, xq, m, n, k, TOK == 1)) return;
  i32 acc[TOK][4] = {};
  if (TOK == 1) {  // decode: k split among the block's warps (tile8.cuh)
    tile.chunks_split(0, k, acc[0], mma16832_s8);
    if (!tile8::sum_warps(acc[0])) return;
  } else {
    for (i32 kc = 0; kc < k; kc += 64) tile.chunk(kc, acc, mma16832_s8);
  }
#pragma unroll
  for (int t = 0; t < TOK; ++t) {
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const i32 row = tile.row(j), tok = tile.tok(t, j);
      if (row < n && tok < m) {
        out[(i64)tok * n + row] = from_f32<T>(xs[tok] * ws[row] * (float)acc[t][j]);
      }
    }
  }
}

// The GEMM's epilogue after products summed elsewhere (cuBLASLt's int8 GEMM, imma.rs): the same
// expression as `gemm`'s, so the same bits. Grid-strided over the m * n results.
template <typename T>
__device__ __forceinline__ void scale(T* out, const i32* sums, const float* xs, const float* ws,
                                      i32 m, i32 n) {
  const i64 total = (i64)m * n;
  for (i64 e = (i64)blockIdx.x * blockDim.x + threadIdx.x; e < total;
       e += (i64)gridDim.x * blockDim.x) {
    const i32 tok = (i32)(e / n), row = (i32)(e - (i64)tok * n);
    out[e] = from_f32<T>(xs[tok] * ws[row] * (float)sums[e]);
  }
}

}  // namespace w8a8

// w8a8_quantize_{f16,bf16}(q, scales, x, m, k): grid any (rows are strided), block a multiple
// of 32.
#define W8A8_QUANTIZE(T)                                                                        \
  extern "C" __global__ void __launch_bounds__(1024)                                           \
      w8a8_quantize_##T(u8* q, float* scales, const T* x, i32 m, i32 k) {                      \
    w8a8::quantize<T>(q, scales, x, m, k);                                                     \
  }
W8A8_QUANTIZE(f16)
W8A8_QUANTIZE(bf16)

// w8a8_gemm_t{1,8}_{f16,bf16}(out, q, x_scales, w, w_scales, m, n, k): block 128 threads,
// grid (ceil(n / 16), 1) for t1 (decode, m ≤ 8), (ceil(n / 64), ceil(m / 64)) for t8.
#define W8A8_GEMM(T, TOK)                                                                       \
  extern "C" __global__ void __launch_bounds__(32 * tile8::WARPS) w8a8_gemm_t##TOK##_##T(         \
      T* out, const u8* q, const float* xs, const u8* w, const float* ws, i32 m, i32 n, i32 k) { \
    w8a8::gemm<T, TOK>(out, q, xs, w, ws, m, n, k);                                            \
  }
W8A8_GEMM(f16, 1)
W8A8_GEMM(bf16, 1)
W8A8_GEMM(f16, 8)
W8A8_GEMM(bf16, 8)

// w8a8_scale_{f16,bf16}(out, sums, x_scales, w_scales, m, n): out[i][j] = xs[i] * ws[j] *
// sums[i][j] rounded to T, both [m][n] row-major. Grid any (strided), block a multiple of 32.
#define W8A8_SCALE(T)                                                                           \
  extern "C" __global__ void __launch_bounds__(256) w8a8_scale_##T(                              \
      T* out, const i32* sums, const float* xs, const float* ws, i32 m, i32 n) {                 \
    w8a8::scale<T>(out, sums, xs, ws, m, n);                                                   \
  }
W8A8_SCALE(f16)
W8A8_SCALE(bf16)
