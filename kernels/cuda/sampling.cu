// Token selection on f32 logits: greedy argmax, and temperature / top-k / top-p / min-p
// sampling, one block per sequence, without sorting the vocabulary.
//
// Semantics follow the CPU sampler's `draw` (services/engine/src/sampler.rs); penalties are
// not applied here (the CPU applies them to the logits before this point, so the host must do
// the same before launching). With T = temperature and m = the largest logit:
//   candidates: logits l >= m - 40*T (anything lower has probability < e^-40 of the best);
//               NaN logits are never candidates
//   s = (l - m) * (1/T)       the scaled logit; the best token has s = +0
//   top-k (k > 0):            keep s >= the k-th largest s among candidates
//   top-p (p < 1):            keep s >= the largest threshold whose kept mass sum(exp(s)) is
//                             >= p * (the mass top-k kept): the CPU's shortest prefix of the
//                             sorted, renormalized top-k distribution reaching p
//   min-p (q > 0):            keep exp(s) >= q, i.e. prob >= q * (the best token's prob)
//   draw:                     from the survivors in proportion to exp(s)
// Ties at a top-k or top-p threshold: every token tied with the threshold value is kept (the
// CPU keeps exactly k, or the shortest prefix, breaking ties by lower token id).
//
// Thresholds are found by an 8-way search over the order-preserving u32 image of s (7 trial
// thresholds per pass over the row, each pass a block-wide count or exp-mass of the tokens at
// or above each trial; about 10 passes for a 2^28-wide key range). Sums are in f32 with a fixed
// reduction order, so a launch is deterministic; counts are exact while vocab < 2^24.
//
// The draw is Gumbel-max: token = argmax over survivors of s_i - log(E_i), E_i ~ Exp(1), which
// picks i with probability exp(s_i) / sum(exp(s)). The randomness is counter-based, so it does
// not depend on the launch shape or on the other sequences:
//   state = mix(seed ^ mix(step))
//   r_i   = mix(state + GAMMA * (i + 1))     (output i + 1 of SplitMix64 started at `state`)
//   u_i   = round_toward_zero((r_i >> 1) | 1) * 2^-63   in [2^-63, 1 - 2^-24]
//   E_i   = -log1p(-u_i)
// where mix is SplitMix64's finalizer and GAMMA = 0x9E3779B97F4A7C15. log1p keeps E_i exact
// when it is small, so the noise reaches s + 43: tokens down to the e^-40 floor keep their
// chance instead of being cut off by a coarse uniform.
#include "common.cuh"

#define SAMPLE_BLOCK 1024
#define SEL_TRIALS 7  // trial thresholds per search pass (an 8-way split)
#define GOLDEN_GAMMA 0x9E3779B97F4A7C15ull

// Larger floats map to larger keys (NaN excepted; +0 sits just above -0).
__device__ __forceinline__ u32 order_key(float f) {
  const u32 b = __float_as_uint(f);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

__device__ __forceinline__ u64 mix64(u64 z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Gumbel noise -log(E) for token i of the stream (see the header comment).
__device__ __forceinline__ float gumbel(u64 state, i32 i) {
  const u64 r = mix64(state + GOLDEN_GAMMA * (u64)(i + 1));
  const float u = __ull2float_rz((r >> 1) | 1ull) * 0x1p-63f;
  return -logf(-log1pf(-u));
}

// (v, i) beats (bv, bi): larger value, then lower index. NaN never wins.
template <typename V>
__device__ __forceinline__ bool better(V v, i32 i, V bv, i32 bi) {
  return v > bv || (v == bv && i < bi);
}

// Block-wide argmax of (value, index), f32 values or u32 keys: the largest value, the lowest
// index on ties; every thread gets the index. Threads with nothing pass (`none`, INT_MAX), the
// lowest value (NEG_INF, or key 0); the result is INT_MAX when no thread had a value (every
// one NaN).
template <typename V>
__device__ __forceinline__ i32 block_argmax(V v, i32 i, V* sv, i32* si, V none) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const V ov = __shfl_xor_sync(0xffffffffu, v, o);
    const i32 oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  __syncthreads();  // the scratch may still be read by a previous reduction
  if (lane == 0) sv[warp] = v, si[warp] = i;
  __syncthreads();
  v = lane < warps ? sv[lane] : none;
  i = lane < warps ? si[lane] : 0x7fffffff;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const V ov = __shfl_xor_sync(0xffffffffu, v, o);
    const i32 oi = __shfl_xor_sync(0xffffffffu, i, o);
    if (better(ov, oi, v, i)) v = ov, i = oi;
  }
  return i;
}

