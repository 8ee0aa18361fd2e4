// Weight-only quantized matrix times a few activation rows (decode: m = 1..8), and the
// dequantization to a dense matrix that prefill hands to cuBLAS.
//
// Layout (ferrite's, see kernels/src/wq/mod.rs): codes row-major over output rows, row r holds
// `cols` codes packed little-end first (code j at bit (j*bits)%8 of byte j*bits/8); scales
// [rows][groups] as T; zeros [rows][groups] as u8, or none (symmetric: zero = 2^(bits-1));
// w = scale * (q - zero); groups of `group_size` along a row, the last one may be shorter.
//
// GEMV design. At m <= 8 the weights dominate the traffic, so the kernel is built to stream them
// at HBM speed while the arithmetic stays off the critical path:
//  * Tensor cores do the multiply: a warp owns 16 weight rows (mma M), the activation rows are
//    mma N (8, padded; rows >= m are never read and their outputs dropped), so the cost is the
//    same for m = 1 and m = 8. CUDA-core f32 FMAs would need m FMAs per weight and become the
//    bottleneck well before m = 8 on 4- and 2-bit weights.
//  * Codes are copied global -> shared with 16-byte cp.async (no registers held while in flight;
//    3 steps of 1 KiB per warp in flight) and read back with ldmatrix, which hands lane
//    (gid, tig) word tig of each 16-byte unit of rows gid and gid+8: exactly an A fragment
//    whose four k-slots per lane are that word's codes. The mma's k order is free as long as A
//    and B agree, so each lane loads the x values of its own word's columns (8-32 contiguous
//    bytes) straight from global memory (x stays hot in L1/L2; it is far too large for shared
//    memory at cols = 28672, m = 8).
//  * Dequantization is exact and cheap: codes are OR'ed into the mantissa of a magic 16-bit
//    float (1024 for f16, 128 for bf16) by one lop3, and one packed fma subtracts
//    (magic + zero), giving q - zero exactly in T. The group scale is applied in f32 to the
//    mma result of each group, so nothing is rounded before the final store.
//  * Each mma's 16 k-slots come from one 16-byte unit of each row, which lies in one group when
//    group_size is a multiple of 32 (2-bit units span 64 codes: with 32-code groups each unit is
//    split in two masked mmas).
//  * The _silu/_gelu entries (compiled as their own module, WQ_GEMV_GATED) read the MLP's
//    gate|up buffer as x and compute act(gate) * up per unit, after the unit's dequantization
//    that its loads overlap (gemv.cuh's GatedX): the down projection without the activation
//    kernel in front of it.
#include "common.cuh"
#include "mma.cuh"
#include "gemv.cuh"
#include "wq_common.cuh"

