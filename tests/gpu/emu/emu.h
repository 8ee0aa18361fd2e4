// A CPU emulation of the CUDA execution model, enough to run ferrite's kernels (kernels/cuda/)
// on a machine without a GPU: every CUDA thread of a block is a host thread, blocks run one
// after another, and the warp-wide instructions (shuffles, ldmatrix, mma.sync) exchange their
// operands through a per-warp slot between two warp barriers, so each lane computes exactly
// the values the PTX ISA defines for its fragment. It checks a kernel's indexing and
// arithmetic (fragment layouts, tiling, reductions, tails), not its timing or its memory
// ordering under concurrency: blocks never overlap here, and cp.async copies at once.
//
// prepare.py copies the kernel sources with their few inline-PTX conversions replaced by the
// emu_* functions below, and with this file standing in for mma.cuh (the PTX wrappers).
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

// ---- CUDA C keywords and built-in types.
#define __device__
#define __global__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#define __align__(n) __attribute__((aligned(n)))

struct dim3 {
  unsigned x = 1, y = 1, z = 1;
};
struct uint4 {
  unsigned x, y, z, w;
};
struct uint2 {
  unsigned x, y;
};
struct float4 {
  float x, y, z, w;
};
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }

inline thread_local dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// CUDA's min/max take mixed integer types; std's do not.
template <class A, class B>
inline std::common_type_t<A, B> min(A a, B b) {
  return a < b ? a : b;
}
template <class A, class B>
inline std::common_type_t<A, B> max(A a, B b) {
  return a < b ? b : a;
}

inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __expf(float x) { return std::exp(x); }
// Rounded toward zero: the top 24 significant bits, then an exact conversion.
inline float __ull2float_rz(unsigned long long v) {
  if (v == 0) return 0.0f;
  const int shift = 64 - __builtin_clzll(v) - 24;
  if (shift > 0) v = (v >> shift) << shift;
  return (float)v;
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }

// ---- 16-bit conversions (the PTX cvt instructions: round to nearest even).
inline float emu_f16_to_f32(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, 2);
  return (float)h;
}
inline uint16_t emu_f32_to_f16(float f) {
  _Float16 h = (_Float16)f;
  uint16_t b;
  std::memcpy(&b, &h, 2);
  return b;
}
inline uint16_t emu_f32_to_bf16(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1);
  return (uint16_t)(u >> 16);
}

// ---- The block being run: its barriers and the warps' exchange slots.
struct EmuWarp {
  std::barrier<> bar{32};
  uint64_t slot[32][8];
};
struct EmuBlock {
  std::unique_ptr<std::barrier<>> bar;
  std::vector<std::unique_ptr<EmuWarp>> warps;
};
inline EmuBlock* emu_block = nullptr;

inline int emu_lane() { return threadIdx.x & 31; }
inline EmuWarp& emu_warp() { return *emu_block->warps[threadIdx.x >> 5]; }

inline void __syncthreads() { emu_block->bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_warp().bar.arrive_and_wait(); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }

inline unsigned atomicAdd(unsigned* p, unsigned v) {
  return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}

// Every lane puts `n` words in its slot; after the barrier `f` reads any lane's; a second
// barrier frees the slots for the next exchange.
template <class F>
inline void emu_exchange(const uint64_t* mine, int n, F f) {
  EmuWarp& w = emu_warp();
  std::memcpy(w.slot[emu_lane()], mine, 8 * n);
  w.bar.arrive_and_wait();
  f(w.slot);
  w.bar.arrive_and_wait();
}

template <class V>
inline V emu_shfl(V v, int src) {
  static_assert(sizeof(V) == 4, "32-bit shuffles");
  uint64_t mine = 0;
  std::memcpy(&mine, &v, 4);
  V r;
  emu_exchange(&mine, 1, [&](uint64_t (*s)[8]) { std::memcpy(&r, &s[src & 31][0], 4); });
  return r;
}
template <class V>
inline V __shfl_sync(unsigned, V v, int src, int = 32) {
  return emu_shfl(v, src);
}
template <class V>
inline V __shfl_xor_sync(unsigned, V v, int mask, int = 32) {
  return emu_shfl(v, emu_lane() ^ mask);
}

// Runs `kernel` over `grid` blocks of `block` threads, blocks one after another.
inline void emu_launch(dim3 grid, unsigned block, const std::function<void()>& kernel) {
  gridDim = grid;
  blockDim = dim3{block, 1, 1};
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        EmuBlock b;
        b.bar = std::make_unique<std::barrier<>>(block);
        for (unsigned w = 0; w < block / 32; ++w) b.warps.push_back(std::make_unique<EmuWarp>());
        emu_block = &b;
        std::vector<std::thread> threads;
        for (unsigned t = 0; t < block; ++t)
          threads.emplace_back([&, t] {
            threadIdx = dim3{t, 0, 0};
            blockIdx = dim3{x, y, z};
            kernel();
            // An exited thread no longer holds up the barriers (as on Volta and later).
            b.warps[t >> 5]->bar.arrive_and_drop();
            b.bar->arrive_and_drop();
          });
        for (auto& th : threads) th.join();
        emu_block = nullptr;
      }
}

// The dynamic shared memory of the launch (PTX %dynamic_smem_size), for kernels that check it.
inline unsigned emu_dynamic_smem = 0;
