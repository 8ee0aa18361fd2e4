// Causal attention over the paged KV cache (the CPU reference is kernels/src/cpu/attention.rs).
//
// Cache of one layer: k_cache / v_cache [num_slots][kv_heads][head_dim]; position `pos` of
// sequence s lives in slot block_tables[s * max_blocks + pos / block_size] * block_size +
// pos % block_size. Query head h reads kv head h / (n_heads / kv_heads). A query at position p
// sees keys lo ..= p, lo = p + 1 - window (clamped at 0) when window > 0, else 0. Scores are
// q.k * scale, then cap * tanh(score / cap) when soft_cap > 0, then the softmax.
//
// head_dim is a runtime argument; each kernel is compiled for a maximum HD (suffix _hd64,
// _hd128, _hd256) and accepts any multiple of 8 up to it (the _mma kernels need it equal).
// All arithmetic is f32 except the tensor-core kernel's operands (q, k, v as stored; the
// probabilities rounded to T for the P.V product, as flash attention does).
#include "common.cuh"
#include "mma.cuh"

// Argument lists, shared by the templates and their extern "C" entry points.
#define DECODE_PARAMS(T)                                                                       \
  T *__restrict__ out, i32 out_stride, u32 *__restrict__ counters, float *__restrict__ part_out, \
      float *__restrict__ part_max, float *__restrict__ part_sum,                              \
      const T *__restrict__ q, i32 q_stride, const T *__restrict__ k_cache,                   \
      const T *__restrict__ v_cache, const i32 *__restrict__ block_tables, i32 max_blocks,    \
      const i32 *__restrict__ context_lens, i32 n_heads, i32 kv_heads, i32 head_dim,          \
      i32 block_size, float scale, float soft_cap, i32 window, i32 partition_size, i32 n_parts
#define DECODE_ARGS                                                                           \
  out, out_stride, counters, part_out, part_max, part_sum, q, q_stride, k_cache, v_cache, block_tables, max_blocks,      \
      context_lens, n_heads, kv_heads, head_dim, block_size, scale, soft_cap, window,         \
      partition_size, n_parts
#define PREFILL_PARAMS(T)                                                                      \
  T *__restrict__ out, i32 out_stride, const T *__restrict__ q, i32 q_stride,                 \
      const T *__restrict__ k_cache, const T *__restrict__ v_cache,                           \
      const i32 *__restrict__ block_tables, i32 max_blocks, const i32 *__restrict__ query_start, \
      const i32 *__restrict__ context_lens, i32 n_heads, i32 kv_heads, i32 head_dim,          \
      i32 block_size, float scale, float soft_cap, i32 window
#define PREFILL_ARGS                                                                          \
  out, out_stride, q, q_stride, k_cache, v_cache, block_tables, max_blocks, query_start,      \
      context_lens, n_heads, kv_heads, head_dim, block_size, scale, soft_cap, window

namespace attn {

// E consecutive T values (E * 2 bytes, so 4/8/16-byte aligned) as packed pairs, or zeros.
template <int E>
__device__ __forceinline__ void load_raw(const void* p, bool valid, u32 (&w)[E / 2]) {
#pragma unroll
  for (int i = 0; i < E / 2; ++i) w[i] = 0;
  if (!valid) return;
  if constexpr (E == 2) {
    w[0] = *reinterpret_cast<const u32*>(p);
  } else if constexpr (E == 4) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x, w[1] = v.y;
  } else {
#pragma unroll
    for (int i = 0; i < E / 8; ++i) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[i];
      w[4 * i] = v.x, w[4 * i + 1] = v.y, w[4 * i + 2] = v.z, w[4 * i + 3] = v.w;
    }
  }
}

template <typename T, int E>
__device__ __forceinline__ void unpack(const u32 (&w)[E / 2], float (&f)[E]) {
#pragma unroll
  for (int i = 0; i < E / 2; ++i) f[2 * i] = lo_f32<T>(w[i]), f[2 * i + 1] = hi_f32<T>(w[i]);
}

template <typename T, int E>
__device__ __forceinline__ void load_f32(const T* p, float (&f)[E]) {
  u32 w[E / 2];
  load_raw<E>(p, true, w);
  unpack<T, E>(w, f);
}

// Lane l returns the sum over the warp's lanes of their v[l]. With lanes splitting head_dim,
// 32 dot products finish with one 32x32 transpose through shared memory (`scr`: 32 * 36
// floats for this warp; stride 36 keeps both the float4 stores and the column reads free of
// bank conflicts) instead of 32 five-step shuffle reductions.
__device__ __forceinline__ float transpose_sum(const float (&v)[32], float* scr, int lane) {
#pragma unroll
  for (int i = 0; i < 32; i += 4)
    *reinterpret_cast<float4*>(scr + lane * 36 + i) = make_float4(v[i], v[i + 1], v[i + 2], v[i + 3]);
  __syncwarp();
  float s = 0.f;
#pragma unroll
  for (int l = 0; l < 32; ++l) s += scr[l * 36 + lane];
  __syncwarp();
  return s;
}

