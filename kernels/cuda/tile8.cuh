// The warp tile of the 8-bit GEMMs (w8a8.cu: int8, fp8.cu: e4m3), both mma.sync m16n8k32: a
// warp owns 16 weight rows (mma M) and TOK tiles of 8 tokens (mma N) of `[rows][k]` byte
// matrices (weights) and `[tokens][k]` ones (activations), k a multiple of 64.
//
// Lane (gid, tig) reads bytes [16·tig, 16·tig + 16) of each 64-byte chunk of weight rows gid
// and gid + 8 and of token row gid of each tile. An mma's k order is free as long as A and B
// agree: words 0 and 1 of those vectors are the lane's k-words tig and tig + 4 of the chunk's
// first mma, words 2 and 3 of its second, for every row and token alike. Rows and tokens past
// the ends read as zeros and are never stored.
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

  // This warp's tile of `w` [n][k] and `x` [m][k]; `false` when it holds no weight row (the
  // whole warp returns: no mma is left half-issued).
  __device__ __forceinline__ bool init(const u8* w, const u8* x, i32 m, i32 n, i32 k) {
    const int lane = threadIdx.x & 31;
    gid = lane >> 2;
    tig = lane & 3;
    row0 = (blockIdx.x * WARPS + (threadIdx.x >> 5)) * 16;
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

  // acc[t] += the products of the 64-byte chunk at `kc`, through `mma(acc[t], a, b)`.
  template <typename Acc, typename Mma>
  __device__ __forceinline__ void chunk(i32 kc, Acc (&acc)[TOK][4], Mma mma) const {
    const uint4 a = load16(pa + kc, va), b = load16(pb + kc, vb);
    const u32 a_first[4] = {a.x, b.x, a.y, b.y};
    const u32 a_second[4] = {a.z, b.z, a.w, b.w};
#pragma unroll
    for (int t = 0; t < TOK; ++t) {
      const uint4 x = load16(px[t] + kc, vx[t]);
      const u32 x_first[2] = {x.x, x.y};
      const u32 x_second[2] = {x.z, x.w};
      mma(acc[t], a_first, x_first);
      mma(acc[t], a_second, x_second);
    }
  }

  // Accumulator j of tile t: weight row gid + 8·(j / 2), token 2·tig + j % 2 of the tile.
  __device__ __forceinline__ i32 row(int j) const { return row0 + gid + 8 * (j >> 1); }
  __device__ __forceinline__ i32 tok(int t, int j) const {
    return tok0 + 8 * t + 2 * tig + (j & 1);
  }
};

}  // namespace tile8
