// Group means of activation rows, for the per-group minimums of weight-only quantized matrices
// (GGUF Q4_1, Q4_K, Q5_K repacked: w = scale * (q - zero) + min, see kernels/src/wq/gguf.rs).
//
// The quantized kernels compute the scale * (q - zero) part; the minimums add
//   out[i][r] += sum_g min[r][g] * sum_{k in g} x[i][k] = group_size * (means[i] . mins[r]),
// a product of means [m][groups] and mins^T that cuBLAS accumulates into out (beta = 1, alpha =
// group_size). This kernel makes the means. Means rather than sums: a mean of f16 values is an
// f16 value, where a sum of 32 of them can overflow f16; the scaling by group_size is exact
// (a power of two for every grouped format) and happens in cuBLAS's f32 accumulation.
//
// Each mean is accumulated in f32 over the whole group and rounded once to T. One thread per
// (row, group): the work is m * cols additions, a few microseconds at most, and the group's
// elements are read with 16-byte loads where aligned.
#include "common.cuh"

namespace wq_mins {

template <typename T>
__device__ __forceinline__ void group_means(T* __restrict__ means, const T* __restrict__ x, int m,
                                            int cols, int group_size) {
  const int groups = (cols + group_size - 1) / group_size;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (i64)m * groups) return;
  const int i = (int)(idx / groups), g = (int)(idx % groups);
  const int c0 = g * group_size;
  const int c1 = min(cols, c0 + group_size);
  const T* p = x + (i64)i * cols;
  float s = 0.f;
  int c = c0;
  if (is_aligned16(p + c0)) {
    for (; c + 8 <= c1; c += 8) {
      float f[8];
      load_vec8(p + c, f);
#pragma unroll
      for (int j = 0; j < 8; ++j) s += f[j];
    }
  }
  for (; c < c1; ++c) s += to_f32(p[c]);
  // Divided by the nominal group size, also for a shorter last group: the caller multiplies
  // every mean back by the same group_size.
  means[idx] = from_f32<T>(s / (float)group_size);
}

}  // namespace wq_mins

// wq_group_means_{f16,bf16}(T* means, const T* x, i32 m, i32 cols, i32 group_size)
//   means[i][g] = (sum_{c = g*gs}^{min(cols, (g+1)*gs) - 1} x[i][c]) / gs, summed in f32 and
//   rounded once; x [m][cols] contiguous, means [m][groups] contiguous,
//   groups = ceil(cols / gs).
//   grid  = (ceil(m * groups / 256), 1, 1); block = (256, 1, 1); dynamic shared memory = 0.
//   Constraints: m >= 1, group_size >= 1, m * groups < 2^31; no alignment required (16-byte
//   loads only where a group starts 16-byte aligned). Reads x, writes means, allocates
//   nothing: safe inside a CUDA graph.
#define WQ_GROUP_MEANS(name, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      wq_group_means_##name(T* means, const T* x, i32 m, i32 cols, i32 group_size) {            \
    wq_mins::group_means<T>(means, x, m, cols, group_size);                                     \
  }
WQ_GROUP_MEANS(f16, f16)
WQ_GROUP_MEANS(bf16, bf16)