namespace wq {

using gemv::STAGE_BYTES;
using gemv::STAGES;
using gemv::WARPS;

template <int BITS>
__device__ __forceinline__ void load_x(const u8* p, bool valid, u32 (&xw)[32 / BITS / 2]) {
  constexpr int XW = 32 / BITS / 2;
#pragma unroll
  for (int i = 0; i < XW; ++i) xw[i] = 0;
  if (!valid) return;
  if constexpr (XW == 2) {
    const uint2 v = ldg_v2(p);
    xw[0] = v.x;
    xw[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < XW; i += 4) {
      const uint4 v = ldg_v4(p + 4 * i);
      xw[i] = v.x;
      xw[i + 1] = v.y;
      xw[i + 2] = v.z;
      xw[i + 3] = v.w;
    }
  }
}

// NT n8 tiles of activation rows: m <= 8 * NT. X: where the activation words come from
// (gemv.cuh: PlainX, GatedX).
template <typename T, int BITS, int NT, typename X = gemv::PlainX>
__device__ __forceinline__ void gemv(T* __restrict__ out, const T* __restrict__ x,
                                     const u8* __restrict__ codes, const T* __restrict__ scales,
                                     const u8* __restrict__ zeros, const T* __restrict__ mins,
                                     int m, int rows, int cols, int group_size) {
  constexpr int CPU = 128 / BITS;  // codes per 16-byte unit
  constexpr int CPW = 32 / BITS;   // codes per 32-bit word: x values per lane per unit
  constexpr int NP = CPW / 2;      // code pairs per word
  constexpr int NMMA = CPW / 4;    // mmas per unit
  // 2-bit units cover 64 columns: with groups that are not a multiple of 64 a unit may hold
  // two groups, lanes tig 0-1 in the first and 2-3 in the second.
  const bool split = BITS == 2 && (group_size & 63) != 0;

  __shared__ __align__(128) u8 ring[WARPS][STAGES][STAGE_BYTES];
  __shared__ __align__(16) float red[WARPS][128 * NT];

  const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int row0 = blockIdx.x * 16;
  const int row_bytes = cols / (8 / BITS);
  const int units = row_bytes >> 4;
  const int groups = (cols + group_size - 1) / group_size;
  // Rows past the end re-read the last row; their results are dropped.
  const int ra = min(row0 + gid, rows - 1), rb = min(row0 + gid + 8, rows - 1);
  const u8* code_a = codes + (i64)ra * row_bytes;
  const u8* code_b = codes + (i64)rb * row_bytes;
  const T* scale_a = scales + (i64)ra * groups;
  const T* scale_b = scales + (i64)rb * groups;
  const u8* zero_a = zeros ? zeros + (i64)ra * groups : nullptr;
  const u8* zero_b = zeros ? zeros + (i64)rb * groups : nullptr;
  const T* min_a = mins ? mins + (i64)ra * groups : nullptr;
  const T* min_b = mins ? mins + (i64)rb * groups : nullptr;
  // The minimums' term, min[r][g] * sum_{k in g} x[n][k], takes the group sums of x from one
  // more mma per x fragment with an A of ones (exact f32 sums of the stored values).
  const u32 ones[4] = {Magic<T>::one2, Magic<T>::one2, Magic<T>::one2, Magic<T>::one2};
  // Tile nt's B column gid is activation row gid + 8 * nt; x's rows are X::WIDTH * cols long
  // (gate then up for GatedX, up `up_bytes` after gate).
  const u8* xrow = reinterpret_cast<const u8*>(x + (i64)gid * X::WIDTH * cols);
  const i64 x_tile = (i64)8 * X::WIDTH * cols * sizeof(T);
  const i64 up_bytes = (i64)cols * sizeof(T);

  const gemv::Stream cs(ring[threadIdx.x >> 5], code_a, code_b, units);
#pragma unroll
  for (int k = 0; k < STAGES - 1; ++k) cs.issue(k);
  const int ld_off = gemv::ld_offset();
  const int quad = lane & ~3;
  const u32 sym = zero_addend<T, BITS>(1u << (BITS - 1));

  float acc[NT][4] = {};
  for (int k = 0; k < cs.steps; ++k) {
    cp_async_wait<STAGES - 2>();
    __syncwarp();
    cs.issue(k + STAGES - 1);  // into the stage read in iteration k-1 (all lanes are past it)
    const int ub = cs.unit0(k);
    const u8* st = cs.stage(k);
    u32 a[8];
    {
      u32 r[4];
      ldmatrix_x4(r, st + ld_off);
      a[0] = r[0], a[1] = r[1], a[2] = r[2], a[3] = r[3];
      ldmatrix_x4(r, st + ld_off + 32);
      a[4] = r[0], a[5] = r[1], a[6] = r[2], a[7] = r[3];
    }
    // x values of every unit of the step, issued before the dequantization they overlap.
    // GatedX: gate's words in xw, up's in xu, combined per unit below.
    u32 xw[NT][4][NP], xu[NT][4][NP];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int u = min(ub + i, units - 1);
        const u8* xp = xrow + nt * x_tile + 2 * (u * CPU + tig * CPW);
        const bool valid = gid + 8 * nt < m && ub + i < units;
        load_x<BITS>(xp, valid, xw[nt][i]);
        if constexpr (X::GATED) load_x<BITS>(xp + up_bytes, valid, xu[nt][i]);
      }

    // Scales and zeros: lane tig fetches those of unit ub+tig (its own word's group, and for
    // split 2-bit units both halves'); unit i's are then shuffled from lane tig = i. When the
    // whole step lies in one group every lane already holds them.
    const int last = min(ub + 3, units - 1);
    const bool uniform = (ub * CPU) / group_size == (last * CPU + CPU - 1) / group_size;
    const int own = min(ub + tig, units - 1);
    const int g_lo = own * CPU / group_size;
    const int g_hi = split ? (own * CPU + 32) / group_size : g_lo;
    const float sa_lo = to_f32(scale_a[g_lo]), sb_lo = to_f32(scale_b[g_lo]);
    const float sa_hi = to_f32(scale_a[g_hi]), sb_hi = to_f32(scale_b[g_hi]);
    u32 za_lo = sym, zb_lo = sym, za_hi = sym, zb_hi = sym;
    if (zero_a) {
      za_lo = zero_addend<T, BITS>(zero_a[g_lo]);
      zb_lo = zero_addend<T, BITS>(zero_b[g_lo]);
      za_hi = zero_addend<T, BITS>(zero_a[g_hi]);
      zb_hi = zero_addend<T, BITS>(zero_b[g_hi]);
    }
    float ma_lo = 0.f, mb_lo = 0.f, ma_hi = 0.f, mb_hi = 0.f;
    if (min_a) {
      ma_lo = to_f32(min_a[g_lo]), mb_lo = to_f32(min_b[g_lo]);
      ma_hi = to_f32(min_a[g_hi]), mb_hi = to_f32(min_b[g_hi]);
    }

    // tmp: the step's (or unit's) products before their scale; xs: its group sums of x.
    float tmp[NT][4] = {}, xs[NT][4] = {};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      if (ub + i >= units) break;  // warp-uniform
      float s_a = sa_lo, s_b = sb_lo, h_a = sa_hi, h_b = sb_hi;
      float m_a = ma_lo, m_b = mb_lo, n_a = ma_hi, n_b = mb_hi;
      u32 z_a = za_lo, z_b = zb_lo;
      if (!uniform) {
        const int src = quad | i;
        s_a = shfl_f32(sa_lo, src);
        s_b = shfl_f32(sb_lo, src);
        m_a = shfl_f32(ma_lo, src);
        m_b = shfl_f32(mb_lo, src);
        z_a = shfl_u32(za_lo, src);
        z_b = shfl_u32(zb_lo, src);
        if (split) {
          h_a = shfl_f32(sa_hi, src);
          h_b = shfl_f32(sb_hi, src);
          n_a = shfl_f32(ma_hi, src);
          n_b = shfl_f32(mb_hi, src);
          const u32 y_a = shfl_u32(za_hi, src), y_b = shfl_u32(zb_hi, src);
          if (tig >= 2) z_a = y_a, z_b = y_b;
        }
      } else if (split && tig >= 2) {
        z_a = za_hi, z_b = zb_hi;
      }
      u32 pa[NP], pb[NP];
      dequant_word<T, BITS>(a[2 * i], z_a, pa);
      dequant_word<T, BITS>(a[2 * i + 1], z_b, pb);
      if constexpr (X::GATED) {
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int p = 0; p < NP; ++p)
            xw[nt][i][p] = X::template word<T>(xw[nt][i][p], xu[nt][i][p]);
      }
      if (!split) {
#pragma unroll
        for (int j = 0; j < NMMA; ++j) {
          const u32 af[4] = {pa[2 * j], pb[2 * j], pa[2 * j + 1], pb[2 * j + 1]};
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            u32 bf[2];
            x_pair<BITS>(xw[nt][i], j, bf);
            mma16816<T>(tmp[nt], af, bf);
            if (min_a) mma16816<T>(xs[nt], ones, bf);  // warp-uniform
          }
        }
        if (!uniform) {
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            acc[nt][0] += s_a * tmp[nt][0] + m_a * xs[nt][0];
            acc[nt][1] += s_a * tmp[nt][1] + m_a * xs[nt][1];
            acc[nt][2] += s_b * tmp[nt][2] + m_b * xs[nt][2];
            acc[nt][3] += s_b * tmp[nt][3] + m_b * xs[nt][3];
#pragma unroll
            for (int c = 0; c < 4; ++c) tmp[nt][c] = xs[nt][c] = 0.f;
          }
        }
      } else {
        // Same A twice; B masked to the lanes of each half.
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          float lo[4] = {0.f, 0.f, 0.f, 0.f}, hi[4] = {0.f, 0.f, 0.f, 0.f};
          float xl[4] = {0.f, 0.f, 0.f, 0.f}, xh[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int j = 0; j < NMMA; ++j) {
            const u32 af[4] = {pa[2 * j], pb[2 * j], pa[2 * j + 1], pb[2 * j + 1]};
            u32 bf[2];
            x_pair<BITS>(xw[nt][i], j, bf);
            const u32 bl[2] = {tig < 2 ? bf[0] : 0u, tig < 2 ? bf[1] : 0u};
            const u32 bh[2] = {tig < 2 ? 0u : bf[0], tig < 2 ? 0u : bf[1]};
            mma16816<T>(lo, af, bl);
            mma16816<T>(hi, af, bh);
            if (min_a) {  // warp-uniform
              mma16816<T>(xl, ones, bl);
              mma16816<T>(xh, ones, bh);
            }
          }
          acc[nt][0] += s_a * lo[0] + h_a * hi[0] + m_a * xl[0] + n_a * xh[0];
          acc[nt][1] += s_a * lo[1] + h_a * hi[1] + m_a * xl[1] + n_a * xh[1];
          acc[nt][2] += s_b * lo[2] + h_b * hi[2] + m_b * xl[2] + n_b * xh[2];
          acc[nt][3] += s_b * lo[3] + h_b * hi[3] + m_b * xl[3] + n_b * xh[3];
        }
      }
    }
    if (uniform && !split) {
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        acc[nt][0] += sa_lo * tmp[nt][0] + ma_lo * xs[nt][0];
        acc[nt][1] += sa_lo * tmp[nt][1] + ma_lo * xs[nt][1];
        acc[nt][2] += sb_lo * tmp[nt][2] + mb_lo * xs[nt][2];
        acc[nt][3] += sb_lo * tmp[nt][3] + mb_lo * xs[nt][3];
      }
    }
  }
  cp_async_wait<0>();

  gemv_store<WARPS, NT>(red, acc, out, rows, row0, rows, m);
}