__device__ __forceinline__ float cap(float s, float soft_cap) {
  return soft_cap > 0.f ? tanhf(s / soft_cap) * soft_cap : s;
}

__device__ __forceinline__ int slot_of(const int* table, int pos, int block_size) {
  return table[pos / block_size] * block_size + pos % block_size;
}

// ------------------------------------------------------------------------------------------
// Decode: one query per sequence (position ctx - 1), the context split into partitions.

constexpr int DEC_THREADS = 128;
constexpr int DEC_PMAX = 512;  // largest partition_size
constexpr int DEC_PMIN = 32;   // smallest partition
// Partitions a short context may be cut into (DECODE_SHORT_PARTS in attention.rs: the scratch
// holds at least this many per sequence), and the blocks a step aims for (two per SM of an
// H100) before cutting contexts finer.
constexpr int DEC_SHORT_PARTS = 16;
constexpr int DEC_TARGET_BLOCKS = 264;

// Positions per partition for a context of `ctx` in a grid of `blocks` (kv heads x sequences)
// per partition index: `largest` for long contexts or full grids; for a short context in a
// small batch (batch-1 decode: 8 blocks of 256 on 132 SMs) the smallest power of two from
// DEC_PMIN that still cuts it into at most as many parts as the grid lacks blocks (at most
// DEC_SHORT_PARTS), so its keys spread over more blocks. The reduce needs no partition size:
// empty partitions are skipped.
__device__ __forceinline__ int partition_of(int ctx, int largest, int blocks) {
  const int want = max(1, min(DEC_SHORT_PARTS, DEC_TARGET_BLOCKS / max(blocks, 1)));
  int p = DEC_PMIN;
  while (p < largest && p * want < ctx) p <<= 1;
  return p;
}

template <int HD>
struct Dec {
  static constexpr int E = HD / 32;                // head_dim elements per lane
  static constexpr int GC = HD >= 256 ? 4 : 8;     // query heads per pass (q: GC * E registers)
  static constexpr int NK = 32 / GC;               // keys per chunk: NK * GC = 32 dot products
  static constexpr int BUF = GC * DEC_PMAX > 4 * GC * HD ? GC * DEC_PMAX : 4 * GC * HD;
  // Launch-bounds occupancy target: 4 blocks (16 warps) per SM caps registers at 128, which
  // hd64/hd128 fit without spilling (left alone, ptxas spilled hd64 at 80); hd256 needs ~180.
  static constexpr int MIN_BLOCKS = HD >= 256 ? 2 : 4;
};

