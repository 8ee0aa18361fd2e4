// Rotary position embeddings, in place on the Q and K rows of a batch of tokens.
//
// Matches Rope::apply (kernels/src/cpu/rope.rs): for pair i < rope_dim/2,
//   angle = ((float)pos * position_scale) * inv_freq[i]   (two f32 roundings, in this order)
//   x0' = x0*cos - x1*sin,  x1' = x0*sin + x1*cos
// with pairs (i, i + rope_dim/2) (HF rotate_half) or (2i, 2i+1) (adjacent). The products are
// rounded separately (__fmul_rn) so the f32 result is the CPU's bit for bit up to sincosf's
// last-ulp differences: contracting one of them into an FMA would shift results by an ulp.
// sincosf is the accurate one (full range reduction): angles reach ~1.3e5 rad at 128k
// positions, where __sinf/__cosf are useless.
#include "common.cuh"

// Largest rope_dim: the per-token cos/sin table lives in static shared memory.
#define ROPE_MAX_DIM 1024

template <typename T>
__device__ __forceinline__ void rotate(T* head, i32 a, i32 b, float c, float s) {
  const float x0 = to_f32(head[a]), x1 = to_f32(head[b]);
  head[a] = from_f32<T>(__fmul_rn(x0, c) - __fmul_rn(x1, s));
  head[b] = from_f32<T>(__fmul_rn(x0, s) + __fmul_rn(x1, c));
}

template <typename T>
__device__ __forceinline__ void rope(T* q, i32 q_stride, T* k, i32 k_stride,
                                     const i32* positions, const float* inv_freq, i32 n_tokens,
                                     i32 n_heads, i32 n_kv_heads, i32 head_dim, i32 rope_dim,
                                     float position_scale, i32 adjacent) {
  __shared__ float cos_t[ROPE_MAX_DIM / 2];
  __shared__ float sin_t[ROPE_MAX_DIM / 2];
  const i32 half = rope_dim / 2;
  const i32 q_pairs = n_heads * half;
  const i32 pairs = (n_heads + n_kv_heads) * half;
  for (i32 t = blockIdx.x; t < n_tokens; t += gridDim.x) {
    // Every head of the token shares the angles: compute them once.
    const float p = (float)positions[t] * position_scale;
    __syncthreads();  // the previous token's table is no longer read
    for (i32 i = threadIdx.x; i < half; i += blockDim.x) {
      const float angle = p * inv_freq[i];
      sincosf(angle, &sin_t[i], &cos_t[i]);
    }
    __syncthreads();
    for (i32 j = threadIdx.x; j < pairs; j += blockDim.x) {
      const bool is_q = j < q_pairs;
      const i32 jj = is_q ? j : j - q_pairs;
      const i32 h = jj / half, i = jj - h * half;
      T* head = is_q ? q + (i64)t * q_stride + (i64)h * head_dim
                     : k + (i64)t * k_stride + (i64)h * head_dim;
      const i32 a = adjacent ? 2 * i : i;
      const i32 b = adjacent ? 2 * i + 1 : i + half;
      rotate(head, a, b, cos_t[i], sin_t[i]);
    }
  }
}

// Launch: grid any gx >= 1 (grid-strided over tokens; natural gx = n_tokens), block any
// multiple of 32 up to 1024 (256 is a good default), no dynamic shared memory.
// q: n_tokens rows at stride q_stride, each holding n_heads heads of head_dim; k likewise with
// n_kv_heads heads at stride k_stride (k may be null when n_kv_heads == 0). Q and K may be
// column ranges of one fused QKV buffer but must not overlap each other.
// positions: [n_tokens] >= 0. inv_freq: [rope_dim / 2]. rope_dim even, 2 <= rope_dim <=
// head_dim, rope_dim <= 1024. adjacent: 0 = pairs (i, i + rope_dim/2), else (2i, 2i+1).
// Elements at index >= rope_dim within each head are left as they are.
extern "C" __global__ void __launch_bounds__(1024)
    rope_f16(f16* q, i32 q_stride, f16* k, i32 k_stride, const i32* positions,
             const float* inv_freq, i32 n_tokens, i32 n_heads, i32 n_kv_heads, i32 head_dim,
             i32 rope_dim, float position_scale, i32 adjacent) {
  rope(q, q_stride, k, k_stride, positions, inv_freq, n_tokens, n_heads, n_kv_heads, head_dim,
       rope_dim, position_scale, adjacent);
}

// As rope_f16.
extern "C" __global__ void __launch_bounds__(1024)
    rope_bf16(bf16* q, i32 q_stride, bf16* k, i32 k_stride, const i32* positions,
              const float* inv_freq, i32 n_tokens, i32 n_heads, i32 n_kv_heads, i32 head_dim,
              i32 rope_dim, float position_scale, i32 adjacent) {
  rope(q, q_stride, k, k_stride, positions, inv_freq, n_tokens, n_heads, n_kv_heads, head_dim,
       rope_dim, position_scale, adjacent);
}
