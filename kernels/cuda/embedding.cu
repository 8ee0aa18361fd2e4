// Token embedding lookup: out[t, :] = table[ids[t], :] * scale.
//
// `scale` is Gemma's sqrt(hidden) (1.0 for other models); the product is formed in f32 and
// rounded once, so a scale of 1.0 copies the row bit for bit.
#include "common.cuh"

template <typename T>
__device__ __forceinline__ void embedding(T* out, const T* table, const i32* ids, i32 n_tokens,
                                          i32 hidden, float scale) {
  // Rows start 16-byte aligned only when both bases are and a row is a whole number of
  // 8-element vectors.
  const bool vec = (hidden & 7) == 0 && is_aligned16(out) && is_aligned16(table);
  const i32 step = blockDim.x * gridDim.x;
  for (i32 t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const T* src = table + (i64)ids[t] * hidden;
    T* dst = out + (i64)t * hidden;
    if (vec) {
      for (i32 c = blockIdx.x * blockDim.x + threadIdx.x; c < hidden / 8; c += step) {
        float f[8];
        load_vec8(src + 8 * c, f);
#pragma unroll
        for (int j = 0; j < 8; ++j) f[j] *= scale;
        store_vec8(dst + 8 * c, f);
      }
    } else {
      for (i32 i = blockIdx.x * blockDim.x + threadIdx.x; i < hidden; i += step)
        dst[i] = from_f32<T>(to_f32(src[i]) * scale);
    }
  }
}

// Launch: grid (gx, gy) with any gx >= 1 and 1 <= gy <= 65535 (both loops are grid-strided;
// natural choice gx = ceil(hidden / (8 * 256)), gy = min(n_tokens, 65535)); block 256 (any
// size up to 1024); no dynamic shared memory.
// out: [n_tokens, hidden] contiguous; table: [vocab, hidden] contiguous; ids: [n_tokens], each
// in [0, vocab) (checked by the host; not checked here).
extern "C" __global__ void __launch_bounds__(1024)
    embedding_f16(f16* out, const f16* table, const i32* ids, i32 n_tokens, i32 hidden,
                  float scale) {
  embedding(out, table, ids, n_tokens, hidden, scale);
}

// As embedding_f16.
extern "C" __global__ void __launch_bounds__(1024)
    embedding_bf16(bf16* out, const bf16* table, const i32* ids, i32 n_tokens, i32 hidden,
                   float scale) {
  embedding(out, table, ids, n_tokens, hidden, scale);
}

// The step's input ids that the step before it drew on the device (async scheduling's chained
// launch, see the engine's overlap module): ids[pairs[2i]] = drawn[pairs[2i + 1]] for i < n.
// A draw outside [0, vocab) (a row with no distribution: every logit NaN) becomes token 0, so
// the embedding above never reads outside its table; that sequence's request fails when its
// draw is read on the host, and what this step computes for it is dropped.
// Launch: one block of up to 1024 threads, grid-strided; no shared memory.
extern "C" __global__ void __launch_bounds__(1024)
    carry_ids(i32* ids, const i32* drawn, const i32* pairs, i32 n, i32 vocab) {
  for (i32 i = threadIdx.x; i < n; i += blockDim.x) {
    const i32 d = drawn[pairs[2 * i + 1]];
    ids[pairs[2 * i]] = d >= 0 && d < vocab ? d : 0;
  }
}
