// Weight-only quantized matrix times 9-256 activation rows on tensor cores (batched decode and
// short prefills): out[m, rows] = x[m, cols] . W^T with W dequantized in registers, so the codes
// are read from HBM once per block row however many activation rows there are.
//
// Layout: ferrite's, as wq_gemv.cu (kernels/src/wq/mod.rs): codes row-major over output rows,
// packed little-end first; scales [rows][groups] as T; zeros [rows][groups] as u8 or none
// (symmetric: zero = 2^(bits-1)); w = scale * (q - zero); groups of group_size along a row.
//
// Design, and why:
//  * Weight rows are the mma M (16 per m16 tile), activation rows the mma N (8 per n8 tile), as
//    in the GEMV: the codes go through ldmatrix straight into A fragments (wq_common.cuh), so
//    the packed layout is read as stored, with no offline reordering of the checkpoint.
//  * A block is 8 warps over BM weight rows x BN activation rows: WM warps along the rows (16
//    each) times WK = 8 / WM warps along K, each warp owning all BN activation rows (NT = BN/8
//    n8 tiles). Every A fragment dequantized feeds NT mmas, every B fragment one; warps that
//    split K are summed once at the end through shared memory. Three tiles, picked by the
//    launcher from m (the GEMV takes m <= 8):
//      n16: BN 16, BM 32 (WK 4)  m <= 16   decode: memory-bound, so many small blocks (128 at
//                                          4096 rows) keep every SM streaming codes; the
//                                          price is activation reads from L2 of 2x the code
//                                          bytes at 4-bit (as the GEMV's at m = 8);
//      n32: BN 32, BM 64 (WK 2)  m <= 32   still memory-bound; BM 64 halves the activation
//                                          traffic per code byte;
//      n64: BN 64, BM 64 (WK 2)  m > 32    tiled over m by the grid: each A fragment feeds 8
//                                          mmas, which keeps the dequantization off the
//                                          critical path as the work turns compute-bound.
//  * A stage is 2 16-byte code units per row per K-warp (one ldmatrix.x4 per warp) and the
//    activations of the same columns; both go global -> shared by 16-byte cp.async, STAGES deep
//    (6, 5, 4 for n16, n32, n64: ~20 KiB of codes in flight per decode block, and the shared
//    memory of the wider tiles stays under ~150 KiB). Stage slots are reused only after the
//    __syncthreads that starts the next iteration, so one barrier per stage orders everything.
//  * B fragments are read from shared memory with plain 8-32 byte loads in the k order of the
//    code words (x_pair), not ldmatrix: the codes are not reordered, so the activations are.
//    Row strides are padded so each load phase touches every bank once (see XPAD).
//  * Group scales are applied in f32 to each group's partial sums (tmp -> acc), exactly as the
//    GEMV: nothing is rounded before the one rounding at the store. Each lane prefetches one
//    (unit, half) slot of scales and zeros a stage ahead into registers and the warp shuffles
//    them when a unit starts a new group, so no load latency sits in front of the dequant.
//  * 2-bit units span 64 columns; with groups that are not a multiple of 64 a unit holds two
//    groups (lanes tig 0-1 and 2-3), and each mma runs twice with B masked to one half.
//  * Rows past `rows`, activation rows past m and units past the row end are zero-filled by
//    cp.async (no out-of-bounds reads); their results are never stored.
#include "common.cuh"
#include "mma.cuh"
#include "wq_common.cuh"

extern __shared__ __align__(16) u8 wq_mma_smem[];