// Calls fn(logit, index) for this thread's share of the row, in the same order on every call
// (so every pass sums the same terms in the same order).
template <typename F>
__device__ __forceinline__ void for_each_logit(const float* row, i32 vocab, F&& fn) {
  if ((vocab & 3) == 0 && is_aligned16(row)) {
    const float4* r4 = reinterpret_cast<const float4*>(row);
    for (i32 q = threadIdx.x; q < vocab / 4; q += blockDim.x) {
      const float4 v = r4[q];
      fn(v.x, 4 * q);
      fn(v.y, 4 * q + 1);
      fn(v.z, 4 * q + 2);
      fn(v.w, 4 * q + 3);
    }
  } else {
    for (i32 i = threadIdx.x; i < vocab; i += blockDim.x) fn(row[i], i);
  }
}

// The candidate test and the scaled logit, as the CPU forms them.
struct Filter {
  float top, floor, inv_t;
  __device__ __forceinline__ bool scaled(float l, float& s) const {
    if (!(l >= floor)) return false;
    s = (l - top) * inv_t;
    return true;
  }
};

// Index of the first of the row's largest logits, exactly as the CPU's `argmax`: a NaN is never
// larger than anything, so a NaN at index 0 makes the answer 0, and so does an all-NaN row.
__device__ __forceinline__ i32 row_argmax(const float* row, i32 vocab, float* sv, i32* si,
                                          float& max_out) {
  float bv = NEG_INF;
  i32 bi = 0x7fffffff;
  for_each_logit(row, vocab, [&](float l, i32 i) {
    if (better(l, i, bv, bi)) bv = l, bi = i;
  });
  const i32 best = block_argmax(bv, bi, sv, si, NEG_INF);
  const float first = vocab > 0 ? row[0] : 0.0f;
  max_out = best < vocab ? row[best] : NEG_INF;
  return (best >= vocab || first != first) ? 0 : best;
}

// The largest key K in [lo, hi] with F(K) >= target, where F(K) sums, over candidates with
// order_key(s) >= K, 1 (MASS false: a count) or exp(s) (MASS true). F falls as K grows, and the
// caller guarantees F(lo) >= target, so lo is returned when no larger key qualifies.
// `red` is (SEL_TRIALS + 1) * 32 floats of shared memory.
template <bool MASS>
__device__ u32 search_threshold(const float* row, i32 vocab, const Filter& f, u32 lo, u32 hi,
                                float target, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  while (lo < hi) {
    u32 t[SEL_TRIALS];
    const u64 span = hi - lo;
#pragma unroll
    for (int j = 0; j < SEL_TRIALS; ++j)  // lo < t[0] <= ... <= t[6] <= hi
      t[j] = lo + (u32)((span * (j + 1) + SEL_TRIALS) / (SEL_TRIALS + 1));
    float c[SEL_TRIALS];
#pragma unroll
    for (int j = 0; j < SEL_TRIALS; ++j) c[j] = 0.0f;
    for_each_logit(row, vocab, [&](float l, i32) {
      float s;
      if (!f.scaled(l, s)) return;
      const u32 key = order_key(s);
      const float w = MASS ? expf(s) : 1.0f;
#pragma unroll
      for (int j = 0; j < SEL_TRIALS; ++j) c[j] += key >= t[j] ? w : 0.0f;
    });
#pragma unroll
    for (int j = 0; j < SEL_TRIALS; ++j) c[j] = warp_sum(c[j]);
    __syncthreads();  // every thread has read the previous pass's totals
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < SEL_TRIALS; ++j) red[j * 32 + warp] = c[j];
    }
    __syncthreads();
    if (warp == 0) {
      for (int j = 0; j < SEL_TRIALS; ++j) {
        const float v = warp_sum(lane < warps ? red[j * 32 + lane] : 0.0f);
        if (lane == 0) red[SEL_TRIALS * 32 + j] = v;
      }
    }
    __syncthreads();
    // The last trial that qualifies bounds the answer from below, the next one from above
    // (written without indexing t by a variable, which would put t in local memory).
    u32 new_lo = lo, new_hi = t[0] - 1;