// Scores of the partition go to shared memory (GC heads x partition), then an exact softmax
// per head, then P.V; a block thus reads each K and V row of its partition once for the whole
// GQA group (GC heads per pass, more passes for larger groups).
template <typename T, int HD>
__device__ __forceinline__ void decode_part(DECODE_PARAMS(T)) {
  using C = Dec<HD>;
  constexpr int E = C::E, GC = C::GC, NK = C::NK;
  __shared__ __align__(16) float buf[C::BUF];  // scores [GC][DEC_PMAX], then [4 warps][GC][HD]
  __shared__ __align__(16) float scr[4][32 * 36];
  __shared__ int slots[DEC_PMAX];
  __shared__ float inv_sum[GC];

  const int kvh = blockIdx.x, s = blockIdx.y, p = blockIdx.z;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int group = n_heads / kv_heads;
  const int ctx = context_lens[s];
  const int lo = window > 0 ? max(0, ctx - window) : 0;
  const int psize = partition_of(ctx, partition_size, gridDim.x * gridDim.y);
  const int p0 = max(p * psize, lo), p1 = min((p + 1) * psize, ctx);
  const int n = p1 - p0;
  const i64 head0 = (i64)s * n_heads + (i64)kvh * group;  // (sequence, first head of the group)
  if (n <= 0) {  // past the context, before the window, or a padding sequence
    for (int j = tid; j < group; j += DEC_THREADS) {
      part_max[(head0 + j) * n_parts + p] = NEG_INF;
      part_sum[(head0 + j) * n_parts + p] = 0.f;
    }
    return;
  }
  const int* table = block_tables + (i64)s * max_blocks;
  for (int i = tid; i < n; i += DEC_THREADS) slots[i] = slot_of(table, p0 + i, block_size);
  __syncthreads();

  const i64 row_stride = (i64)kv_heads * head_dim;
  const int d0 = lane * E;
  const bool lane_on = d0 < head_dim;
  const T* kbase = k_cache + (i64)kvh * head_dim + d0;
  const T* vbase = v_cache + (i64)kvh * head_dim + d0;
  const T* qbase = q + (i64)s * q_stride + (i64)kvh * group * head_dim + d0;
  const int n_chunks = (n + NK - 1) / NK;
  // Raw K or V words of this lane for the NK keys of chunk c (zeros past the partition).
  auto fetch = [&](int c, const T* base, u32 (&w)[NK][E / 2]) {
#pragma unroll
    for (int kk = 0; kk < NK; ++kk) {
      const int key = c * NK + kk;
      load_raw<E>(base + (key < n ? slots[key] : 0) * row_stride, key < n && lane_on, w[kk]);
    }
  };

  for (int j0 = 0; j0 < group; j0 += GC) {
    const int gn = min(GC, group - j0);
    float qr[GC][E];
#pragma unroll
    for (int j = 0; j < GC; ++j) {
#pragma unroll
      for (int e = 0; e < E; ++e) qr[j][e] = 0.f;
      if (j < gn && lane_on) {
        load_f32<T, E>(qbase + (i64)(j0 + j) * head_dim, qr[j]);
#pragma unroll
        for (int e = 0; e < E; ++e) qr[j][e] *= scale;
      }
    }

    // Scores: warp w takes chunks w, w+4, ... of NK keys; lane l ends with key l / GC, head l % GC.
    // The rows of the warp's next chunk are loaded while this one is computed.
    u32 raw[NK][E / 2];
    fetch(warp, kbase, raw);
    for (int c = warp; c < n_chunks; c += 4) {
      u32 nxt[NK][E / 2];
      fetch(c + 4, kbase, nxt);
      float part[32];
#pragma unroll
      for (int kk = 0; kk < NK; ++kk) {
        float kf[E];
        unpack<T, E>(raw[kk], kf);
#pragma unroll
        for (int j = 0; j < GC; ++j) {
          float d = 0.f;
          if (j < gn)  // warp-uniform: groups smaller than GC skip the absent heads
#pragma unroll
            for (int e = 0; e < E; ++e) d += qr[j][e] * kf[e];
          part[kk * GC + j] = d;
        }
      }
#pragma unroll
      for (int kk = 0; kk < NK; ++kk)
#pragma unroll
        for (int i = 0; i < E / 2; ++i) raw[kk][i] = nxt[kk][i];
      const float sc = transpose_sum(part, scr[warp], lane);
      const int key = c * NK + lane / GC, j = lane % GC;
      if (key < n && j < gn) buf[j * DEC_PMAX + key] = cap(sc, soft_cap);
    }
    __syncthreads();

    // Exact softmax over the partition, one warp per head; scores become exp(s - max).
    for (int j = warp; j < gn; j += 4) {
      float* row = buf + j * DEC_PMAX;
      float mx = NEG_INF;
      for (int i = lane; i < n; i += 32) mx = fmaxf(mx, row[i]);
      mx = warp_max(mx);
      float sum = 0.f;
      for (int i = lane; i < n; i += 32) {
        const float e = __expf(row[i] - mx);
        row[i] = e;
        sum += e;
      }
      sum = warp_sum(sum);
      if (lane == 0) {
        inv_sum[j] = 1.f / sum;
        part_max[(head0 + j0 + j) * n_parts + p] = mx;
        part_sum[(head0 + j0 + j) * n_parts + p] = sum;
      }
    }
    __syncthreads();

    // P.V: warp w accumulates its chunks for every head; lanes split head_dim.
    float acc[GC][E];
#pragma unroll
    for (int j = 0; j < GC; ++j)
#pragma unroll
      for (int e = 0; e < E; ++e) acc[j][e] = 0.f;
    fetch(warp, vbase, raw);
    for (int c = warp; c < n_chunks; c += 4) {
      u32 nxt[NK][E / 2];
      fetch(c + 4, vbase, nxt);
      float pr[GC][NK];
#pragma unroll
      for (int j = 0; j < GC; ++j)
#pragma unroll
        for (int kk = 0; kk < NK; kk += 4) {
          // Past the partition the scores were never written: force p = 0 (V is zero there).
          const float4 v = *reinterpret_cast<const float4*>(buf + j * DEC_PMAX + c * NK + kk);
          const int left = n - c * NK - kk;
          pr[j][kk] = v.x, pr[j][kk + 1] = left > 1 ? v.y : 0.f;
          pr[j][kk + 2] = left > 2 ? v.z : 0.f, pr[j][kk + 3] = left > 3 ? v.w : 0.f;
          if (left <= 0) pr[j][kk] = 0.f;
        }
#pragma unroll
      for (int kk = 0; kk < NK; ++kk) {
        float vf[E];
        unpack<T, E>(raw[kk], vf);
#pragma unroll
        for (int j = 0; j < GC; ++j)
          if (j < gn)
#pragma unroll
            for (int e = 0; e < E; ++e) acc[j][e] += pr[j][kk] * vf[e];
      }
#pragma unroll
      for (int kk = 0; kk < NK; ++kk)
#pragma unroll
        for (int i = 0; i < E / 2; ++i) raw[kk][i] = nxt[kk][i];
    }
    __syncthreads();  // scores are read; buf becomes the per-warp partial outputs
#pragma unroll
    for (int j = 0; j < GC; ++j)
#pragma unroll
      for (int e = 0; e < E; ++e) buf[(warp * GC + j) * HD + d0 + e] = acc[j][e];
    __syncthreads();
    for (int i = tid; i < gn * head_dim; i += DEC_THREADS) {
      const int j = i / head_dim, d = i - j * head_dim;
      const float o = buf[j * HD + d] + buf[(GC + j) * HD + d] + buf[(2 * GC + j) * HD + d] +
                      buf[(3 * GC + j) * HD + d];
      part_out[((head0 + j0 + j) * n_parts + p) * head_dim + d] = o * inv_sum[j];
    }
    __syncthreads();  // buf and inv_sum are reused by the next pass
  }
}