namespace wq_mma {

constexpr int THREADS = 256;

// The block tile (see above). Sizes in bytes unless named otherwise.
template <int BITS, int NT_, int WM_, int STAGES_>
struct Tile {
  static constexpr int WM = WM_;         // warps along weight rows
  static constexpr int WK = 8 / WM;      // warps along K
  static constexpr int NT = NT_;         // n8 tiles per warp
  static constexpr int BM = 16 * WM;     // weight rows per block
  static constexpr int BN = 8 * NT;      // activation rows per block
  static constexpr int STAGES = STAGES_;
  static constexpr int CPU = 128 / BITS;  // codes (columns) per 16-byte unit
  static constexpr int CPW = 32 / BITS;   // codes per 32-bit word: x values per lane per unit
  static constexpr int UPS = 2 * WK;      // units per row per stage
  // Code rows padded by 16 bytes: an odd number of 16-byte units apart, so the 8 row addresses
  // of each ldmatrix phase fall in distinct bank groups.
  static constexpr int CS = UPS * 16 + 16;
  // A lane reads 2 * CPW contiguous bytes of x per unit (lds.64 at 8-bit, lds.128 at 4-bit, two
  // at 2-bit); one load phase covers 4 (8-bit) or 2 (4/2-bit) activation rows, so their row
  // stride mod 128 is 32, 64, or 16 mod 32 (2-bit: the second row fills the odd bank groups).
  static constexpr int XPAD = BITS == 8 ? 32 : BITS == 4 ? 64 : 16;
  static constexpr int XS = UPS * CPU * 2 + XPAD;
  static constexpr int XCH = UPS * CPU * 2 / 16;  // 16-byte chunks of x per row per stage
  static constexpr int STAGE = BM * CS + BN * XS;
  // The K-warps' sums: [WK][BN][BM + 4] f32, rows 4 apart mod 32 so the fragment writes of a
  // warp (gid + 8 tig) hit distinct banks. Reuses the pipeline's memory.
  static constexpr int RS = BM + 4;
  static constexpr int RED = WK * BN * RS * 4;
  static constexpr int SMEM = STAGES * STAGE > RED ? STAGES * STAGE : RED;
  static_assert(BM * UPS == THREADS, "one code chunk per thread per stage");
  static_assert((BN * XCH) % THREADS == 0, "whole x chunks per thread per stage");
};

// group(col) for groups of `size` columns: a shift for the power-of-two sizes (every format
// ferrite names) and per-channel, a division otherwise.
struct GroupOf {
  int shift, size;
  __device__ __forceinline__ GroupOf(int group_size, int cols) : size(group_size) {
    if (group_size >= cols) shift = 31;  // per-channel: every column is group 0
    else if ((group_size & (group_size - 1)) == 0) shift = __ffs(group_size) - 1;
    else shift = -1;
  }
  __device__ __forceinline__ int operator()(int col) const {
    return shift >= 0 ? col >> shift : col / size;
  }
};

// One lane's prefetched scales and zeros (raw, converted at use so the loads can stay in flight
// across a stage): rows gid and gid+8 at one (unit, half) of the warp's stage.
struct Slot {
  u32 sa, sb, za, zb;
};

template <typename T, int BITS, typename C>
__device__ __forceinline__ void gemm(T* __restrict__ out, const T* __restrict__ x,
                                     const u8* __restrict__ codes, const T* __restrict__ scales,
                                     const u8* __restrict__ zeros, int m, int rows, int cols,
                                     int group_size) {
  constexpr int CPU = C::CPU, CPW = C::CPW, NT = C::NT, UPS = C::UPS, STAGES = C::STAGES;
  constexpr int NP = CPW / 2;    // code pairs per word
  constexpr int NMMA = CPW / 4;  // mmas per unit per n8 tile
  constexpr int XW = CPW / 2;    // x words per lane per unit
  u8* const smem = wq_mma_smem;
  if (wq::dynamic_smem_bytes() < (u32)C::SMEM) __trap();  // the launcher's size disagrees

  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
  const int wm = warp % C::WM, wk = warp / C::WM;
  const int n0 = blockIdx.x * C::BN, row0 = blockIdx.y * C::BM;
  const int row_bytes = cols / (8 / BITS);
  const int units = row_bytes >> 4;
  const int n_stages = (units + UPS - 1) / UPS;
  const int groups = (cols + group_size - 1) / group_size;
  const GroupOf group_of(group_size, cols);
  const bool split = BITS == 2 && (group_size & 63) != 0;

  // Copies stage k into slot k % STAGES (nothing past the last stage); always one commit group.
  auto issue = [&](int k) {
    if (k < n_stages) {
      u8* st = smem + (k % STAGES) * C::STAGE;
      {
        const int r = threadIdx.x / UPS, u = threadIdx.x % UPS, ug = k * UPS + u;
        const bool ok = row0 + r < rows && ug < units;
        const u8* src = ok ? codes + (i64)(row0 + r) * row_bytes + ug * 16 : codes;
        cp_async16_zfill(st + r * C::CS + u * 16, src, ok);
      }
      u8* xs = st + C::BM * C::CS;
#pragma unroll
      for (int c = threadIdx.x; c < C::BN * C::XCH; c += THREADS) {
        const int n = c / C::XCH, ch = c % C::XCH, col = k * UPS * CPU + ch * 8;
        const bool ok = n0 + n < m && col < cols;
        const T* src = ok ? x + (i64)(n0 + n) * cols + col : x;
        cp_async16_zfill(xs + n * C::XS + ch * 16, src, ok);
      }
    }
    cp_async_commit();
  };

  // Rows past the end read the last row's scales; their results are dropped.
  const int ra = min(row0 + wm * 16 + gid, rows - 1), rb = min(row0 + wm * 16 + gid + 8, rows - 1);
  const T* scale_a = scales + (i64)ra * groups;
  const T* scale_b = scales + (i64)rb * groups;
  const u8* zero_a = zeros ? zeros + (i64)ra * groups : nullptr;
  const u8* zero_b = zeros ? zeros + (i64)rb * groups : nullptr;
  const u32 sym = 1u << (BITS - 1);
  // Lane tig's slot of stage k: unit 2 wk + (tig & 1) of the stage, half tig >> 1 of it (the
  // halves differ only for split 2-bit units).
  auto load_slot = [&](int k) {
    const int ug = min(k * UPS + 2 * wk + (tig & 1), units - 1);
    const int g = group_of(ug * CPU + (tig >> 1) * (CPU / 2));
    Slot s;
    s.sa = scale_a[g].bits;
    s.sb = scale_b[g].bits;
    s.za = zero_a ? zero_a[g] : sym;
    s.zb = zero_b ? zero_b[g] : sym;
    return s;
  };

#pragma unroll
  for (int k = 0; k < STAGES - 1; ++k) issue(k);
  Slot next = load_slot(0);

  // ldmatrix.x4 of the warp's two units: lane gives row (q&1)*8 + lane%8 of unit q>>1 and gets
  // a[0] = row gid / unit 0, a[1] = row gid+8 / unit 0, a[2] = gid / unit 1, a[3] = gid+8.
  const int lq = lane >> 3;
  const int ld_off = (wm * 16 + (lq & 1) * 8 + (lane & 7)) * C::CS + (2 * wk + (lq >> 1)) * 16;
  // The lane's x bytes of unit 0 of its warp: activation row gid, the columns of word tig.
  const int x_off = C::BM * C::CS + gid * C::XS + (2 * wk * CPU + tig * CPW) * 2;
  const int quad = lane & ~3;

  float acc[NT][4], tmp[NT][4];
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) acc[j][c] = tmp[j][c] = 0.f;
  // The group tmp is summing (-1: none yet) and its scales.
  int cur_g = -1;
  float cur_sa = 0.f, cur_sb = 0.f;
  u32 cur_za = 0, cur_zb = 0;
  auto flush = [&]() {
#pragma unroll
    for (int j = 0; j < NT; ++j) {
      acc[j][0] += cur_sa * tmp[j][0], acc[j][1] += cur_sa * tmp[j][1];
      acc[j][2] += cur_sb * tmp[j][2], acc[j][3] += cur_sb * tmp[j][3];
      tmp[j][0] = tmp[j][1] = tmp[j][2] = tmp[j][3] = 0.f;
    }
  };

