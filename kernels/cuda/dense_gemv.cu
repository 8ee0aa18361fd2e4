// Dense 16-bit matrix times a few activation rows (decode: m = 1..16), the projection of an
// f16/bf16 model at small batches: out[n][r] = sum_c x[n][c] * w[r][c].
//
// Why not cuBLAS here: at batch 1 cuBLAS picks a split-K GEMM and a second reduce kernel, and
// the first H100 run measured its GEMVs of the Llama-3-8B shape at 2.3-2.8 TB/s of the HBM's
// 3.35. A GEMV only has to stream the weights once at full bandwidth; the arithmetic is a few
// tensor-core instructions per KiB.
//
// Design (wq_gemv.cu's, without the dequantization):
//  * A block owns 16 weight rows (mma M); its 8 warps split the row length. The activation rows
//    are mma N: one n8 tile, or two (NT) sharing every A fragment; padded, rows >= m read as
//    zero and their outputs dropped. So m = 1 and m = 16 cost the same weight traffic.
//  * Weights are copied global -> shared with 16-byte cp.async, 3 steps of 1 KiB per warp in
//    flight, and read back with ldmatrix. ldmatrix.x4 over two 16-byte units of 16 rows hands
//    lane (gid, tig) word tig of each unit for rows gid and gid+8: the A fragment of one
//    m16n8k16 whose k-slots 0-7 are the first unit's 8 columns and 8-15 the second's.
//  * The B fragment is then x's words at the same columns: b[0] = x[gid][unit0 + 2tig..+1],
//    b[1] = x[gid][unit1 + 2tig..+1], one 4-byte load each straight from global memory (x
//    stays in L1/L2; at m = 8 and 14336 columns it is too large for shared memory), issued a
//    step ahead so their latency hides behind the current step's mma.
//  * f32 accumulation, the warps' slices summed in shared memory, one rounding on the store.
//  * The _silu/_gelu entries read the MLP's gate|up buffer as x and compute act(gate) * up
//    for each word they load (gemv.cuh's GatedX): the down projection without the activation
//    kernel in front of it.
#include "common.cuh"
#include "mma.cuh"
#include "gemv.cuh"

namespace dense {

using gemv::STAGE_BYTES;
using gemv::STAGES;
using gemv::WARPS;

// X: where the activation words come from (gemv.cuh: PlainX, GatedX).
template <typename T, typename O, int NT, typename X = gemv::PlainX>
__device__ __forceinline__ void gemv(O* __restrict__ out, const T* __restrict__ x,
                                     const T* __restrict__ w, int m, int rows, int cols,
                                     int x_stride, int out_stride) {
  __shared__ __align__(128) u8 ring[WARPS][STAGES][STAGE_BYTES];
  __shared__ __align__(16) float red[WARPS][128 * NT];

  const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int row0 = blockIdx.x * 16;
  const int units = cols >> 3;  // even: cols % 16 == 0
  // Rows past the end re-read the last row; their results are dropped.
  const u8* w_a = reinterpret_cast<const u8*>(w + (i64)min(row0 + gid, rows - 1) * cols);
  const u8* w_b = reinterpret_cast<const u8*>(w + (i64)min(row0 + gid + 8, rows - 1) * cols);
  // Tile nt's B column gid is activation row gid + 8 * nt.
  const T* x_row = x + (i64)gid * x_stride;

  const gemv::Stream ws(ring[threadIdx.x >> 5], w_a, w_b, units);
  // Lane's raw words of step k's four units, per tile (zero past the end and for padded
  // rows): x's, or gate's in xw and up's (cols further on) in xu.
  auto load_x = [&](int k, u32 (&xw)[NT][4], u32 (&xu)[NT][4]) {
    const int ub = ws.unit0(k);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const bool ok = gid + 8 * nt < m && k < ws.steps && ub + i < units;
        const T* p = x_row + (i64)8 * nt * x_stride + (ub + i) * 8 + 2 * tig;
        xw[nt][i] = ok ? ldg_u32(p) : 0u;
        xu[nt][i] = X::GATED && ok ? ldg_u32(p + cols) : 0u;
      }
  };
#pragma unroll
  for (int k = 0; k < STAGES - 1; ++k) ws.issue(k);
  const int ld_off = gemv::ld_offset();

