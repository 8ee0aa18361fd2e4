// RMSNorm, alone and fused with the residual add on either side of it.
//
// w_eff = to_f32(weight[i]) + weight_offset: 1.0 turns Gemma's `x * (1 + w)` norms into plain
// ones (the CPU adds the offset to the f32 weights at load, the same sum). Like the CPU
// (kernels/src/cpu/norm.rs): inv = 1 / sqrt(sum(x²) / hidden + eps) with IEEE sqrt and divide
// (not rsqrtf), then x * inv * w_eff in that order; only the summation order of sum(x²)
// differs (a tree here).
//
// One block per row. Each thread visits the same elements in every pass over the row, so
// add_rms_norm's second pass reads back the residual values the same thread stored in the
// first, and the int8 pass the outputs it stored in the second.
//
// rms_norm and add_rms_norm can also round their output to int8 per row for the W8A8
// projection that reads it (q non-null): a third pass over the stored (rounded) outputs with
// w8a8.cu's arithmetic (common.cuh's int8_*), so the codes and scale are the ones
// w8a8_quantize would make from `out`, without its launch.
#include "common.cuh"

enum NormMode {
  NORM = 0,      // out = norm(x)
  ADD_NORM = 1,  // residual = round(residual + x); out = norm(residual)
  NORM_ADD = 2,  // residual = round(residual + round(norm(x)))
};

template <typename T, int MODE, int N>
__device__ __forceinline__ void norm_rows(T* out, T* residual, const T* x, i32 x_stride,
                                          const T* weight, i32 rows, i32 hidden, float eps,
                                          float weight_offset, u8* q, float* q_scales) {
  __shared__ float scratch[32];
  for (i32 r = blockIdx.x; r < rows; r += gridDim.x) {
    const T* xr = x + (i64)r * x_stride;
    T* rr = MODE == NORM ? nullptr : residual + (i64)r * hidden;
    T* outr = MODE == NORM_ADD ? nullptr : out + (i64)r * hidden;

    float ss = 0.0f;
    for (i32 i = threadIdx.x * N; i < hidden; i += blockDim.x * N) {
      float v[N];
      load_elems<N>(xr + i, v);
      if constexpr (MODE == ADD_NORM) {
        // The stream keeps T precision: normalize what was stored, as the next layer reads it.
        float res[N];
        load_elems<N>(rr + i, res);
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] = to_f32(from_f32<T>(res[j] + v[j]));
        store_elems<N>(rr + i, v);
      }
#pragma unroll
      for (int j = 0; j < N; ++j) ss += v[j] * v[j];
    }
    ss = block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)hidden + eps);

    float amax = 0.0f;  // of the stored outputs, for the int8 pass
    for (i32 i = threadIdx.x * N; i < hidden; i += blockDim.x * N) {
      float v[N], w[N];
      load_elems<N>(MODE == ADD_NORM ? (const T*)rr + i : xr + i, v);
      load_elems<N>(weight + i, w);
#pragma unroll
      for (int j = 0; j < N; ++j) v[j] = v[j] * inv * (w[j] + weight_offset);
      if constexpr (MODE == NORM_ADD) {
        float res[N];
        load_elems<N>(rr + i, res);
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] = res[j] + to_f32(from_f32<T>(v[j]));
        store_elems<N>(rr + i, v);
      } else {
        store_elems<N>(outr + i, v);
#pragma unroll
        for (int j = 0; j < N; ++j) amax = fmaxf(amax, fabsf(to_f32(from_f32<T>(v[j]))));
      }
    }
    if (MODE != NORM_ADD && q) {
      amax = block_max(amax, scratch);
      const float qinv = int8_inv(amax);
      u8* qr = q + (i64)r * hidden;
      for (i32 i = threadIdx.x * N; i < hidden; i += blockDim.x * N) {
        float v[N];
        load_elems<N>(outr + i, v);
#pragma unroll
        for (int j = 0; j < N; ++j) qr[i + j] = int8_code(v[j], qinv);
      }
      if (threadIdx.x == 0) q_scales[r] = int8_scale(amax);
    }
  }
}