  for (int k = 0; k < n_stages; ++k) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();        // stage k landed for every thread; every warp is done with k - 1
    issue(k + STAGES - 1);  // into the slot of stage k - 1
    const Slot slot = next;
    if (k + 1 < n_stages) next = load_slot(k + 1);
    const int ug0 = k * UPS + 2 * wk;
    if (ug0 >= units) continue;  // warp-uniform: this warp's part of the last stage is empty
    const u8* st = smem + (k % STAGES) * C::STAGE;
    u32 a[4];
    ldmatrix_x4(a, st + ld_off);

#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int ug = ug0 + i;
      if (ug >= units) break;  // warp-uniform
      u32 za, zb;
      float lo_a = 0.f, lo_b = 0.f, hi_a = 0.f, hi_b = 0.f;
      if (!split) {
        const int g = group_of(ug * CPU);
        if (g != cur_g) {
          if (cur_g >= 0) flush();
          cur_g = g;
          cur_sa = to_f32(from_bits<T>((u16)wq::shfl_u32(slot.sa, quad | i)));
          cur_sb = to_f32(from_bits<T>((u16)wq::shfl_u32(slot.sb, quad | i)));
          cur_za = wq::zero_addend<T, BITS>(wq::shfl_u32(slot.za, quad | i));
          cur_zb = wq::zero_addend<T, BITS>(wq::shfl_u32(slot.zb, quad | i));
        }
        za = cur_za, zb = cur_zb;
      } else {
        // Both halves' scales; the zero point of the lane's own half.
        lo_a = to_f32(from_bits<T>((u16)wq::shfl_u32(slot.sa, quad | i)));
        lo_b = to_f32(from_bits<T>((u16)wq::shfl_u32(slot.sb, quad | i)));
        hi_a = to_f32(from_bits<T>((u16)wq::shfl_u32(slot.sa, quad | i | 2)));
        hi_b = to_f32(from_bits<T>((u16)wq::shfl_u32(slot.sb, quad | i | 2)));
        za = wq::zero_addend<T, BITS>(wq::shfl_u32(slot.za, quad | i | (tig & 2)));
        zb = wq::zero_addend<T, BITS>(wq::shfl_u32(slot.zb, quad | i | (tig & 2)));
      }
      u32 pa[NP], pb[NP];
      wq::dequant_word<T, BITS>(a[2 * i], za, pa);
      wq::dequant_word<T, BITS>(a[2 * i + 1], zb, pb);
      const u8* xp = st + x_off + i * CPU * 2;

#pragma unroll
      for (int j = 0; j < NT; ++j) {
        u32 xw[XW];
        const u8* p = xp + j * 8 * C::XS;
        if constexpr (XW == 2) {
          const uint2 v = *reinterpret_cast<const uint2*>(p);
          xw[0] = v.x, xw[1] = v.y;
        } else {
#pragma unroll
          for (int q = 0; q < XW; q += 4) {
            const uint4 v = *reinterpret_cast<const uint4*>(p + 4 * q);
            xw[q] = v.x, xw[q + 1] = v.y, xw[q + 2] = v.z, xw[q + 3] = v.w;
          }
        }
        if (!split) {
#pragma unroll
          for (int mi = 0; mi < NMMA; ++mi) {
            const u32 af[4] = {pa[2 * mi], pb[2 * mi], pa[2 * mi + 1], pb[2 * mi + 1]};
            u32 bf[2];
            wq::x_pair<BITS>(xw, mi, bf);
            mma16816<T>(tmp[j], af, bf);
          }
        } else {
          // Same A twice; B masked to the lanes of each half. tmp is free here (no carry).
          float hi[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
          for (int mi = 0; mi < NMMA; ++mi) {
            const u32 af[4] = {pa[2 * mi], pb[2 * mi], pa[2 * mi + 1], pb[2 * mi + 1]};
            u32 bf[2];
            wq::x_pair<BITS>(xw, mi, bf);
            const u32 bl[2] = {tig < 2 ? bf[0] : 0u, tig < 2 ? bf[1] : 0u};
            const u32 bh[2] = {tig < 2 ? 0u : bf[0], tig < 2 ? 0u : bf[1]};
            mma16816<T>(tmp[j], af, bl);
            mma16816<T>(hi, af, bh);
          }
          acc[j][0] += lo_a * tmp[j][0] + hi_a * hi[0];
          acc[j][1] += lo_a * tmp[j][1] + hi_a * hi[1];
          acc[j][2] += lo_b * tmp[j][2] + hi_b * hi[2];
          acc[j][3] += lo_b * tmp[j][3] + hi_b * hi[3];
          tmp[j][0] = tmp[j][1] = tmp[j][2] = tmp[j][3] = 0.f;
        }
      }
    }
  }
  if (cur_g >= 0) flush();
  cp_async_wait<0>();  // only empty groups remain; the pipeline's memory is reused below
  __syncthreads();

  // Sum the K-warps. Fragment entry c of n8 tile j is weight row gid + 8 (c >> 1) of the warp's
  // 16 and activation row 8 j + 2 tig + (c & 1).
  float* red = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int j = 0; j < NT; ++j)
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int n = 8 * j + 2 * tig + (c & 1), r = wm * 16 + gid + 8 * (c >> 1);
      red[(wk * C::BN + n) * C::RS + r] = acc[j][c];
    }
  __syncthreads();
  // Consecutive threads take consecutive weight rows of one activation row: coalesced stores.
  for (int e = threadIdx.x; e < C::BN * C::BM; e += THREADS) {
    const int n = e / C::BM, r = e % C::BM;
    float s = 0.f;
#pragma unroll
    for (int w = 0; w < C::WK; ++w) s += red[(w * C::BN + n) * C::RS + r];
    if (n0 + n < m && row0 + r < rows) out[(i64)(n0 + n) * rows + row0 + r] = from_f32<T>(s);
  }
}

