// Writes a batch's new keys and values into one layer's paged KV cache.
//
// Layout as the CPU's PagedKv (kernels/src/cpu/attention.rs): K and V are each
// [num_slots][kv_heads][head_dim], slot = physical_block * block_size + offset_in_block, so a
// token's whole K row (all its KV heads) is contiguous in the cache. The host resolves block
// tables into slots; slot < 0 marks a padding token, which writes nothing. Values are copied
// bit for bit.
#include "common.cuh"

// N = 8: 16-byte chunks; N = 1: single elements.
template <int N, typename T>
__device__ __forceinline__ void copy_rows(T* k_cache, T* v_cache, const T* k, i32 k_stride,
                                          const T* v, i32 v_stride, const i32* slots,
                                          i32 n_tokens, i32 row) {
  const i32 chunks = row / N;
  const i32 step = blockDim.x * gridDim.x;
  for (i32 t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const i32 slot = slots[t];
    if (slot < 0) continue;
    const T* ks = k + (i64)t * k_stride;
    const T* vs = v + (i64)t * v_stride;
    T* kd = k_cache + (i64)slot * row;
    T* vd = v_cache + (i64)slot * row;
    for (i32 c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += step) {
      if constexpr (N == 8) {
        reinterpret_cast<uint4*>(kd)[c] = reinterpret_cast<const uint4*>(ks)[c];
        reinterpret_cast<uint4*>(vd)[c] = reinterpret_cast<const uint4*>(vs)[c];
      } else {
        kd[c] = ks[c];
        vd[c] = vs[c];
      }
    }
  }
}

template <typename T>
__device__ __forceinline__ void kv_write(T* k_cache, T* v_cache, const T* k, i32 k_stride,
                                         const T* v, i32 v_stride, const i32* slots,
                                         i32 n_tokens, i32 kv_heads, i32 head_dim) {
  const i32 row = kv_heads * head_dim;
  const bool vec = (row & 7) == 0 && (k_stride & 7) == 0 && (v_stride & 7) == 0 &&
                   is_aligned16(k_cache) && is_aligned16(v_cache) && is_aligned16(k) &&
                   is_aligned16(v);
  if (vec)
    copy_rows<8>(k_cache, v_cache, k, k_stride, v, v_stride, slots, n_tokens, row);
  else
    copy_rows<1>(k_cache, v_cache, k, k_stride, v, v_stride, slots, n_tokens, row);
}

// Launch: grid (gx, gy) with any gx >= 1 and 1 <= gy <= 65535 (both loops are grid-strided;
// natural choice gx = ceil(kv_heads * head_dim / (8 * 256)), gy = min(n_tokens, 65535)),
// block 256 (any size up to 1024), no dynamic shared memory.
// k_cache, v_cache: this layer's [num_slots, kv_heads, head_dim]. k, v: n_tokens rows of
// kv_heads * head_dim elements at strides k_stride, v_stride (they may be column ranges of a
// fused QKV buffer). slots: [n_tokens], each < 0 (skip) or in [0, num_slots) (not checked);
// two tokens of one launch must not share a slot.
extern "C" __global__ void __launch_bounds__(1024)
    kv_write_f16(f16* k_cache, f16* v_cache, const f16* k, i32 k_stride, const f16* v, i32 v_stride,
                 const i32* slots, i32 n_tokens, i32 kv_heads, i32 head_dim) {
  kv_write(k_cache, v_cache, k, k_stride, v, v_stride, slots, n_tokens, kv_heads, head_dim);
}

// As kv_write_f16.
extern "C" __global__ void __launch_bounds__(1024)
    kv_write_bf16(bf16* k_cache, bf16* v_cache, const bf16* k, i32 k_stride, const bf16* v,
                  i32 v_stride, const i32* slots, i32 n_tokens, i32 kv_heads, i32 head_dim) {
  kv_write(k_cache, v_cache, k, k_stride, v, v_stride, slots, n_tokens, kv_heads, head_dim);
}
