// What Qwen-family attention adds between the QKV projection and RoPE: the projection biases
// (Qwen1.5/2/2.5) and an RMSNorm over each head of q and k (Qwen3), in place on rows of the
// fused QKV buffer.
#include "common.cuh"

// x[t, j] += bias[j] for j < width, rows `stride` apart; sums in f32, rounded once.
template <typename T>
__device__ void qkv_bias(T* x, i32 stride, const T* bias, i32 rows, i32 width) {
  for (i32 t = blockIdx.x; t < rows; t += gridDim.x) {
    T* row = x + (i64)t * stride;
    for (i32 j = threadIdx.x; j < width; j += blockDim.x)
      row[j] = from_f32<T>(to_f32(row[j]) + to_f32(bias[j]));
  }
}

// Launch: grid any gx >= 1 (natural gx = rows), block 256, no dynamic shared memory.
// x: rows of >= width elements at stride `stride`; bias: [width].
extern "C" __global__ void qkv_bias_f16(f16* x, i32 stride, const f16* bias, i32 rows,
                                        i32 width) {
  qkv_bias(x, stride, bias, rows, width);
}

extern "C" __global__ void qkv_bias_bf16(bf16* x, i32 stride, const bf16* bias, i32 rows,
                                         i32 width) {
  qkv_bias(x, stride, bias, rows, width);
}

// One warp per head: head (t, h) is x[t * stride + h * head_dim ..][..head_dim], normalised
// in place with weight[i] + weight_offset, like rms_norm over that head alone.
template <typename T>
__device__ void head_rms_norm(T* x, i32 stride, const T* weight, i32 rows, i32 heads,
                              i32 head_dim, float eps, float weight_offset) {
  const i32 warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const i64 total = (i64)rows * heads;
  for (i64 w = (i64)blockIdx.x * warps + (threadIdx.x >> 5); w < total;
       w += (i64)gridDim.x * warps) {
    T* head = x + (w / heads) * stride + (w % heads) * head_dim;
    float sum = 0.0f;
    for (i32 i = lane; i < head_dim; i += 32) {
      const float v = to_f32(head[i]);
      sum += v * v;
    }
    const float inv = rsqrtf(warp_sum(sum) / (float)head_dim + eps);
    for (i32 i = lane; i < head_dim; i += 32)
      head[i] = from_f32<T>(to_f32(head[i]) * inv * (to_f32(weight[i]) + weight_offset));
  }
}

// Launch: grid any gx >= 1 (natural gx = ceil(rows * heads / 4)), block 128 (four heads per
// block; any multiple of 32 works), no dynamic shared memory. x: rows at stride `stride`, each
// holding `heads` heads of head_dim from its start; weight: [head_dim].
extern "C" __global__ void head_rms_norm_f16(f16* x, i32 stride, const f16* weight, i32 rows,
                                             i32 heads, i32 head_dim, float eps,
                                             float weight_offset) {
  head_rms_norm(x, stride, weight, rows, heads, head_dim, eps, weight_offset);
}

extern "C" __global__ void head_rms_norm_bf16(bf16* x, i32 stride, const bf16* weight, i32 rows,
                                              i32 heads, i32 head_dim, float eps,
                                              float weight_offset) {
  head_rms_norm(x, stride, weight, rows, heads, head_dim, eps, weight_offset);
}
