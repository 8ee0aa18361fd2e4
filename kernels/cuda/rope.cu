// Rotary position embeddings, in place on the Q and K rows of a batch of tokens.
//
// Matches Rope::apply (kernels/src/cpu/rope.rs): for pair i < rope_dim/2,
//   angle = ((float)pos * position_scale) * inv_freq[i]   (two f32 roundings, in this order)
//   cos = cosf(angle) * scale, sin = sinf(angle) * scale  (YaRN's and LongRoPE's attention
//                                                          factor; 1 elsewhere, exact)
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

// Where a token's rotated K row and its V row go when the launch also writes the KV cache
// (k == nullptr: it does not). Layout as kv_cache.cu's: [slots][kv_heads][head_dim].
template <typename T>
struct CacheDest {
  T* k;
  T* v;
  const T* v_src;
  i32 v_stride;
  const i32* slots;
};

// Token t's K row (rotated, at k_row) and V row into slot `slot` of the cache: 16-byte copies
// where every row is aligned, element copies otherwise. Bits as they are.
template <typename T>
__device__ __forceinline__ void cache_token(const CacheDest<T>& c, const T* k_row, i32 t, i32 row) {
  const i32 slot = c.slots[t];
  if (slot < 0) return;  // padding
  const T* v_row = c.v_src + (i64)t * c.v_stride;
  T* kd = c.k + (i64)slot * row;
  T* vd = c.v + (i64)slot * row;
  if ((row & 7) == 0 && is_aligned16(k_row) && is_aligned16(v_row) && is_aligned16(kd) &&
      is_aligned16(vd)) {
    for (i32 i = threadIdx.x; i < row / 8; i += blockDim.x) {
      reinterpret_cast<uint4*>(kd)[i] = reinterpret_cast<const uint4*>(k_row)[i];
      reinterpret_cast<uint4*>(vd)[i] = reinterpret_cast<const uint4*>(v_row)[i];
    }
  } else {
    for (i32 i = threadIdx.x; i < row; i += blockDim.x) kd[i] = k_row[i], vd[i] = v_row[i];
  }
}

template <typename T>
__device__ __forceinline__ void rope(T* q, i32 q_stride, T* k, i32 k_stride,
                                     const i32* positions, const float* inv_freq, i32 n_tokens,
                                     i32 n_heads, i32 n_kv_heads, i32 head_dim, i32 rope_dim,
                                     float position_scale, float scale, i32 adjacent,
                                     CacheDest<T> cache) {
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
      float s, c;
      sincosf(angle, &s, &c);
      sin_t[i] = __fmul_rn(s, scale);
      cos_t[i] = __fmul_rn(c, scale);
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
    if (cache.k) {
      __syncthreads();  // every pair of the token's K rotated
      cache_token(cache, k + (i64)t * k_stride, t, n_kv_heads * head_dim);
    }
  }
}

// Launch: grid any gx >= 1 (grid-strided over tokens; natural gx = n_tokens), block any
// multiple of 32 up to 1024 (256 is a good default), no dynamic shared memory.
// q: n_tokens rows at stride q_stride, each holding n_heads heads of head_dim; k likewise with
// n_kv_heads heads at stride k_stride (k may be null when n_kv_heads == 0). Q and K may be
// column ranges of one fused QKV buffer but must not overlap each other.
// positions: [n_tokens] >= 0. inv_freq: [rope_dim / 2]. scale multiplies cos and sin. rope_dim
// even, rope_dim <= head_dim, rope_dim <= 1024; 0 rotates nothing (a layer without rotary
// embeddings: with k_cache the launch only writes the cache). adjacent: 0 = pairs
// (i, i + rope_dim/2), else (2i, 2i+1).
// Elements at index >= rope_dim within each head are left as they are.
// With k_cache non-null the launch also writes the KV cache, as kv_write_* does: each token's
// rotated K row and its V row (v, rows v_stride apart) into slot slots[t] of k_cache /
// v_cache ([num_slots][n_kv_heads][head_dim]; slot < 0: padding, nothing written; two tokens
// never share a slot). One launch instead of two for a layer's step.
#define ROPE(T)                                                                                 \
  extern "C" __global__ void __launch_bounds__(1024) rope_##T(                                  \
      T* q, i32 q_stride, T* k, i32 k_stride, const i32* positions, const float* inv_freq,       \
      i32 n_tokens, i32 n_heads, i32 n_kv_heads, i32 head_dim, i32 rope_dim,                     \
      float position_scale, float scale, i32 adjacent, T* k_cache, T* v_cache, const T* v,       \
      i32 v_stride, const i32* slots) {                                                         \
    rope(q, q_stride, k, k_stride, positions, inv_freq, n_tokens, n_heads, n_kv_heads,         \
         head_dim, rope_dim, position_scale, scale, adjacent,                                   \
         CacheDest<T>{k_cache, v_cache, v, v_stride, slots});                                   \
  }
ROPE(f16)
ROPE(bf16)