#pragma unroll
    for (int j = 0; j < SEL_TRIALS; ++j) {
      if (red[SEL_TRIALS * 32 + j] >= target) {
        new_lo = t[j];
        new_hi = j + 1 < SEL_TRIALS ? t[j + 1] - 1 : hi;
      }
    }
    lo = new_lo;
    hi = new_hi;
  }
  return lo;
}

__device__ void sample_row(i32* out_ids, const float* logits, i32 vocab,
                           const float* temperature, const i32* top_k, const float* top_p,
                           const float* min_p, const u64* seeds, const u64* steps) {
  __shared__ float red[(SEL_TRIALS + 1) * 32];
  __shared__ i32 red_i[32];
  const i32 seq = blockIdx.x;
  const float* row = logits + (i64)seq * vocab;

  float top;
  const i32 greedy = row_argmax(row, vocab, red, red_i, top);
  const float temp = temperature[seq];
  // A row whose best logit is ±inf (or all NaN) has no distribution to draw from.
  if (!(temp > 0.0f) || !(top > NEG_INF && top < -NEG_INF)) {
    if (threadIdx.x == 0) out_ids[seq] = greedy;
    return;
  }

  // 40 * T rounded before the subtraction, as the CPU does (no FMA).
  const Filter f{top, top - __fmul_rn(40.0f, temp), 1.0f / temp};
  const i32 k = top_k[seq];
  const float p = top_p[seq];
  u32 thr = 0;  // survivors: order_key(s) >= thr
  if (k > 0 || p < 1.0f) {
    float count = 0.0f, mass = 0.0f, neg_min = NEG_INF;
    for_each_logit(row, vocab, [&](float l, i32) {
      float s;
      if (!f.scaled(l, s)) return;
      count += 1.0f;
      mass += expf(s);
      neg_min = fmaxf(neg_min, -s);
    });
    count = block_sum(count, red);
    mass = block_sum(mass, red);
    neg_min = block_max(neg_min, red);
    const u32 key_hi = order_key(0.0f);  // the best token's s
    thr = order_key(-neg_min);           // the lowest candidate's: everything survives
    if (k > 0 && (float)k < count) {
      thr = search_threshold<false>(row, vocab, f, thr, key_hi, (float)k, red);
      if (p < 1.0f) {
        // top-p renormalizes over what top-k kept.
        mass = 0.0f;
        for_each_logit(row, vocab, [&](float l, i32) {
          float s;
          if (f.scaled(l, s) && order_key(s) >= thr) mass += expf(s);
        });
        mass = block_sum(mass, red);
      }
    }
    if (p < 1.0f) thr = search_threshold<true>(row, vocab, f, thr, key_hi, p * mass, red);
  }

  const float q = min_p[seq];
  const u64 state = mix64(seeds[seq] ^ mix64(steps[seq]));
  float bv = NEG_INF;
  i32 bi = 0x7fffffff;
  for_each_logit(row, vocab, [&](float l, i32 i) {
    float s;
    if (!f.scaled(l, s) || order_key(s) < thr) return;
    if (q > 0.0f && !(expf(s) >= q)) return;
    const float v = s + gumbel(state, i);
    if (better(v, i, bv, bi)) bv = v, bi = i;
  });
  const i32 drawn = block_argmax(bv, bi, red, red_i, NEG_INF);
  // The best token always survives (s = 0, exp(0) = 1 >= any valid min_p); a min_p > 1 from a
  // host that skipped validation leaves nothing, and then the argmax is the answer.
  if (threadIdx.x == 0) out_ids[seq] = drawn < vocab ? drawn : greedy;
}