template <typename T, int MODE>
__device__ __forceinline__ void norm_dispatch(T* out, T* residual, const T* x, i32 x_stride,
                                              const T* weight, i32 rows, i32 hidden, float eps,
                                              float weight_offset, u8* q = nullptr,
                                              float* q_scales = nullptr) {
  // Null (unused) pointers count as aligned.
  const bool vec = (hidden & 7) == 0 && (x_stride & 7) == 0 && is_aligned16(out) &&
                   is_aligned16(residual) && is_aligned16(x) && is_aligned16(weight);
  if (vec)
    norm_rows<T, MODE, 8>(out, residual, x, x_stride, weight, rows, hidden, eps, weight_offset, q,
                          q_scales);
  else
    norm_rows<T, MODE, 1>(out, residual, x, x_stride, weight, rows, hidden, eps, weight_offset, q,
                          q_scales);
}

// Launch (all three kernels): grid any gx >= 1 (grid-strided over rows; natural gx = rows),
// block any multiple of 32 up to 1024 (256 for hidden <= 4096, 512 or 1024 above), no dynamic
// shared memory. hidden >= 1 (any size: 16-byte vectors are used when hidden, x_stride and
// every pointer allow, scalar code otherwise).
//
// rms_norm: out [rows, hidden] contiguous = x * inv * w_eff; x rows at stride x_stride
// (>= hidden). out must not overlap x unless out == x and x_stride == hidden.
// q, q_scales: null, or out rounded to int8 per row ([rows, hidden] codes, [rows] scales, as
// w8a8_quantize makes them).
extern "C" __global__ void __launch_bounds__(1024)
    rms_norm_f16(f16* out, const f16* x, i32 x_stride, const f16* weight, i32 rows, i32 hidden,
                 float eps, float weight_offset, u8* q, float* q_scales) {
  norm_dispatch<f16, NORM>(out, nullptr, x, x_stride, weight, rows, hidden, eps, weight_offset,
                           q, q_scales);
}

extern "C" __global__ void __launch_bounds__(1024)
    rms_norm_bf16(bf16* out, const bf16* x, i32 x_stride, const bf16* weight, i32 rows, i32 hidden,
                  float eps, float weight_offset, u8* q, float* q_scales) {
  norm_dispatch<bf16, NORM>(out, nullptr, x, x_stride, weight, rows, hidden, eps,
                            weight_offset, q, q_scales);
}

// add_rms_norm: residual [rows, hidden] (contiguous) = round(residual + x), stored back; then
// out [rows, hidden] = rmsnorm(residual) * w_eff. x [rows, hidden] contiguous. out must not
// alias residual or x. q, q_scales: as rms_norm's.
extern "C" __global__ void __launch_bounds__(1024)
    add_rms_norm_f16(f16* out, f16* residual, const f16* x, const f16* weight, i32 rows, i32 hidden,
                     float eps, float weight_offset, u8* q, float* q_scales) {
  norm_dispatch<f16, ADD_NORM>(out, residual, x, hidden, weight, rows, hidden, eps,
                               weight_offset, q, q_scales);
}

extern "C" __global__ void __launch_bounds__(1024)
    add_rms_norm_bf16(bf16* out, bf16* residual, const bf16* x, const bf16* weight, i32 rows,
                      i32 hidden, float eps, float weight_offset, u8* q, float* q_scales) {
  norm_dispatch<bf16, ADD_NORM>(out, residual, x, hidden, weight, rows, hidden, eps,
                                weight_offset, q, q_scales);
}

// rms_norm_add: residual [rows, hidden] (contiguous) = round(residual + round(rmsnorm(x) *
// w_eff)); x [rows, hidden] contiguous, must not alias residual.
extern "C" __global__ void __launch_bounds__(1024)
    rms_norm_add_f16(f16* residual, const f16* x, const f16* weight, i32 rows, i32 hidden,
                     float eps, float weight_offset) {
  norm_dispatch<f16, NORM_ADD>(nullptr, residual, x, hidden, weight, rows, hidden, eps,
                               weight_offset);
}

extern "C" __global__ void __launch_bounds__(1024)
    rms_norm_add_bf16(bf16* residual, const bf16* x, const bf16* weight, i32 rows, i32 hidden,
                      float eps, float weight_offset) {
  norm_dispatch<bf16, NORM_ADD>(nullptr, residual, x, hidden, weight, rows, hidden, eps,
                                weight_offset);
}
