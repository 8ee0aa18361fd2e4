// The GEMVs' last step (dense_gemv.cu, wq_gemv.cu): a block's WARPS warps each hold mma
// accumulators for the block's 16 weight rows and NT n8 tiles of activation rows over their
// slice of the row length; they are summed in shared memory and stored, rounded once.
#pragma once
#include "common.cuh"
#include "mma.cuh"
#include "gated.cuh"

namespace gemv {

// Where a GEMV's activation words come from (its X parameter). The GEMVs load raw words early
// (dense: a step ahead; wq: before the step's dequantization) and turn them into x's words
// (`word`) only where the mma consumes them, so the loads' latency still hides behind that work.
//  * PlainX: x itself, rows of `cols` values.
//  * GatedX<Op>: x = act(gate) * up of the MLP, computed from the gate|up projection's
//    output, whose rows hold gate (cols values) then up (cols values): the down projection
//    reads that buffer directly and the activation kernel (activation.cu) is not launched.
//    gated.cuh's math, so the product is bit-identical to the two-kernel path's.
//    Each block recomputes the activations of every column it reads (ceil(rows / 16) blocks
//    each), f32 math the plain GEMV does not have: by default only the dense GEMV takes it
//    (FERRITE_FUSE_ACT in services/gpu/src/layer.rs).
struct PlainX {
  static constexpr bool GATED = false;
  static constexpr int WIDTH = 1;  // x's row: WIDTH * cols values
  template <typename T>
  __device__ __forceinline__ static u32 word(u32 x, u32) {
    return x;
  }
};

template <typename Op>
struct GatedX {
  static constexpr bool GATED = true;
  static constexpr int WIDTH = 2;
  template <typename T>
  __device__ __forceinline__ static u32 word(u32 gate, u32 up) {
    return gated_word<Op, T>(gate, up);
  }
};

// The weight stream both GEMVs share. A block owns 16 weight rows; its WARPS warps take the
// row length's steps of 16 rows x 64 bytes (four 16-byte units) in turn (warp w: steps w,
// w + WARPS, ...: the block sweeps its rows front to back together), each copying its steps
// global -> shared through a ring of STAGES with cp.async (STAGES - 1 in flight). Rows are
// padded to 80 bytes so the 8 row addresses of each ldmatrix fall in distinct 16-byte bank
// groups (80 * r mod 128 is a permutation of 16 * r).
constexpr int WARPS = 8;
constexpr int STAGES = 4;
constexpr int ROW_BYTES = 80;
constexpr int STAGE_BYTES = 16 * ROW_BYTES;

// One warp's share of the stream: `ring` its stages (in the kernel's static shared memory),
// `a`/`b` lane (gid, tig)'s rows gid and gid + 8, `units` 16-byte units a row.
struct Stream {
  u8 (*ring)[STAGE_BYTES];
  const u8 *a, *b;
  int units, warp, gid, tig, steps;  // steps: this warp's

  __device__ __forceinline__ Stream(u8 (*r)[STAGE_BYTES], const u8* row_a, const u8* row_b,
                                    int n_units)
      : ring(r), a(row_a), b(row_b), units(n_units) {
    const int lane = threadIdx.x & 31, all = (n_units + 3) >> 2;
    warp = threadIdx.x >> 5, gid = lane >> 2, tig = lane & 3;
    steps = warp < all ? (all - 1 - warp) / WARPS + 1 : 0;
  }
  // The first unit of this warp's step k.
  __device__ __forceinline__ int unit0(int k) const { return 4 * (warp + k * WARPS); }
  // Queues step k's copy (lane tig copies unit tig of rows gid and gid + 8) and commits a
  // group, empty past the warp's steps so the waits count alike.
  __device__ __forceinline__ void issue(int k) const {
    if (k < steps) {
      const int u = unit0(k) + tig;
      if (u < units) {
        u8* st = ring[k % STAGES];
        cp_async16(st + gid * ROW_BYTES + tig * 16, a + u * 16);
        cp_async16(st + (gid + 8) * ROW_BYTES + tig * 16, b + u * 16);
      }
    }
    cp_async_commit();
  }
  __device__ __forceinline__ const u8* stage(int k) const { return ring[k % STAGES]; }
};

// Lane's address offset in a stage for ldmatrix.x4 at a unit pair (2p, 2p+1): lane gives row
// (q&1)*8 + lane%8 of unit 2p + (q>>1), q = lane/8, and gets a[0] = row gid / unit 2p,
// a[1] = row gid+8 / 2p, a[2] = gid / 2p+1, a[3] = gid+8 / 2p+1. Add 32 for units (2, 3).
__device__ __forceinline__ int ld_offset() {
  const int lane = threadIdx.x & 31, lq = lane >> 3;
  return ((lq & 1) * 8 + (lane & 7)) * ROW_BYTES + (lq >> 1) * 16;
}

}  // namespace gemv

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