// ---- Draws with penalties and logprobs (the CPU sampler's `sample`, whole, on the device).
//
// A row whose request asks for penalties or logprobs takes the same draw as any other, after
// the steps the CPU's `Sampler::sample` takes before and after it:
//   1. no distribution (a NaN or +inf logit, or none above -inf): id MAX_ID, nothing else
//      (the CPU refuses the row as bad logits);
//   2. lse = m + log(sum exp(l - m)) over the row as it stands (after a grammar's mask, before
//      the bias and the penalties); the top `logprobs` tokens, larger logit first, ties to
//      the smaller id (the CPU's total order: +0 above -0), each with l - lse;
//   3. the logit bias (l + b on each token it names), then the penalties, on each distinct
//      token of the prompt and output so far: repetition r (l > 0: l / r, else l * r) on
//      every one, then presence and frequency on those the output holds c > 0 times:
//      l - (presence + frequency * c), each operation rounded as the CPU rounds it (no fused
//      multiply-add);
//   4. the draw (greedy or sampled, exactly `sample_row`), from the adjusted row;
//   5. the drawn token's logprob under the row of 2, its adjustments undone as the CPU undoes
//      them (l + (presence + frequency * c), then l * r or l / r, then l - b).
// The distinct tokens come as (token, times in the output) pairs; `pending` names a token of
// the output the pairs leave out (the step's own input, which the host may not have read yet:
// a chained step's carried draw), counted once more here.

#define MAX_LOGPROBS 20
#define LP_WORDS (1 + 2 * MAX_LOGPROBS)
#define MAX_ID 0x7fffffff

// One row's extras, 48 bytes (services/gpu/src/sampling.rs packs them).
struct DrawExtra {
  float repetition, presence, frequency;  // 1, 0, 0: none
  i32 seen_at, seen_len;                  // its pairs: seen[2 * seen_at ..][2 * seen_len]
  i32 pending;                            // index of a token in `ids` the pairs leave out; -1
  i32 logprobs;                           // -1: none; else the draw's logprob and this many top
  i32 bias_at, bias_len;                  // its biases, (token, f32 bits) pairs in `seen` too
  i32 unused[3];
};

// The row's log-sum-exp, or +inf where it has no distribution (step 1).
__device__ float row_lse(const float* row, i32 vocab, float* red) {
  float m = NEG_INF, bad = 0.0f;
  for_each_logit(row, vocab, [&](float l, i32) {
    m = fmaxf(m, l);
    bad += (l != l || l == -NEG_INF) ? 1.0f : 0.0f;
  });
  m = block_max(m, red);
  bad = block_sum(bad, red);
  if (bad > 0.0f || !(m > NEG_INF)) return -NEG_INF;
  float sum = 0.0f;
  for_each_logit(row, vocab, [&](float l, i32) { sum += expf(l - m); });
  return m + logf(block_sum(sum, red));
}

// The top n tokens of the row (no NaN in it) into out: id, then l - lse, for each (step 2).
// One pass per token: each takes the best of those after the last one taken.
__device__ void top_logprobs(const float* row, i32 vocab, i32 n, float lse, u32* out, u32* sk,
                             i32* si) {
  u32 last_k = 0xffffffffu;
  i32 last_i = -1;
  for (i32 j = 0; j < n; ++j) {
    u32 bk = 0u;
    i32 bi = MAX_ID;
    for_each_logit(row, vocab, [&](float l, i32 i) {
      const u32 k = order_key(l);
      const bool after = k < last_k || (k == last_k && i > last_i);
      if (after && better(k, i, bk, bi)) bk = k, bi = i;
    });
    const i32 best = block_argmax(bk, bi, sk, si, 0u);
    if (best >= vocab) return;  // fewer than n tokens
    last_k = order_key(row[best]);
    last_i = best;
    if (threadIdx.x == 0) {
      out[2 * j] = (u32)best;
      out[2 * j + 1] = __float_as_uint(row[best] - lse);
    }
  }
}

// Token t's logit after the penalties, for a token seen `count` times in the output (step 3).
__device__ __forceinline__ float penalized(float l, const DrawExtra& x, i32 count) {
  if (x.repetition != 1.0f)
    l = l > 0.0f ? __fdiv_rn(l, x.repetition) : __fmul_rn(l, x.repetition);
  if (count > 0 && (x.presence != 0.0f || x.frequency != 0.0f))
    l = __fsub_rn(l, __fadd_rn(x.presence, __fmul_rn(x.frequency, (float)count)));
  return l;
}