// Dense w[r][c] = scale * (q - zero), one thread per 16-byte unit of codes.
template <typename T, int BITS>
__device__ __forceinline__ void dequant(T* __restrict__ w, const u8* __restrict__ codes,
                                        const T* __restrict__ scales, const u8* __restrict__ zeros,
                                        int rows, int cols, int group_size) {
  constexpr int CPU = 128 / BITS;
  const int units = cols / CPU;
  const i64 idx = (i64)blockIdx.x * blockDim.x + threadIdx.x;
  if (idx >= (i64)rows * units) return;
  const int r = (int)(idx / units), u = (int)(idx % units);
  const int groups = (cols + group_size - 1) / group_size;
  const uint4 v = ldg_v4(codes + idx * 16);
  const u32 words[4] = {v.x, v.y, v.z, v.w};
  T* dst = w + (i64)r * cols + u * CPU;
  // 8 codes at a time -> one 16-byte store; 8 consecutive codes always share a group.
#pragma unroll
  for (int c8 = 0; c8 < CPU / 8; ++c8) {
    const int g = (u * CPU + c8 * 8) / group_size;
    const float s = to_f32(scales[(i64)r * groups + g]);
    const float z = zeros ? (float)zeros[(i64)r * groups + g] : (float)(1 << (BITS - 1));
    float f[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int bit = (c8 * 8 + j) * BITS;
      const u32 q = (words[bit >> 5] >> (bit & 31)) & ((1u << BITS) - 1);
      f[j] = s * ((float)q - z);
    }
    uint4 o;
    o.x = pack2<T>(f[0], f[1]);
    o.y = pack2<T>(f[2], f[3]);
    o.z = pack2<T>(f[4], f[5]);
    o.w = pack2<T>(f[6], f[7]);
    *reinterpret_cast<uint4*>(dst + c8 * 8) = o;
  }
}

}  // namespace wq