// Combines head h of sequence s's partitions: out = sum_p w_p out_p / sum_p w_p,
// w_p = sum_p * exp(max_p - max). Empty partitions (sum 0) are skipped without reading their
// part_out; a sequence with no keys at all gets zeros. The whole block calls it. The partials
// were written by other blocks of this launch: they are read through L2 (ldcg_f32), as L1 is
// not coherent between SMs.
template <typename T>
__device__ __forceinline__ void reduce_head(T* __restrict__ out, int out_stride,
                                            const float* part_out, const float* part_max,
                                            const float* part_sum, int s, int h, int n_heads,
                                            int head_dim, int n_parts) {
  constexpr int CH = 256;
  __shared__ float wts[CH];
  __shared__ float scratch[32];
  const int tid = threadIdx.x;
  const i64 base = ((i64)s * n_heads + h) * n_parts;
  float mx = NEG_INF;
  for (int i = tid; i < n_parts; i += blockDim.x)
    if (ldcg_f32(part_sum + base + i) > 0.f) mx = fmaxf(mx, ldcg_f32(part_max + base + i));
  mx = block_max(mx, scratch);
  float acc[2] = {0.f, 0.f}, den = 0.f;
  for (int c0 = 0; c0 < n_parts; c0 += CH) {
    const int cnt = min(CH, n_parts - c0);
    __syncthreads();
    for (int i = tid; i < cnt; i += blockDim.x) {
      const float l = ldcg_f32(part_sum + base + c0 + i);
      wts[i] = l > 0.f ? l * __expf(ldcg_f32(part_max + base + c0 + i) - mx) : 0.f;
    }
    __syncthreads();
    for (int i = 0; i < cnt; ++i) {
      const float w = wts[i];
      if (w == 0.f) continue;
      den += w;
      const float* po = part_out + (base + c0 + i) * head_dim;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int d = tid + k * blockDim.x;
        if (d < head_dim) acc[k] += w * ldcg_f32(po + d);
      }
    }
  }
  const float inv = den > 0.f ? 1.f / den : 0.f;
#pragma unroll
  for (int k = 0; k < 2; ++k) {
    const int d = tid + k * blockDim.x;
    if (d < head_dim) out[(i64)s * out_stride + (i64)h * head_dim + d] = from_f32<T>(acc[k] * inv);
  }
}

// One launch per decode step and layer: each block scores its partition (decode_part), then
// counts itself in on its (sequence, kv head); the block that finishes last combines the
// group's heads (reduce_head), so no second kernel runs after it. The order of the sum does
// not depend on which block is last, so the result is deterministic.
template <typename T, int HD>
__device__ __forceinline__ void decode(DECODE_PARAMS(T)) {
  decode_part<T, HD>(DECODE_ARGS);
  __shared__ bool last;
  __threadfence();  // this block's partials are visible device-wide before it counts itself in
  __syncthreads();
  if (threadIdx.x == 0) {
    u32* c = counters + (i64)blockIdx.y * kv_heads + blockIdx.x;
    last = atomicAdd(c, 1u) == (u32)(n_parts - 1);
    if (last) *c = 0u;  // every partition has counted: ready for the next launch (graph replay)
  }
  __syncthreads();
  if (!last) return;
  __threadfence();  // the others' partials, which their fences published, are read after this
  const int group = n_heads / kv_heads;
  for (int j = 0; j < group; ++j)
    reduce_head<T>(out, out_stride, part_out, part_max, part_sum, blockIdx.y,
                   blockIdx.x * group + j, n_heads, head_dim, n_parts);
}

