// Gated activations of the MLP: out = act(gate) * up, from the fused gate|up projection.
// At decode, where the down projection runs as a GEMV, that GEMV computes them itself from the
// gate|up buffer instead (dense_gemv.cu, wq_gemv.cu) and this kernel is not launched.
//
// The activations themselves (SiluOp, GeluTanhOp) are gated.cuh's, shared with the GEMVs that
// compute them while loading the down projection's input (gemv.cuh's GatedX), so both paths
// round the same values.
#include "gated.cuh"

template <typename Op, int N, typename T>
__device__ __forceinline__ void gated_rows(T* out, const T* gate_up, i32 n_tokens, i32 d_ff) {
  const i32 chunks = d_ff / N;
  const i32 step = blockDim.x * gridDim.x;
  for (i32 t = blockIdx.y; t < n_tokens; t += gridDim.y) {
    const T* g = gate_up + (i64)t * 2 * d_ff;
    const T* u = g + d_ff;
    T* o = out + (i64)t * d_ff;
    for (i32 c = blockIdx.x * blockDim.x + threadIdx.x; c < chunks; c += step) {
      float gv[N], uv[N];
      load_elems<N>(g + c * N, gv);
      load_elems<N>(u + c * N, uv);
#pragma unroll
      for (int j = 0; j < N; ++j) gv[j] = Op::apply(gv[j], uv[j]);
      store_elems<N>(o + c * N, gv);
    }
  }
}

template <typename Op, typename T>
__device__ __forceinline__ void gated(T* out, const T* gate_up, i32 n_tokens, i32 d_ff) {
  // d_ff % 8 == 0 keeps every gate, up and out row 16-byte aligned given aligned bases.
  if ((d_ff & 7) == 0 && is_aligned16(out) && is_aligned16(gate_up))
    gated_rows<Op, 8>(out, gate_up, n_tokens, d_ff);
  else
    gated_rows<Op, 1>(out, gate_up, n_tokens, d_ff);
}

// Launch (all four kernels): grid (gx, gy) with any gx >= 1 and 1 <= gy <= 65535 (both loops
// are grid-strided; natural choice gx = ceil(d_ff / (8 * 256)), gy = min(n_tokens, 65535)),
// block 256 (any size up to 1024), no dynamic shared memory.
// gate_up: [n_tokens, 2 * d_ff] contiguous, each row [gate (d_ff) | up (d_ff)].
// out: [n_tokens, d_ff] contiguous; must not overlap gate_up.
extern "C" __global__ void __launch_bounds__(1024)
    silu_mul_f16(f16* out, const f16* gate_up, i32 n_tokens, i32 d_ff) {
  gated<SiluOp>(out, gate_up, n_tokens, d_ff);
}

extern "C" __global__ void __launch_bounds__(1024)
    silu_mul_bf16(bf16* out, const bf16* gate_up, i32 n_tokens, i32 d_ff) {
  gated<SiluOp>(out, gate_up, n_tokens, d_ff);
}

extern "C" __global__ void __launch_bounds__(1024)
    gelu_tanh_mul_f16(f16* out, const f16* gate_up, i32 n_tokens, i32 d_ff) {
  gated<GeluTanhOp>(out, gate_up, n_tokens, d_ff);
}

extern "C" __global__ void __launch_bounds__(1024)
    gelu_tanh_mul_bf16(bf16* out, const bf16* gate_up, i32 n_tokens, i32 d_ff) {
  gated<GeluTanhOp>(out, gate_up, n_tokens, d_ff);
}