// The bias and the penalties on the row (step 3); returns the pending token (-1: none).
// `flag`: an i32 of shared memory. Synchronizes before it writes the row, and after.
__device__ i32 adjust(float* row, i32 vocab, const DrawExtra& x, const i32* seen, const i32* ids,
                      i32* flag) {
  const i32 pending = x.pending >= 0 ? ids[x.pending] : -1;
  const i32* pairs = seen + 2 * (i64)x.seen_at;
  const i32* bias = seen + 2 * (i64)x.bias_at;
  if (threadIdx.x == 0) *flag = 0;
  __syncthreads();  // and every thread is done reading the row as it was
  for (i32 j = threadIdx.x; j < x.bias_len; j += blockDim.x) {
    const i32 t = bias[2 * j];
    if (t >= 0 && t < vocab) row[t] = __fadd_rn(row[t], __int_as_float(bias[2 * j + 1]));
  }
  __syncthreads();  // a biased token may be penalized by another thread
  for (i32 j = threadIdx.x; j < x.seen_len; j += blockDim.x)
    if (pairs[2 * j] == pending) *flag = 1;
  __syncthreads();
  for (i32 j = threadIdx.x; j < x.seen_len; j += blockDim.x) {
    const i32 t = pairs[2 * j];
    if (t >= 0 && t < vocab) row[t] = penalized(row[t], x, pairs[2 * j + 1] + (t == pending));
  }
  if (threadIdx.x == 0 && !*flag && pending >= 0 && pending < vocab)
    row[pending] = penalized(row[pending], x, 1);
  __syncthreads();
  return pending;
}

// Token id's logit before the adjustments, from the adjusted row (step 5): how often the
// output holds it and whether it was seen at all, from the pairs and the pending token, and
// its bias.
__device__ float raw_logit(const float* row, i32 id, const DrawExtra& x, const i32* seen,
                           i32 pending, float* red) {
  const i32* pairs = seen + 2 * (i64)x.seen_at;
  const i32* bias = seen + 2 * (i64)x.bias_at;
  // at: 1 + the index of id's bias pair (0: none). Its index, not its value, is summed over
  // the block: a sum with the others' zeros would turn a -0 bias into +0.
  float count = 0.0f, seen_it = 0.0f, at = 0.0f;
  for (i32 j = threadIdx.x; j < x.seen_len; j += blockDim.x)
    if (pairs[2 * j] == id) count += (float)pairs[2 * j + 1], seen_it = 1.0f;
  for (i32 j = threadIdx.x; j < x.bias_len; j += blockDim.x)
    if (bias[2 * j] == id) at = (float)(j + 1);
  count = block_sum(count, red) + (id == pending ? 1.0f : 0.0f);
  seen_it = block_sum(seen_it, red) + (id == pending ? 1.0f : 0.0f);
  at = block_sum(at, red);  // one term at most, below 2^24: exact
  float l = row[id];
  if (count > 0.0f) l = __fadd_rn(l, __fadd_rn(x.presence, __fmul_rn(x.frequency, count)));
  if (x.repetition != 1.0f && seen_it > 0.0f)
    l = l > 0.0f ? __fmul_rn(l, x.repetition) : __fdiv_rn(l, x.repetition);
  return at > 0.0f ? __fsub_rn(l, __int_as_float(bias[2 * ((i32)at - 1) + 1])) : l;
}