// ------------------------------------------------------------------------------------------
// Prefill, CUDA cores: 16 query rows of one head per block (4 per warp), key tiles staged in
// shared memory, online softmax in f32.

constexpr int PF_THREADS = 128;
constexpr int PF_BQ = 16;
constexpr int PF_RW = 4;   // rows per warp
constexpr int PF_NK = 8;   // keys per chunk: PF_NK * PF_RW = 32 dot products per transpose

// Query rows [i0, i0 + bq) of sequence s, all at positions first + i: the key range the block
// needs, [lo, hi).
__device__ __forceinline__ void key_range(int first, int i0, int bq, int nq, int window, int& lo,
                                          int& hi) {
  hi = first + min(i0 + bq, nq);
  lo = window > 0 ? max(0, first + i0 + 1 - window) : 0;
}

template <typename T, int HD>
__device__ __forceinline__ void prefill(PREFILL_PARAMS(T)) {
  constexpr int E = HD / 32, KT = 4096 / HD, CPR = HD / 8;  // CPR: 16-byte chunks per row
  __shared__ __align__(16) T ks[KT * HD];
  __shared__ __align__(16) T vs[KT * HD];
  __shared__ __align__(16) float scr[4][32 * 36];
  __shared__ __align__(16) float pbuf[4][32];
  __shared__ __align__(16) float abuf[4][4];

  const int h = blockIdx.y, s = blockIdx.z, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int qs = query_start[s], nq = query_start[s + 1] - qs;
  const int i0 = blockIdx.x * PF_BQ;
  if (i0 >= nq) return;
  const int first = context_lens[s] - nq;
  const int kvh = h / (n_heads / kv_heads);
  const int* table = block_tables + (i64)s * max_blocks;
  const int d0 = lane * E;
  const bool lane_on = d0 < head_dim;
  const int ib = i0 + warp * PF_RW;  // this warp's first row

  float qr[PF_RW][E], acc[PF_RW][E];
#pragma unroll
  for (int r = 0; r < PF_RW; ++r) {
#pragma unroll
    for (int e = 0; e < E; ++e) qr[r][e] = 0.f, acc[r][e] = 0.f;
    if (ib + r < nq && lane_on) {
      load_f32<T, E>(q + (i64)(qs + ib + r) * q_stride + (i64)h * head_dim + d0, qr[r]);
#pragma unroll
      for (int e = 0; e < E; ++e) qr[r][e] *= scale;
    }
  }
  // Softmax state of row lane % PF_RW (the row this lane scores), shared by its 8 lanes.
  const int my_r = lane % PF_RW, my_i = ib + my_r, my_pos = first + my_i;
  float m_run = NEG_INF, l_run = 0.f;

  int lo, hi;
  key_range(first, i0, PF_BQ, nq, window, lo, hi);
  for (int t0 = lo; t0 < hi; t0 += KT) {
    __syncthreads();  // the previous tile is consumed
    for (int i = tid; i < KT * CPR; i += PF_THREADS) {
      const int kr = i / CPR, ch = i % CPR, key = t0 + kr;
      uint4 kv = make_uint4(0, 0, 0, 0), vv = kv;
      if (key < hi && ch * 8 < head_dim) {
        const i64 off = ((i64)slot_of(table, key, block_size) * kv_heads + kvh) * head_dim + ch * 8;
        kv = *reinterpret_cast<const uint4*>(k_cache + off);
        vv = *reinterpret_cast<const uint4*>(v_cache + off);
      }
      *reinterpret_cast<uint4*>(ks + kr * HD + ch * 8) = kv;
      *reinterpret_cast<uint4*>(vs + kr * HD + ch * 8) = vv;
    }
    __syncthreads();
    for (int c = 0; c < KT / PF_NK; ++c) {
      float part[32];
#pragma unroll
      for (int kk = 0; kk < PF_NK; ++kk) {
        float kf[E];
        load_f32<T, E>(ks + (c * PF_NK + kk) * HD + d0, kf);
#pragma unroll
        for (int r = 0; r < PF_RW; ++r) {
          float d = 0.f;
#pragma unroll
          for (int e = 0; e < E; ++e) d += qr[r][e] * kf[e];
          part[kk * PF_RW + r] = d;
        }
      }
      // This lane's score: key kk = lane / PF_RW of the chunk, row my_r.
      float sc = cap(transpose_sum(part, scr[warp], lane), soft_cap);
      const int key = t0 + c * PF_NK + lane / PF_RW;
      const bool ok = my_i < nq && key <= my_pos && (window <= 0 || key > my_pos - window);
      sc = ok ? sc : NEG_INF;
      float cm = sc;
#pragma unroll
      for (int o = PF_RW; o < 32; o <<= 1) cm = fmaxf(cm, __shfl_xor_sync(0xffffffffu, cm, o));
      const float m_new = fmaxf(m_run, cm);
      const float pr = m_new == NEG_INF ? 0.f : __expf(sc - m_new);
      const float alpha = m_new == NEG_INF ? 1.f : __expf(m_run - m_new);
      float ps = pr;
#pragma unroll
      for (int o = PF_RW; o < 32; o <<= 1) ps += __shfl_xor_sync(0xffffffffu, ps, o);
      l_run = l_run * alpha + ps;
      m_run = m_new;
      pbuf[warp][lane] = pr;  // index kk * PF_RW + r
      if (lane < PF_RW) abuf[warp][lane] = alpha;
      __syncwarp();
      const float4 al = *reinterpret_cast<const float4*>(abuf[warp]);
      const float alv[4] = {al.x, al.y, al.z, al.w};
#pragma unroll
      for (int r = 0; r < PF_RW; ++r)
#pragma unroll
        for (int e = 0; e < E; ++e) acc[r][e] *= alv[r];
#pragma unroll
      for (int kk = 0; kk < PF_NK; ++kk) {
        const float4 pk = *reinterpret_cast<const float4*>(&pbuf[warp][kk * PF_RW]);
        const float pv[4] = {pk.x, pk.y, pk.z, pk.w};
        float vf[E];
        load_f32<T, E>(vs + (c * PF_NK + kk) * HD + d0, vf);
#pragma unroll
        for (int r = 0; r < PF_RW; ++r)
#pragma unroll
          for (int e = 0; e < E; ++e) acc[r][e] += pv[r] * vf[e];
      }
      __syncwarp();
    }
  }
#pragma unroll
  for (int r = 0; r < PF_RW; ++r) {
    const float l = __shfl_sync(0xffffffffu, l_run, r);  // lane r holds row r
    if (ib + r < nq && lane_on) {
      T* o = out + (i64)(qs + ib + r) * out_stride + (i64)h * head_dim + d0;
      const float inv = 1.f / l;
#pragma unroll
      for (int e = 0; e < E; e += 2)
        *reinterpret_cast<u32*>(o + e) = pack2<T>(acc[r][e] * inv, acc[r][e + 1] * inv);
    }
  }
}

