// The GEMVs' last step (dense_gemv.cu, wq_gemv.cu): a block's WARPS warps each hold mma
// accumulators for the block's 16 weight rows and NT n8 tiles of activation rows over their
// slice of the row length; they are summed in shared memory and stored, rounded once.
#pragma once
#include "common.cuh"

// acc[nt][c] of lane (gid, tig) is weight row row0 + gid + 8*(c>>1) and activation row
// 8*nt + 2*tig + (c&1); entry e = 128*nt + 4*lane + c of each warp's slice of `red`.
// out[n * out_stride + row] for row < rows, n < m.
template <int WARPS, int NT, typename O>
__device__ __forceinline__ void gemv_store(float (&red)[WARPS][128 * NT], const float (&acc)[NT][4],
                                           O* __restrict__ out, i64 out_stride, int row0,
                                           int rows, int m) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
    *reinterpret_cast<float4*>(&red[warp][128 * nt + 4 * lane]) =
        make_float4(acc[nt][0], acc[nt][1], acc[nt][2], acc[nt][3]);
  __syncthreads();
  if (threadIdx.x < 128 * NT) {
    const int e = threadIdx.x;
    float s = 0.f;
#pragma unroll
    for (int v = 0; v < WARPS; ++v) s += red[v][e];
    const int l = (e & 127) >> 2, c = e & 3;
    const int row = row0 + (l >> 2) + 8 * (c >> 1), n = 8 * (e >> 7) + 2 * (l & 3) + (c & 1);
    if (row < rows && n < m) out[(i64)n * out_stride + row] = from_f32<O>(s);
  }
}