// This file is two modules: the plain GEMVs and the dequantizer, and (WQ_GEMV_GATED) the
// GEMVs reading the gate|up buffer, so neither compiles the other's kernels at start-up.
#ifndef WQ_GEMV_GATED
// wq_gemv{,16}_b{8,4,2}_{f16,bf16}(T* out, const T* x, const u8* codes, const T* scales,
//                                 const u8* zeros, const T* mins, i32 m, i32 rows, i32 cols,
//                                 i32 group_size)
//   out[n][r] = sum_c x[n][c] * (scale[r][c/gs] * (q[r][c] - zero[r][c/gs]) + min[r][c/gs]);
//   out stride rows, x stride cols. zeros == nullptr: symmetric, zero = 2^(bits-1).
//   mins [rows][groups] (GGUF Q4_1/Q4_K/Q5_K repacked, wq_mins.cu), or nullptr: none.
//   grid  = (ceil(rows / 16), 1, 1); block = (256, 1, 1); dynamic shared memory = 0
//           (static: 44 KiB; 48 KiB for gemv16).
//   Constraints: 1 <= m <= 8, or m <= 16 for wq_gemv16 (its second n8 tile of activation rows
//   shares every A fragment: the codes are read and dequantized once for both, so 16 rows
//   cost about what 1 does); rows >= 1;
//   cols * bits / 8 a multiple of 16 (cols % 16 == 0 for 8-bit, % 32 for 4-bit, % 64 for
//   2-bit); group_size a multiple of 32, or group_size == cols (per-channel); x and codes
//   16-byte aligned.
//   Why this grid fills an H100: a block owns 16 rows and its 8 warps split the row length, each
//   keeping 3 KiB of codes in flight through cp.async. rows = 2048 gives 128 blocks, one per SM
//   on 128 of the 132 SMs with ~24 KiB in flight each (~3 MiB in total, above the ~2.5 MiB that
//   3 TB/s x ~0.8 us of latency needs). At 4096 rows (256 blocks, ~2 per SM) all blocks are
//   resident at once (registers allow 2 per SM at 2-bit, 3 at 4-bit, 4 at 8-bit; shared memory
//   5); larger matrices keep 2-4 blocks on every SM until the last ones drain, and since one
//   block alone sustains ~30 GB/s (24 KiB / 0.8 us), the SMs stay saturated until < ~100 remain.
#define WQ_GEMV(bits, name, T)                                                                  \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      wq_gemv_b##bits##_##name(T* out, const T* x, const u8* codes, const T* scales,            \
                               const u8* zeros, const T* mins, i32 m, i32 rows, i32 cols,       \
                               i32 group_size) {                                                \
    wq::gemv<T, bits, 1>(out, x, codes, scales, zeros, mins, m, rows, cols, group_size);        \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      wq_gemv16_b##bits##_##name(T* out, const T* x, const u8* codes, const T* scales,          \
                                 const u8* zeros, const T* mins, i32 m, i32 rows, i32 cols,     \
                                 i32 group_size) {                                              \
    wq::gemv<T, bits, 2>(out, x, codes, scales, zeros, mins, m, rows, cols, group_size);        \
  }