// ------------------------------------------------------------------------------------------
// Prefill on tensor cores (flash attention 2): 64 query rows of one head per block, 16 per warp
// as one mma M tile; S = Q K^T and O += P V with mma.m16n8k16 and f32 accumulators. Q, K and V
// tiles sit in shared memory (K and V single-buffered, each reloaded while the other is used).

constexpr int MMA_THREADS = 128;
constexpr int MMA_BQ = 64;

// Element offset of 16-byte chunk c of row r in a [rows][HD] tile. The chunk index is XORed
// with r % 8 so that the 8 rows one ldmatrix reads (same logical chunk) hit 8 bank groups.
template <int HD>
__device__ __forceinline__ int swz(int r, int c) {
  return r * HD + ((c ^ (r & 7)) << 3);
}

template <typename T, int HD>
__device__ __forceinline__ void prefill_mma(PREFILL_PARAMS(T)) {
  // Key tile: 64 keys, 16 at head_dim 256 (Q 32 KiB + K 8 + V 8 = the 48 KiB static limit).
  constexpr int KT = HD == 256 ? 16 : 64, CPR = HD / 8;
  constexpr int NT = KT / 8, ND = HD / 8, KS = HD / 16, PK = KT / 16;
  __shared__ __align__(128) T qsm[MMA_BQ * HD];
  __shared__ __align__(128) T ksm[KT * HD];
  __shared__ __align__(128) T vsm[KT * HD];
  (void)head_dim;  // == HD

  const int h = blockIdx.y, s = blockIdx.z, tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int gid = lane >> 2, tig = lane & 3, lq = lane >> 3, lr = lane & 7;
  const int qs = query_start[s], nq = query_start[s + 1] - qs;
  const int i0 = blockIdx.x * MMA_BQ;
  if (i0 >= nq) return;
  const int first = context_lens[s] - nq;
  const int kvh = h / (n_heads / kv_heads);
  const int* table = block_tables + (i64)s * max_blocks;
  int lo, hi;
  key_range(first, i0, MMA_BQ, nq, window, lo, hi);

  for (int i = tid; i < MMA_BQ * CPR; i += MMA_THREADS) {
    const int r = i / CPR, c = i % CPR;
    const bool ok = i0 + r < nq;
    const T* src = q + (i64)(qs + (ok ? i0 + r : i0)) * q_stride + (i64)h * HD + c * 8;
    cp_async16_zfill(qsm + swz<HD>(r, c), src, ok);
  }
  // Keys past `hi` are zero-filled: masked scores and zero values, never garbage times 0.
  auto load_tile = [&](T* dst, const T* cache, int t0) {
    for (int i = tid; i < KT * CPR; i += MMA_THREADS) {
      const int r = i / CPR, c = i % CPR, key = t0 + r;
      const bool ok = key < hi;
      const T* src = cache;
      if (ok) src += ((i64)slot_of(table, key, block_size) * kv_heads + kvh) * HD + c * 8;
      cp_async16_zfill(dst + swz<HD>(r, c), src, ok);
    }
  };
  load_tile(ksm, k_cache, lo);
  cp_async_commit();  // group: Q + K tile 0
  load_tile(vsm, v_cache, lo);
  cp_async_commit();  // group: V tile 0

  float o[ND][4];
#pragma unroll
  for (int nd = 0; nd < ND; ++nd) o[nd][0] = o[nd][1] = o[nd][2] = o[nd][3] = 0.f;
  float m_run[2] = {NEG_INF, NEG_INF}, l_run[2] = {0.f, 0.f};  // rows gid, gid + 8 (partial l)
  const int row0 = i0 + warp * 16 + gid;                       // query index of row gid

  for (int t0 = lo; t0 < hi; t0 += KT) {
    cp_async_wait<1>();  // K tile (and Q) landed; V may still be in flight
    __syncthreads();
    float sc[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) sc[nt][0] = sc[nt][1] = sc[nt][2] = sc[nt][3] = 0.f;
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      u32 af[4];
      ldmatrix_x4(af, qsm + swz<HD>(warp * 16 + (lq & 1) * 8 + lr, 2 * ks + (lq >> 1)));
#pragma unroll
      for (int nt = 0; nt < NT; nt += 2) {
        u32 bf[4];
        ldmatrix_x4(bf, ksm + swz<HD>((nt + (lq >> 1)) * 8 + lr, 2 * ks + (lq & 1)));
        const u32 b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
        mma16816<T>(sc[nt], af, b0);
        mma16816<T>(sc[nt + 1], af, b1);
      }
    }
    __syncthreads();  // every warp is done with this K tile
    if (t0 + KT < hi) load_tile(ksm, k_cache, t0 + KT);
    cp_async_commit();

#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int qi = row0 + 8 * rr, qp = first + qi;
      float mx = NEG_INF;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = t0 + nt * 8 + 2 * tig + c;
          const bool ok = qi < nq && key <= qp && (window <= 0 || key > qp - window);
          const float v = ok ? cap(sc[nt][2 * rr + c] * scale, soft_cap) : NEG_INF;
          sc[nt][2 * rr + c] = v;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m_run[rr], mx);
      const float alpha = m_new == NEG_INF ? 1.f : __expf(m_run[rr] - m_new);
      float ls = 0.f;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float pr = m_new == NEG_INF ? 0.f : __expf(sc[nt][2 * rr + c] - m_new);
          sc[nt][2 * rr + c] = pr;
          ls += pr;
        }
      l_run[rr] = l_run[rr] * alpha + ls;
      m_run[rr] = m_new;
