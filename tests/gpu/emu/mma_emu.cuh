// The CPU emulation's mma.cuh (prepare.py puts it in the real one's place): each PTX wrapper of
// kernels/cuda/mma.cuh as the PTX ISA defines it, the warp-wide ones through emu_exchange.
// Fragment layouts are mma.cuh's header comment's.
#pragma once
#include "common.cuh"

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  std::memcpy(smem, gmem, 16);
}
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
  if (valid)
    std::memcpy(smem, gmem, 16);
  else
    std::memset(smem, 0, 16);
}
__device__ __forceinline__ void cp_async_commit() {}
template <int N>
__device__ __forceinline__ void cp_async_wait() {}

// Lanes 8i..8i+7 give the 16-byte rows of matrix i; lane l gets 32-bit word l%4 of row l/4 of
// each matrix (trans: the pair of column l/4 at rows 2(l%4) and 2(l%4)+1).
inline void emu_ldmatrix(u32 (&r)[4], const void* p, bool trans) {
  const uint64_t mine = reinterpret_cast<uint64_t>(p);
  const int l = emu_lane();
  emu_exchange(&mine, 1, [&](uint64_t (*s)[8]) {
    for (int i = 0; i < 4; ++i) {
      if (!trans) {
        std::memcpy(&r[i], reinterpret_cast<const u8*>(s[8 * i + l / 4][0]) + 4 * (l % 4), 4);
      } else {
        u16 lo, hi;
        std::memcpy(&lo, reinterpret_cast<const u8*>(s[8 * i + 2 * (l % 4)][0]) + 2 * (l / 4), 2);
        std::memcpy(&hi, reinterpret_cast<const u8*>(s[8 * i + 2 * (l % 4) + 1][0]) + 2 * (l / 4),
                    2);
        r[i] = (u32)lo | ((u32)hi << 16);
      }
    }
  });
}
__device__ __forceinline__ void ldmatrix_x4(u32 (&r)[4], const void* p) { emu_ldmatrix(r, p, false); }
__device__ __forceinline__ void ldmatrix_x4_trans(u32 (&r)[4], const void* p) {
  emu_ldmatrix(r, p, true);
}

template <typename T>
__device__ __forceinline__ float lo_f32(u32 v) {
  return to_f32(T{(u16)(v & 0xffffu)});
}
template <typename T>
__device__ __forceinline__ float hi_f32(u32 v) {
  return to_f32(T{(u16)(v >> 16)});
}

// m16n8k16, f32 accumulators: D = A (16x16) . B (16x8) + C, summed in k order.
template <typename T>
__device__ __forceinline__ void mma16816(float (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  uint64_t mine[8] = {a[0], a[1], a[2], a[3], b[0], b[1], 0, 0};
  float out[4];
  const int l = emu_lane(), gid = l >> 2, tig = l & 3;
  // The accumulators go in too: C's element (row, n) lives in lane (row%8, n/2).
  for (int c = 0; c < 4; ++c) mine[6 + c / 2] |= (uint64_t)__float_as_uint(d[c]) << (32 * (c & 1));
  emu_exchange(mine, 8, [&](uint64_t (*s)[8]) {
    auto half = [](u32 w, int k) { return k & 1 ? hi_f32<T>(w) : lo_f32<T>(w); };
    auto A = [&](int row, int k) {
      const int lane = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8) + 2 * (k >= 8);
      return half((u32)s[lane][reg], k);
    };
    auto B = [&](int k, int n) {
      const int lane = n * 4 + (k % 8) / 2, reg = 4 + (k >= 8);
      return half((u32)s[lane][reg], k);
    };
    auto C = [&](int row, int n) {
      const int lane = (row % 8) * 4 + n / 2, c = 2 * (row >= 8) + (n & 1);
      return __uint_as_float((u32)(s[lane][6 + c / 2] >> (32 * (c & 1))));
    };
    for (int c = 0; c < 4; ++c) {
      const int row = gid + 8 * (c >> 1), n = 2 * tig + (c & 1);
      float acc = C(row, n);
      for (int k = 0; k < 16; ++k) acc += A(row, k) * B(k, n);
      out[c] = acc;
    }
  });
  for (int c = 0; c < 4; ++c) d[c] = out[c];
}