WQ_GEMV(8, f16, f16)
WQ_GEMV(8, bf16, bf16)
WQ_GEMV(4, f16, f16)
WQ_GEMV(4, bf16, bf16)
WQ_GEMV(2, f16, f16)
WQ_GEMV(2, bf16, bf16)

// wq_dequant_b{8,4,2}_{f16,bf16}(T* w, const u8* codes, const T* scales, const u8* zeros,
//                                i32 rows, i32 cols, i32 group_size)
//   w[r][c] (dense, row stride cols) = scale * (q - zero), rounded once to T.
//   grid  = (ceil(rows * cols * bits / 128 / 256), 1, 1)  (one thread per 16 code bytes);
//   block = (256, 1, 1); dynamic shared memory = 0.
//   Constraints: as wq_gemv (row bytes a multiple of 16; group_size a multiple of 32 or == cols,
//   so 8 consecutive codes never straddle a group); w and codes 16-byte aligned.
#define WQ_DEQUANT(bits, name, T)                                                               \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      wq_dequant_b##bits##_##name(T* w, const u8* codes, const T* scales, const u8* zeros,      \
                                  i32 rows, i32 cols, i32 group_size) {                          \
    wq::dequant<T, bits>(w, codes, scales, zeros, rows, cols, group_size);                      \
  }