#pragma unroll
      for (int nd = 0; nd < ND; ++nd) o[nd][2 * rr] *= alpha, o[nd][2 * rr + 1] *= alpha;
    }

    cp_async_wait<1>();  // V tile landed
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < PK; ++kk) {
      // The S accumulators of n-tiles 2kk, 2kk+1 are exactly the A fragment of P.
      const u32 pa[4] = {pack2<T>(sc[2 * kk][0], sc[2 * kk][1]),
                         pack2<T>(sc[2 * kk][2], sc[2 * kk][3]),
                         pack2<T>(sc[2 * kk + 1][0], sc[2 * kk + 1][1]),
                         pack2<T>(sc[2 * kk + 1][2], sc[2 * kk + 1][3])};
#pragma unroll
      for (int nd = 0; nd < ND; nd += 2) {
        u32 bf[4];
        ldmatrix_x4_trans(bf, vsm + swz<HD>(kk * 16 + (lq & 1) * 8 + lr, nd + (lq >> 1)));
        const u32 b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
        mma16816<T>(o[nd], pa, b0);
        mma16816<T>(o[nd + 1], pa, b1);
      }
    }
    __syncthreads();  // every warp is done with this V tile
    if (t0 + KT < hi) load_tile(vsm, v_cache, t0 + KT);
    cp_async_commit();
  }
  cp_async_wait<0>();

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    float l = l_run[rr];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int qi = row0 + 8 * rr;
    if (qi < nq) {
      const float inv = 1.f / l;
      T* dst = out + (i64)(qs + qi) * out_stride + (i64)h * HD + 2 * tig;
#pragma unroll
      for (int nd = 0; nd < ND; ++nd)
        *reinterpret_cast<u32*>(dst + nd * 8) = pack2<T>(o[nd][2 * rr] * inv, o[nd][2 * rr + 1] * inv);
    }
  }
}

}  // namespace attn

