// The warp tile of the 8-bit GEMMs (w8a8.cu: int8, fp8.cu: e4m3), both mma.sync m16n8k32: a
// warp owns 16 weight rows (mma M) and TOK tiles of 8 tokens (mma N) of `[rows][k]` byte
// matrices (weights) and `[tokens][k]` ones (activations), k a multiple of 64.
//
// Lane (gid, tig) reads bytes [16·tig, 16·tig + 16) of each 64-byte chunk of weight rows gid
// and gid + 8 and of token row gid of each tile. An mma's k order is free as long as A and B
// agree: words 0 and 1 of those vectors are the lane's k-words tig and tig + 4 of the chunk's
// first mma, words 2 and 3 of its second, for every row and token alike. Rows and tokens past
// the ends read as zeros and are never stored.
//
// Decode (TOK = 1, up to 8 tokens) splits k instead: the block's WARPS warps share 16 weight
// rows, each takes every WARPS-th chunk, two at a time with their loads issued first, and the
// warps' sums meet in shared memory (`sum_warps`). A warp walking all of k alone waited on one
// load at a time, and a 4096-row matrix gave only 64 blocks: decode ran at a fraction of the
// bandwidth. Split, the same matrix gives 256 blocks with twice the loads in flight each.
#pragma once
#include "common.cuh"
#include "mma.cuh"

namespace tile8 {

constexpr int WARPS = 4;  // warps per block: 64 weight rows

__device__ __forceinline__ uint4 load16(const u8* p, bool valid) {
  uint4 v;
  v.x = v.y = v.z = v.w = 0;
  return valid ? ldg_v4(p) : v;
}

template <int TOK>
struct Tile {
  i32 row0, tok0;
  int gid, tig;
  bool va, vb, vx[TOK];
  const u8 *pa, *pb, *px[TOK];

  // This warp's tile of `w` [n][k] and `x` [m][k] (`split`: the block's 16 rows, shared by
  // its warps); `false` when it holds no weight row (the whole warp returns, and when split the
  // whole block: no mma is left half-issued, no barrier half-reached).
  __device__ __forceinline__ bool init(const u8* w, const u8* x, i32 m, i32 n, i32 k,
                                       bool split) {
    const int lane = threadIdx.x & 31;
    gid = lane >> 2;
    tig = lane & 3;
    row0 = (split ? blockIdx.x : blockIdx.x * WARPS + (threadIdx.x >> 5)) * 16;
    tok0 = blockIdx.y * 8 * TOK;
    if (row0 >= n) return false;
    va = row0 + gid < n;
    vb = row0 + gid + 8 < n;
    pa = w + (i64)(va ? row0 + gid : 0) * k + 16 * tig;
    pb = w + (i64)(vb ? row0 + gid + 8 : 0) * k + 16 * tig;
#pragma unroll
    for (int t = 0; t < TOK; ++t) {
      const i32 tok = tok0 + 8 * t + gid;
      vx[t] = tok < m;
      px[t] = x + (i64)(vx[t] ? tok : 0) * k + 16 * tig;
    }
    return true;
  }

  // acc += the products of one chunk's loaded vectors (rows a and b, tokens x).
  template <typename Acc, typename Mma>
  __device__ __forceinline__ static void step(Acc (&acc)[4], uint4 a, uint4 b, uint4 x, Mma mma) {
    const u32 a_first[4] = {a.x, b.x, a.y, b.y};
    const u32 a_second[4] = {a.z, b.z, a.w, b.w};
    const u32 x_first[2] = {x.x, x.y};
    const u32 x_second[2] = {x.z, x.w};
    mma(acc, a_first, x_first);
    mma(acc, a_second, x_second);
  }

  // acc[t] += the products of the 64-byte chunk at `kc`, through `mma(acc[t], a, b)`.
  template <typename Acc, typename Mma>
  __device__ __forceinline__ void chunk(i32 kc, Acc (&acc)[TOK][4], Mma mma) const {
    const uint4 a = load16(pa + kc, va), b = load16(pb + kc, vb);
#pragma unroll
    for (int t = 0; t < TOK; ++t) step(acc[t], a, b, load16(px[t] + kc, vx[t]), mma);
  }

  // Split decode (tile of the first 8 tokens): acc += this warp's chunks of [k0, k1), those
  // whose index from k0 is the warp's number modulo WARPS, two at a time, loads first.
  template <typename Acc, typename Mma>
  __device__ __forceinline__ void chunks_split(i32 k0, i32 k1, Acc (&acc)[4], Mma mma) const {
    constexpr i32 STRIDE = 64 * WARPS;
    i32 kc = k0 + 64 * (threadIdx.x >> 5);
    for (; kc + STRIDE < k1; kc += 2 * STRIDE) {
      const i32 kd = kc + STRIDE;
      const uint4 a0 = load16(pa + kc, va), b0 = load16(pb + kc, vb);
      const uint4 x0 = load16(px[0] + kc, vx[0]);
      const uint4 a1 = load16(pa + kd, va), b1 = load16(pb + kd, vb);
      const uint4 x1 = load16(px[0] + kd, vx[0]);
      step(acc, a0, b0, x0, mma);
      step(acc, a1, b1, x1, mma);
    }
    if (kc < k1) step(acc, load16(pa + kc, va), load16(pb + kc, vb), load16(px[0] + kc, vx[0]), mma);
  }

  // Accumulator j of tile t: weight row gid + 8·(j / 2), token 2·tig + j % 2 of the tile.
  __device__ __forceinline__ i32 row(int j) const { return row0 + gid + 8 * (j >> 1); }
  __device__ __forceinline__ i32 tok(int t, int j) const {
    return tok0 + 8 * t + 2 * tig + (j & 1);
  }
};

// Split decode: adds every warp's accumulators into warp 0's (lane by lane: the same rows and
// tokens); returns whether this warp holds the sums (warp 0), the others are done.
template <typename Acc>
__device__ __forceinline__ bool sum_warps(Acc (&acc)[4]) {
  __shared__ Acc part[WARPS - 1][32][4];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  if (warp > 0) {
#pragma unroll
    for (int j = 0; j < 4; ++j) part[warp - 1][lane][j] = acc[j];
  }
  __syncthreads();
  if (warp > 0) return false;
#pragma unroll
  for (int w = 0; w < WARPS - 1; ++w)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[j] += part[w][lane][j];
  return true;
}

}  // namespace tile8