WQ_DEQUANT(8, f16, f16)
WQ_DEQUANT(8, bf16, bf16)
WQ_DEQUANT(4, f16, f16)
WQ_DEQUANT(4, bf16, bf16)
WQ_DEQUANT(2, f16, f16)
WQ_DEQUANT(2, bf16, bf16)

#else  // WQ_GEMV_GATED

// wq_gemv{,16}_{silu,gelu}_b{8,4,2}_{f16,bf16}(T* out, const T* gate_up, const u8* codes,
//                                             const T* scales, const u8* zeros, const T* mins,
//                                             i32 m, i32 rows, i32 cols, i32 group_size)
//   As wq_gemv with x[n][c] = act(gate_up[n][c]) * gate_up[n][cols + c] (SiLU, or GELU with
//   the tanh approximation), each rounded to T as activation.cu stores it: the MLP's down
//   projection (cols = d_ff) reading the gate|up projection's output, rows 2 * cols apart
//   (contiguous). Constraints, grid and block as wq_gemv; gate_up 16-byte aligned.
#define WQ_GEMV_GATED_ENTRIES(act, Op, bits, name, T)                                           \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      wq_gemv_##act##_b##bits##_##name(T* out, const T* gate_up, const u8* codes,               \
                                       const T* scales, const u8* zeros, const T* mins, i32 m,  \
                                       i32 rows, i32 cols, i32 group_size) {                    \
    wq::gemv<T, bits, 1, gemv::GatedX<Op>>(out, gate_up, codes, scales, zeros, mins, m, rows,  \
                                           cols, group_size);                                   \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      wq_gemv16_##act##_b##bits##_##name(T* out, const T* gate_up, const u8* codes,             \
                                         const T* scales, const u8* zeros, const T* mins,       \
                                         i32 m, i32 rows, i32 cols, i32 group_size) {           \
    wq::gemv<T, bits, 2, gemv::GatedX<Op>>(out, gate_up, codes, scales, zeros, mins, m, rows,  \
                                           cols, group_size);                                   \
  }
#define WQ_GEMV_GATED_ALL(act, Op)                                                              \
  WQ_GEMV_GATED_ENTRIES(act, Op, 8, f16, f16)                                                   \
  WQ_GEMV_GATED_ENTRIES(act, Op, 8, bf16, bf16)                                                 \
  WQ_GEMV_GATED_ENTRIES(act, Op, 4, f16, f16)                                                   \
  WQ_GEMV_GATED_ENTRIES(act, Op, 4, bf16, bf16)                                                 \
  WQ_GEMV_GATED_ENTRIES(act, Op, 2, f16, f16)                                                   \
  WQ_GEMV_GATED_ENTRIES(act, Op, 2, bf16, bf16)
WQ_GEMV_GATED_ALL(silu, SiluOp)
WQ_GEMV_GATED_ALL(gelu, GeluTanhOp)

#endif  // WQ_GEMV_GATED