  float acc[NT][4] = {};
  u32 xw[NT][4], xu[NT][4];
  load_x(0, xw, xu);
  for (int k = 0; k < ws.steps; ++k) {
    cp_async_wait<STAGES - 2>();
    __syncwarp();
    ws.issue(k + STAGES - 1);  // into the stage read in iteration k-1 (all lanes are past it)
    u32 next[NT][4], next_u[NT][4];
    load_x(k + 1, next, next_u);
    const int ub = ws.unit0(k);
    const u8* st = ws.stage(k);
    u32 a[4];
    ldmatrix_x4(a, st + ld_off);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const u32 b[2] = {X::template word<T>(xw[nt][0], xu[nt][0]),
                        X::template word<T>(xw[nt][1], xu[nt][1])};
      mma16816<T>(acc[nt], a, b);
    }
    // units is even, so a step holds one or two whole pairs (warp-uniform).
    if (ub + 2 < units) {
      ldmatrix_x4(a, st + ld_off + 32);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const u32 b[2] = {X::template word<T>(xw[nt][2], xu[nt][2]),
                          X::template word<T>(xw[nt][3], xu[nt][3])};
        mma16816<T>(acc[nt], a, b);
      }
    }
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) xw[nt][i] = next[nt][i], xu[nt][i] = next_u[nt][i];
  }
  cp_async_wait<0>();

  gemv_store<WARPS, NT>(red, acc, out, out_stride, row0, rows, m);
}

}  // namespace dense

// dense_gemv{,16}_{f16,bf16}[_f32out](O* out, const T* x, const T* w, i32 m, i32 rows,
//                                    i32 cols, i32 x_stride, i32 out_stride)
//   out[n][r] = sum_c x[n][c] * w[r][c] for n < m, r < rows; w row-major [rows][cols]; rows of
//   x x_stride apart, of out out_stride apart; out in T, or f32 (`_f32out`: logits).
//   grid  = (ceil(rows / 16), 1, 1); block = (256, 1, 1); dynamic shared memory = 0
//           (static: 44 KiB; 48 KiB for gemv16).
//   Constraints: 1 <= m <= 8, or m <= 16 for dense_gemv16; rows >= 1; cols a multiple of 16; w 16-byte aligned; x 4-byte
//   aligned with x_stride even.
#define DENSE_GEMV(name, T, O)                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      dense_gemv_##name(O* out, const T* x, const T* w, i32 m, i32 rows, i32 cols,              \
                        i32 x_stride, i32 out_stride) {                                         \
    dense::gemv<T, O, 1>(out, x, w, m, rows, cols, x_stride, out_stride);                       \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      dense_gemv16_##name(O* out, const T* x, const T* w, i32 m, i32 rows, i32 cols,            \
                          i32 x_stride, i32 out_stride) {                                       \
    dense::gemv<T, O, 2>(out, x, w, m, rows, cols, x_stride, out_stride);                       \
  }
DENSE_GEMV(f16, f16, f16)
DENSE_GEMV(bf16, bf16, bf16)
DENSE_GEMV(f16_f32out, f16, float)
DENSE_GEMV(bf16_f32out, bf16, float)

// dense_gemv{,16}_{silu,gelu}_{f16,bf16}(T* out, const T* gate_up, const T* w, i32 m, i32 rows,
//                                       i32 cols, i32 x_stride, i32 out_stride)
//   As dense_gemv with x[n][c] = act(gate_up[n][c]) * gate_up[n][cols + c] (SiLU, or GELU with
//   the tanh approximation), each rounded to T as activation.cu stores it: the MLP's down
//   projection (cols = d_ff) reading the gate|up projection's output. x_stride: gate_up's row
//   stride, >= 2 * cols (2 * d_ff when contiguous). Constraints, grid and block as dense_gemv.
#define DENSE_GEMV_GATED(act, Op, name, T)                                                      \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      dense_gemv_##act##_##name(T* out, const T* gate_up, const T* w, i32 m, i32 rows,         \
                                i32 cols, i32 x_stride, i32 out_stride) {                       \
    dense::gemv<T, T, 1, gemv::GatedX<Op>>(out, gate_up, w, m, rows, cols, x_stride,           \
                                           out_stride);                                         \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      dense_gemv16_##act##_##name(T* out, const T* gate_up, const T* w, i32 m, i32 rows,       \
                                  i32 cols, i32 x_stride, i32 out_stride) {                     \
    dense::gemv<T, T, 2, gemv::GatedX<Op>>(out, gate_up, w, m, rows, cols, x_stride,           \
                                           out_stride);                                         \
  }
DENSE_GEMV_GATED(silu, SiluOp, f16, f16)
DENSE_GEMV_GATED(silu, SiluOp, bf16, bf16)
DENSE_GEMV_GATED(gelu, GeluTanhOp, f16, f16)
DENSE_GEMV_GATED(gelu, GeluTanhOp, bf16, bf16)