template <int BITS>
using N16 = Tile<BITS, 2, 2, 6>;
template <int BITS>
using N32 = Tile<BITS, 4, 4, 5>;
template <int BITS>
using N64 = Tile<BITS, 8, 4, 4>;

}  // namespace wq_mma

// wq_mma_b{8,4,2}_{f16,bf16}_n{16,32,64}(T* out, const T* x, const u8* codes, const T* scales,
//                                        const u8* zeros, i32 m, i32 rows, i32 cols,
//                                        i32 group_size)
//   out[n][r] = sum_c x[n][c] * scale[r][c/gs] * (q[r][c] - zero[r][c/gs]); out stride rows,
//   x stride cols. zeros == nullptr: symmetric, zero = 2^(bits-1).
//   Tile nBN (BN activation rows x BM weight rows per block; BM = 32 for n16, 64 otherwise):
//   grid  = (ceil(m / BN), ceil(rows / BM), 1): x over activation tiles, so the blocks that
//           share a block row's codes run together and find them in L2; y <= 65535.
//   block = (256, 1, 1).
//   dynamic shared memory = STAGES * (BM * CS + BN * XS) bytes (Tile::SMEM; over 48 KiB, so the
//           launcher opts in), checked on entry (a mismatch traps):
//                 8-bit     4-bit     2-bit
//           n16   55296     82944    127488
//           n32   51200     76800    110080
//           n64   61440    102400    155648
//   Constraints: m >= 1 (any m: the grid tiles it); rows >= 1; cols * bits / 8 a multiple of
//   16; group_size a multiple of 32, or == cols (per-channel); x, out and codes 16-byte
//   aligned (x rows are then too: cols is a multiple of 16).
#define WQ_MMA(bits, name, T, tile, Tile)                                                       \
  extern "C" __global__ void __launch_bounds__(256)                                             \
      wq_mma_b##bits##_##name##_##tile(T* out, const T* x, const u8* codes, const T* scales,    \
                                       const u8* zeros, i32 m, i32 rows, i32 cols,              \
                                       i32 group_size) {                                        \
    wq_mma::gemm<T, bits, wq_mma::Tile<bits>>(out, x, codes, scales, zeros, m, rows, cols,      \
                                              group_size);                                      \
  }
#define WQ_MMA_TILES(bits, name, T) \
  WQ_MMA(bits, name, T, n16, N16)   \
  WQ_MMA(bits, name, T, n32, N32)   \
  WQ_MMA(bits, name, T, n64, N64)
// This file is compiled once per code width (WQ_MMA_BITS: 8, 4 or 2; see
// kernels/src/cuda/sources.rs), each an NVRTC program of its own, so the three compile in
// parallel at start-up.
#ifndef WQ_MMA_BITS
#error "define WQ_MMA_BITS (8, 4 or 2): wq_mma.cu is compiled once per code width"
#endif
WQ_MMA_TILES(WQ_MMA_BITS, f16, f16)
WQ_MMA_TILES(WQ_MMA_BITS, bf16, bf16)