// m16n8k32 on bytes (`value` decodes one: signed int8, or e4m3), accumulators of type Acc:
// a[0] (gid, k 4tig..+3), a[1] (gid+8, ...), a[2] (gid, k 16+4tig..), a[3] (gid+8, ...);
// b[0] (k 4tig.., n gid), b[1] (k 16+4tig.., n gid).
template <typename Acc, typename V>
inline void emu_mma16832(Acc (&d)[4], const u32 (&a)[4], const u32 (&b)[2], V value) {
  uint64_t mine[8] = {a[0], a[1], a[2], a[3], b[0], b[1], 0, 0};
  for (int c = 0; c < 4; ++c) {
    u32 bitsv;
    std::memcpy(&bitsv, &d[c], 4);
    mine[6 + c / 2] |= (uint64_t)bitsv << (32 * (c & 1));
  }
  Acc out[4];
  const int l = emu_lane(), gid = l >> 2, tig = l & 3;
  emu_exchange(mine, 8, [&](uint64_t (*s)[8]) {
    auto byte = [&](u32 w, int k) { return value((u8)(w >> (8 * (k % 4)))); };
    auto A = [&](int row, int k) {
      const int lane = (row % 8) * 4 + (k % 16) / 4, reg = (row >= 8) + 2 * (k >= 16);
      return byte((u32)s[lane][reg], k);
    };
    auto B = [&](int k, int n) {
      const int lane = n * 4 + (k % 16) / 4, reg = 4 + (k >= 16);
      return byte((u32)s[lane][reg], k);
    };
    for (int c = 0; c < 4; ++c) {
      const int row = gid + 8 * (c >> 1), n = 2 * tig + (c & 1);
      const int lane = (row % 8) * 4 + n / 2, cc = 2 * (row >= 8) + (n & 1);
      const u32 init = (u32)(s[lane][6 + cc / 2] >> (32 * (cc & 1)));
      Acc acc;
      std::memcpy(&acc, &init, 4);
      for (int k = 0; k < 32; ++k) acc += A(row, k) * B(k, n);
      out[c] = acc;
    }
  });
  for (int c = 0; c < 4; ++c) d[c] = out[c];
}

// Signed int8, i32 accumulators (exact).
__device__ __forceinline__ void mma16832_s8(i32 (&d)[4], const u32 (&a)[4], const u32 (&b)[2]) {
  emu_mma16832(d, a, b, [](u8 v) { return (i32)(signed char)v; });
}

// e4m3 (OCP FP8): 1 sign, 4 exponent (bias 7), 3 mantissa bits; S.1111.111 is NaN, no inf.
inline float emu_e4m3_value(u8 b) {
  const int e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return NAN;
  const float v = e == 0 ? std::ldexp((float)m, -9) : std::ldexp(1.0f + m / 8.0f, e - 7);
  return b & 0x80 ? -v : v;
}

// cvt.rn.satfinite.e4m3: the nearest e4m3 value (ties to the even code), beyond ±448 the
// largest; NaN stays NaN. By search over the 127 finite magnitudes: slow, and obviously right.
inline u8 emu_e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const float a = std::fabs(f);
  u8 best = 0;
  for (int c = 1; c < 0x7f; ++c) {
    const float d = std::fabs(emu_e4m3_value((u8)c) - a), bd = std::fabs(emu_e4m3_value(best) - a);
    if (d < bd || (d == bd && (c & 1) == 0 && (best & 1) == 1)) best = (u8)c;
  }
  return (u8)(best | (f < 0 ? 0x80 : 0));
}

__device__ __forceinline__ u16 e4m3x2(float lo, float hi) {
  return (u16)(emu_e4m3(lo) | (emu_e4m3(hi) << 8));
}

// e4m3 bytes, f32 accumulators.
__device__ __forceinline__ void mma16832_e4m3(float (&d)[4], const u32 (&a)[4],
                                              const u32 (&b)[2]) {
  emu_mma16832(d, a, b, emu_e4m3_value);
}

// prmt.b32 (default mode): result byte i = byte (sel >> 4i) & 7 of {a, b}.
__device__ __forceinline__ u32 prmt(u32 a, u32 b, u32 sel) {
  const uint64_t bytes = (uint64_t)a | ((uint64_t)b << 32);
  u32 r = 0;
  for (int i = 0; i < 4; ++i) r |= (u32)((bytes >> (8 * ((sel >> (4 * i)) & 7))) & 0xff) << (8 * i);
  return r;
}
// lop3.b32 with 0xEA: (a & b) | c.
__device__ __forceinline__ u32 and_or(u32 a, u32 b, u32 c) { return (a & b) | c; }

template <typename T>
__device__ __forceinline__ u32 pack2(float lo, float hi) {
  return (u32)from_f32<T>(lo).bits | ((u32)from_f32<T>(hi).bits << 16);
}

// fma.rn.{f16,bf16}x2: one rounding of the exact a * b + c per half.
template <typename T>
__device__ __forceinline__ u32 fma2(u32 a, u32 b, u32 c) {
  auto one = [](float x, float y, float z) {
    const double e = (double)x * (double)y + (double)z;
    return e;
  };
  const double lo = one(lo_f32<T>(a), lo_f32<T>(b), lo_f32<T>(c));
  const double hi = one(hi_f32<T>(a), hi_f32<T>(b), hi_f32<T>(c));
  return pack2<T>((float)lo, (float)hi);
}

__device__ __forceinline__ uint4 ldg_v4(const void* p) {
  uint4 r;
  std::memcpy(&r, p, 16);
  return r;
}
__device__ __forceinline__ uint2 ldg_v2(const void* p) {
  uint2 r;
  std::memcpy(&r, p, 8);
  return r;
}
__device__ __forceinline__ u32 ldg_u32(const void* p) {
  u32 r;
  std::memcpy(&r, p, 4);
  return r;
}
__device__ __forceinline__ float ldcg_f32(const float* p) {
  float r;
  std::memcpy(&r, p, 4);
  return r;
}