// ==========================================================================================
// Entry points. T = f16 / bf16 by suffix; HD the largest head_dim the variant accepts.
//
// attention_decode_hd{64,128,256}_{f16,bf16}(T* out, i32 out_stride, u32* counters,
//     float* part_out, float* part_max, float* part_sum, const T* q, i32 q_stride,
//     const T* k_cache, const T* v_cache, const i32* block_tables, i32 max_blocks,
//     const i32* context_lens, i32 n_heads, i32 kv_heads, i32 head_dim, i32 block_size,
//     float scale, float soft_cap, i32 window, i32 partition_size, i32 n_parts)
//   grid = (kv_heads, n_seqs, n_parts); block = (128, 1, 1); dynamic shared memory = 0.
//   out[s * out_stride + h * head_dim + d]: the attention of sequence s's query row.
//   Scratch: part_out [n_seqs][n_heads][n_parts][head_dim] (normalized within the partition),
//   part_max / part_sum [n_seqs][n_heads][n_parts]; partition p covers a range of the context
//   (partition_of); partitions with no visible key (past the context, before the window, or
//   context_lens[s] == 0) write max = -inf, sum = 0 and leave part_out untouched.
//   counters [n_seqs][kv_heads] u32, zero before the first launch; every launch leaves them
//   zero again.
//   Constraints: head_dim % 8 == 0 and head_dim <= HD; n_heads % kv_heads == 0;
//   1 <= partition_size <= 512; n_parts * partition_size >= the longest context; q_stride % 8
//   == 0 (q row s holds n_heads * head_dim values); window >= 0, soft_cap >= 0.
#define ATTN_DECODE(HD, T)                                                                     \
  extern "C" __global__ void __launch_bounds__(attn::DEC_THREADS, attn::Dec<HD>::MIN_BLOCKS)  \
      attention_decode_hd##HD##_##T(DECODE_PARAMS(T)) {                                        \
    attn::decode<T, HD>(DECODE_ARGS);                                                          \
  }

// attention_prefill_hd{64,128,256}_{f16,bf16}(T* out, i32 out_stride, const T* q,
//     i32 q_stride, const T* k_cache, const T* v_cache, const i32* block_tables,
//     i32 max_blocks, const i32* query_start, const i32* context_lens, i32 n_heads,
//     i32 kv_heads, i32 head_dim, i32 block_size, float scale, float soft_cap, i32 window)
//   grid = (ceil(max_q / 16), n_heads, n_seqs); block = (128, 1, 1); dynamic shared memory = 0.
//   Query rows query_start[s] .. query_start[s+1] of q / out belong to sequence s, the i-th at
//   position context_lens[s] - n_q(s) + i (its K/V already in the cache). Blocks past their
//   sequence's queries return at once.
//   Constraints: head_dim % 8 == 0 and head_dim <= HD; n_heads % kv_heads == 0; q_stride and
//   out_stride % 8 == 0; context_lens[s] >= n_q(s).
//
// attention_prefill_mma_hd{64,128,256}_{f16,bf16}: same arguments and meaning.
//   grid = (ceil(max_q / 64), n_heads, n_seqs); block = (128, 1, 1); dynamic shared memory = 0
//   (static: 24 KiB at hd64, 48 KiB at hd128 and hd256).
//   Constraints: head_dim == HD exactly (other sizes: the CUDA-core kernel above); otherwise
//   as attention_prefill.
#define ATTN_PREFILL(HD, T)                                                                    \
  extern "C" __global__ void __launch_bounds__(attn::PF_THREADS)                               \
      attention_prefill_hd##HD##_##T(PREFILL_PARAMS(T)) {                                      \
    attn::prefill<T, HD>(PREFILL_ARGS);                                                        \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(attn::MMA_THREADS)                              \
      attention_prefill_mma_hd##HD##_##T(PREFILL_PARAMS(T)) {                                  \
    attn::prefill_mma<T, HD>(PREFILL_ARGS);                                                    \
  }

// This file is compiled once per head size (ATTN_HD: 64, 128 or 256; see
// kernels/src/cuda/sources.rs), each an NVRTC program of its own: the three compile in parallel
// at start-up instead of one program holding all of them.
#ifndef ATTN_HD
#error "define ATTN_HD (64, 128 or 256): attention.cu is compiled once per head size"
#endif
// One level of indirection, so ATTN_HD is expanded before the entry names are pasted.
#define ATTN_INSTANCES(HD) \
  ATTN_DECODE(HD, f16)     \
  ATTN_DECODE(HD, bf16)    \
  ATTN_PREFILL(HD, f16)    \
  ATTN_PREFILL(HD, bf16)
ATTN_INSTANCES(ATTN_HD)