// Launch: grid n_seqs (exactly: block b draws row b), block 1024 (a multiple of 32 up to
// 1024), no dynamic shared memory. As `sample_f32` (same arguments first, same draws), and:
// extra_of_row[b]: the index of row b's DrawExtra in `extras`, or -1 for a plain draw (as
// `sample_f32`'s); seen: the extras' (token, output count) pairs and (token, bias bits) pairs,
// i32, each row's tokens distinct in each; ids: the step's input ids (for `pending`); lp_out:
// LP_WORDS u32 per extra, the drawn token's logprob (f32 bits) then the top `logprobs` (id,
// f32 logprob bits) pairs, for extras asking for logprobs. The logits of extra rows are
// adjusted in place. A row with extras and no distribution draws MAX_ID and writes no
// logprobs.
extern "C" __global__ void __launch_bounds__(SAMPLE_BLOCK)
    sample_extras_f32(i32* out_ids, float* logits, i32 vocab, const float* temperature,
                      const i32* top_k, const float* top_p, const float* min_p,
                      const u64* seeds, const u64* steps, const i32* extra_of_row,
                      const DrawExtra* extras, const i32* seen, const i32* ids, u32* lp_out) {
  __shared__ float red[32];
  __shared__ u32 sk[32];
  __shared__ i32 si[32];
  __shared__ i32 found;
  const i32 e = extra_of_row[blockIdx.x];
  if (e < 0) {
    sample_row(out_ids, logits, vocab, temperature, top_k, top_p, min_p, seeds, steps);
    return;
  }
  const DrawExtra x = extras[e];
  float* row = logits + (i64)blockIdx.x * vocab;
  u32* out = lp_out + (i64)e * LP_WORDS;
  const float lse = row_lse(row, vocab, red);
  if (lse == -NEG_INF) {
    if (threadIdx.x == 0) out_ids[blockIdx.x] = MAX_ID;
    return;
  }
  if (x.logprobs > 0)
    top_logprobs(row, vocab, min(x.logprobs, MAX_LOGPROBS), lse, out + 1, sk, si);
  const i32 pending = adjust(row, vocab, x, seen, ids, &found);
  sample_row(out_ids, logits, vocab, temperature, top_k, top_p, min_p, seeds, steps);
  __syncthreads();  // the draw thread 0 wrote, and the row every thread read
  const i32 id = out_ids[blockIdx.x];
  if (x.logprobs >= 0 && id >= 0 && id < vocab) {
    const float l = raw_logit(row, id, x, seen, pending, red);
    if (threadIdx.x == 0) out[0] = __float_as_uint(l - lse);
  }
}

// Launch: grid n_seqs (exactly: block b samples row b), block 1024 (any multiple of 32 up to
// 1024 works; 1024 is fastest), no dynamic shared memory.
// logits: [n_seqs, vocab] f32 contiguous, 1 <= vocab < 2^24 (262144 in practice); read only.
// Per sequence: temperature (<= 0 or NaN: greedy argmax, lowest index on ties), top_k (<= 0:
// off), top_p (>= 1: off; valid (0, 1)), min_p (<= 0: off; valid (0, 1]), seeds and steps
// (the random stream is a function of (seed, step, token id) only: pass a new step for every
// draw of a request). out_ids: [n_seqs]. A row whose largest logit is ±inf or that is all NaN
// yields its argmax (0 when all NaN), whatever the parameters.
extern "C" __global__ void __launch_bounds__(SAMPLE_BLOCK)
    sample_f32(i32* out_ids, const float* logits, i32 vocab, const float* temperature,
               const i32* top_k, const float* top_p, const float* min_p, const u64* seeds,
               const u64* steps) {
  sample_row(out_ids, logits, vocab, temperature, top_k, top_p, min_p, seeds, steps);
}

// Launch: grid n_seqs (exactly), block 1024 (any multiple of 32 up to 1024), no dynamic shared
// memory. logits: [n_seqs, vocab] f32 contiguous, vocab >= 1. out_ids[b] = the CPU's
// argmax(row b): first index of the largest value; 0 when row[0] is NaN or all are NaN.
extern "C" __global__ void __launch_bounds__(SAMPLE_BLOCK)
    argmax_f32(i32* out_ids, const float* logits, i32 vocab) {
  __shared__ float sv[32];
  __shared__ i32 si[32];
  float max;
  const i32 best = row_argmax(logits + (i64)blockIdx.x * vocab, vocab, sv, si, max);
  if (threadIdx.x == 0) out_ids[blockIdx.x] = best;
}

// mask_logits_f32(logits, mask, vocab, words): a grammar's bitmask applied to each row before
// sampling, as the CPU's apply_mask does it: logit i of row r becomes -inf unless bit i % 32 of
// mask[r * words + i / 32] is set. grid any (rows strided), block a multiple of 32 up to 1024;
// logits [rows = gridDim-strided count][vocab], words >= ceil(vocab / 32).
extern "C" __global__ void __launch_bounds__(1024)
    mask_logits_f32(float* logits, const u32* mask, i32 vocab, i32 words, i32 rows) {
  for (i32 r = blockIdx.x; r < rows; r += gridDim.x) {
    float* row = logits + (i64)r * vocab;
    const u32* m = mask + (i64)r * words;
    for (i32 i = threadIdx.x; i < vocab; i += blockDim.x)
      if (!((m[i >> 5] >> (i & 31)) & 1u)) row[i] = NEG_INF;
  }
}
