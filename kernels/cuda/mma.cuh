// Tensor-core and bit-twiddling helpers (inline PTX, sm_80+): mma.sync m16n8k16 (16-bit
// floats) and m16n8k32 (int8), ldmatrix,
// cp.async, prmt/lop3 and packed 16-bit arithmetic. Every piece of PTX the kernels use lives
// here, so the kernels themselves are plain CUDA C.
//
// Fragment layout of mma.m16n8k16 (lane = 4 * gid + tig):
//   A (16x16, row-major) a[0]: (gid, 2tig..2tig+1)    a[1]: (gid+8, 2tig..)
//                        a[2]: (gid, 2tig+8..+9)     a[3]: (gid+8, 2tig+8..+9)
//   B (16x8, "col")      b[0]: (k = 2tig..2tig+1, n = gid)   b[1]: (k = 2tig+8..+9, n = gid)
//   C/D (16x8, f32)      d[0..1]: (gid, 2tig..2tig+1)        d[2..3]: (gid+8, 2tig..)
// Each 32-bit register holds two 16-bit values, the lower index in the low half.
#pragma once
#include "common.cuh"

__device__ __forceinline__ u32 smem_addr(const void* p) {
  return (u32)__cvta_generic_to_shared(p);
}

// ---- cp.async (global -> shared, bypassing registers; 16 bytes, both addresses 16-aligned).

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem)
               : "memory");
}

// Writes 16 zero bytes instead of copying when `!valid` (gmem is then not read).
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)),
               "l"(gmem), "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

// ---- ldmatrix: lanes 8i..8i+7 give the row addresses (16 bytes each) of matrix i.

__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p))
               : "memory");
}

// ---- mma.sync m16n8k16, f32 accumulators: d += a * b.

template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]);

template <>
__device__ __forceinline__ void mma16816<f16>(float (&d)[4], const u32 (&a)[4],
                                               const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
__device__ __forceinline__ void mma16816<bf16>(float (&d)[4], const u32 (&a)[4],
                                                const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- mma.sync m16n8k32 on signed bytes, i32 accumulators: d += a * b. Each 32-bit register
// holds four int8 values along k; word layout as m16n8k16's with a word of 4 bytes in place of
// a pair of halves: a[0] (gid, word tig), a[1] (gid+8, tig), a[2] (gid, tig+4), a[3] (gid+8,
// tig+4); b[0] (word tig, n = gid), b[1] (tig+4, gid); d as m16n8k16's.

__device__ __forceinline__ void mma16832_s8(i32 (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// ---- mma.sync m16n8k32 on e4m3 bytes, f32 accumulators (sm_89+; a trap elsewhere, where
// the FP8 kernels are never chosen): fragments as mma16832_s8's.

__device__ __forceinline__ void mma16832_e4m3(float (&d)[4], const u32 (&a)[4],
                                              const u32 (&b)[2]) {
#if __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

// {lo, hi} rounded to e4m3 (nearest even, saturating to ±448) and packed, lo in the low byte.
__device__ __forceinline__ u16 e4m3x2(float lo, float hi) {
#if __CUDA_ARCH__ >= 890
  u16 r;
  asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
  return r;
#else
  __trap();
  return 0;
#endif
}

// ---- Bit manipulation.

// Byte permute: result byte i = byte sel[4i..4i+3] of {b:a} (a = bytes 0-3, b = bytes 4-7).
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  u32 r;
  asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(sel));
  return r;
}

// (a & b) | c in one instruction.
__device__ __forceinline__ u32 and_or(u32 a, u32 b, u32 c) {
  u32 r;
  asm("lop3.b32 %0, %1, %2, %3, 0xEA;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// ---- Packed pairs of 16-bit floats.

// a * b + c on both halves (exact when the result is representable).
template <typename T>
__device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c);

template <>
__device__ __forceinline__ u32 fma2<f16>(u32 a, u32 b, u32 c) {
  u32 r;
  asm("fma.rn.f16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

template <>
__device__ __forceinline__ u32 fma2<bf16>(u32 a, u32 b, u32 c) {
  u32 r;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;\n" : "=r"(r) : "r"(a), "r"(b), "r"(c));
  return r;
}

// {lo, hi} rounded to T and packed (lo in the low half).
template <typename T>
__device__ __forceinline__ u32 pack2(float lo, float hi);

template <>
__device__ __forceinline__ u32 pack2<f16>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

template <>
__device__ __forceinline__ u32 pack2<bf16>(float lo, float hi) {
  u32 r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}

// The low / high half of a packed pair as f32.
template <typename T>
__device__ __forceinline__ float lo_f32(u32 v) {
  return to_f32(T{(u16)(v & 0xffffu)});
}

template <typename T>
__device__ __forceinline__ float hi_f32(u32 v) {
  return to_f32(T{(u16)(v >> 16)});
}

// ---- Global loads through the read-only path.

__device__ __forceinline__ uint4 ldg_v4(const void* p) {
  uint4 r;
  asm("ld.global.nc.v4.u32 {%0,%1,%2,%3}, [%4];\n"
      : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
      : "l"(p));
  return r;
}

__device__ __forceinline__ uint2 ldg_v2(const void* p) {
  uint2 r;
  asm("ld.global.nc.v2.u32 {%0,%1}, [%2];\n" : "=r"(r.x), "=r"(r.y) : "l"(p));
  return r;
}

__device__ __forceinline__ u32 ldg_u32(const void* p) {
  u32 r;
  asm("ld.global.nc.u32 %0, [%1];\n" : "=r"(r) : "l"(p));
  return r;
}

// A float another block of this launch wrote (after a __threadfence), read through L2: L1 is
// not coherent between SMs, so a plain load might see a stale line.
__device__ __forceinline__ float ldcg_f32(const float* p) {
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];\n" : "=f"(v) : "l"(p) : "memory");
  return v;
}
