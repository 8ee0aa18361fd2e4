// Device helpers shared by the weight-only quantized kernels (wq_gemv.cu, wq_mma.cu): the exact
// dequantization of packed codes into mma A fragments, and the matching order of activations
// in B fragments.
//
// Both kernels load codes with ldmatrix, which hands lane (gid, tig) 32-bit word tig of each
// 16-byte unit of rows gid and gid+8. The mma's k order is free as long as A and B agree, so
// the A fragment's four k-slots per lane are that word's codes, in the pair order
// dequant_word produces, and the B fragment holds the activations of the same columns, put in
// that order by x_pair.
#pragma once
#include "common.cuh"
#include "mma.cuh"

namespace wq {

// 16-bit pattern of the magic float whose mantissa lsb is worth 1.
template <typename T>
struct Magic;
template <>
struct Magic<f16> {
  static constexpr u32 bits = 0x6400u;  // 1024
  static constexpr u32 one2 = 0x3c003c00u;
};
template <>
struct Magic<bf16> {
  static constexpr u32 bits = 0x4300u;  // 128
  static constexpr u32 one2 = 0x3f803f80u;
};

// The addend that turns (magic + q) into q - z: -(magic + z) in both halves. For 8-bit codes in
// bf16 (whose 7 mantissa bits cannot hold them) it is the f32 -(2^23 + z) instead.
template <typename T, int BITS>
__device__ __forceinline__ u32 zero_addend(u32 z) {
  if (BITS == 8 && Magic<T>::bits == Magic<bf16>::bits) return 0xcb000000u | z;
  return (Magic<T>::bits | 0x8000u | z) * 0x10001u;
}

// The dynamic shared memory this launch was given (PTX %dynamic_smem_size), so a kernel can
// refuse a size its launcher computed differently. (The one piece of PTX outside mma.cuh,
// which the attention kernels share.)
__device__ __forceinline__ u32 dynamic_smem_bytes() {
  u32 r;
  asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(r));
  return r;
}

__device__ __forceinline__ u32 shfl_u32(u32 v, int src) { return __shfl_sync(0xffffffffu, v, src); }
__device__ __forceinline__ float shfl_f32(float v, int src) {
  return __shfl_sync(0xffffffffu, v, src);
}

// A fragments of one 16-byte unit: word `w` of rows gid and gid+8 (lane tig's k-slots), as
// pairs of (q - z) in T. pairs[2j], pairs[2j+1] feed mma j (k-slot pairs 2tig.. and 2tig+8..).
// 8-bit: pairs (c0,c1), (c2,c3). 4/2-bit: pair s = (c_s, c_{s+CPW/2}) from bits s*BITS of each
// half-word, so the matching x pairs come from words j and j+CPW/4 of the lane's x values.
template <typename T, int BITS>
__device__ __forceinline__ void dequant_word(u32 w, u32 zadd, u32 (&pairs)[32 / BITS / 2]) {
  constexpr int CPW = 32 / BITS;
  if constexpr (BITS == 8) {
    if constexpr (Magic<T>::bits == 0x6400u) {
      pairs[0] = fma2<T>(prmt(w, 0x64646464u, 0x4140u), Magic<T>::one2, zadd);
      pairs[1] = fma2<T>(prmt(w, 0x64646464u, 0x4342u), Magic<T>::one2, zadd);
    } else {
      // bf16: byte -> f32 2^23 + q, exact subtraction in f32, exact packing.
      const float za = __uint_as_float(zadd);
      float d[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) d[i] = __uint_as_float(prmt(w, 0x4b000000u, 0x7440u + i)) + za;
      pairs[0] = pack2<T>(d[0], d[1]);
      pairs[1] = pack2<T>(d[2], d[3]);
    }
  } else {
    constexpr u32 mask = ((1u << BITS) - 1) * 0x10001u;
#pragma unroll
    for (int s = 0; s < CPW / 2; ++s)
      pairs[s] = fma2<T>(and_or(w >> (BITS * s), mask, Magic<T>::bits * 0x10001u),
                         Magic<T>::one2, zadd);
  }
}

// B fragment for mma j from the lane's x words (CPW values, 2 per word), matching dequant_word.
template <int BITS>
__device__ __forceinline__ void x_pair(const u32 (&xw)[32 / BITS / 2], int j, u32 (&b)[2]) {
  constexpr int XW = 32 / BITS / 2;
  if constexpr (BITS == 8) {
    b[0] = xw[0];
    b[1] = xw[1];
  } else {
    b[0] = prmt(xw[j], xw[j + XW / 2], 0x5410u);
    b[1] = prmt(xw[j], xw[j + XW / 2], 0x7632u);
  }
}

}  // namespace wq
