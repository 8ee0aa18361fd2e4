// rope.cu's launch that also writes the KV cache, under the CPU emulation (emu.h), against the
// two launches it replaces (rope without a cache, then kv_cache.cu's kv_write): the same q and
// the same caches bit for bit, with padding slots, partial rotary dims, both pairings, rows
// that take the 16-byte and the element copies, and no rotation at all (rope_dim 0: q and k
// as they were). And the rotation scaled by YaRN's or LongRoPE's
// attention factor against an f64 reference.
#include "kv_cache.cu"
#include "rope.cu"

#include "check.h"

template <typename T>
static void rope_cache_case(int heads, int kv_heads, int head_dim, int rope_dim, int adjacent,
                            int pad) {
  const std::vector<i32> slots = {5, 39, -1, 16, 0}, positions = {3, 700, 0, 12, 4095};
  const int tokens = (int)slots.size(), kv_w = kv_heads * head_dim;
  const int stride = heads * head_dim + 2 * kv_w + pad, n = 40 * kv_w;
  Rng rng(heads * 7 + head_dim + rope_dim + adjacent + pad);
  std::vector<T> src(tokens * stride);
  const auto f = rng.floats(src.size(), 1.0f);
  for (size_t i = 0; i < src.size(); ++i) src[i] = from_f32<T>(f[i]);
  std::vector<float> inv_freq(rope_dim / 2);
  for (int i = 0; i < rope_dim / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / rope_dim);
  std::vector<T> q[2] = {src, src}, kc[2], vc[2];
  for (int fused = 0; fused < 2; ++fused) {
    kc[fused].assign(n, from_f32<T>(0.0f));
    vc[fused].assign(n, from_f32<T>(0.0f));
    T* base = q[fused].data();
    T *k = base + heads * head_dim, *v = k + kv_w;
    const CacheDest<T> none{nullptr, nullptr, nullptr, 0, nullptr};
    const CacheDest<T> dest{kc[fused].data(), vc[fused].data(), v, stride, slots.data()};
    emu_launch({(unsigned)tokens, 1, 1}, 256, [&] {
      rope(base, stride, k, stride, positions.data(), inv_freq.data(), tokens, heads, kv_heads,
           head_dim, rope_dim, 1.0f, 1.0f, adjacent, fused ? dest : none);
    });
    if (!fused)
      emu_launch({1, (unsigned)tokens, 1}, 256, [&] {
        kv_write(kc[0].data(), vc[0].data(), k, stride, v, stride, slots.data(), tokens, kv_heads,
                 head_dim);
      });
  }
  Check c("rope_then_cache heads " + std::to_string(heads) + "/" + std::to_string(kv_heads) +
          " rope_dim " + std::to_string(rope_dim) + (adjacent ? " adjacent" : " halves") +
          (pad ? " unaligned rows" : ""));
  auto same = [&](const std::vector<T>& a, const std::vector<T>& b, const char* what) {
    for (size_t i = 0; i < a.size(); ++i) c.expect(a[i].bits == b[i].bits, what, 0, (int)i);
  };
  same(q[0], q[1], "q or k in the QKV rows");
  if (rope_dim == 0) same(src, q[1], "q or k of a layer without rotation");
  same(kc[0], kc[1], "the K cache");
  same(vc[0], vc[1], "the V cache");
}

// Each rotated pair of q and k times `scale` (cos and sin multiplied by it), against
// (x0 cos - x1 sin) * scale and (x0 sin + x1 cos) * scale in f64 from the same f32 angle; the
// unrotated dimensions as they were.
template <typename T>
static void scaled_case(int heads, int head_dim, int rope_dim, float scale) {
  const std::vector<i32> positions = {3, 700, 0, 12, 4095};
  const int tokens = (int)positions.size(), stride = 2 * heads * head_dim, half = rope_dim / 2;
  Rng rng(heads + head_dim + rope_dim);
  std::vector<T> x(tokens * stride);
  const auto f = rng.floats(x.size(), 1.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = from_f32<T>(f[i]);
  const std::vector<T> before = x;
  std::vector<float> inv_freq(half);
  for (int i = 0; i < half; ++i) inv_freq[i] = std::pow(1e6f, -2.0f * i / rope_dim);
  const CacheDest<T> none{nullptr, nullptr, nullptr, 0, nullptr};
  emu_launch({(unsigned)tokens, 1, 1}, 256, [&] {
    rope(x.data(), stride, x.data() + heads * head_dim, stride, positions.data(),
         inv_freq.data(), tokens, heads, heads, head_dim, rope_dim, 1.0f, scale, 0, none);
  });
  Check c("rope scaled by " + std::to_string(scale) + " rope_dim " + std::to_string(rope_dim) +
          "/" + std::to_string(head_dim));
  const double ulp = std::is_same_v<T, f16> ? 1.0 / 1024 : 1.0 / 128;
  for (int t = 0; t < tokens; ++t)
    for (int h = 0; h < 2 * heads; ++h) {
      const int at = t * stride + h * head_dim;
      for (int i = 0; i < half; ++i) {
        const double a = (double)((float)positions[t] * inv_freq[i]);
        const double x0 = to_f32(before[at + i]), x1 = to_f32(before[at + i + half]);
        const double w0 = (x0 * std::cos(a) - x1 * std::sin(a)) * scale;
        const double w1 = (x0 * std::sin(a) + x1 * std::cos(a)) * scale;
        c.close(to_f32(x[at + i]), w0, 2.0 * scale, std::fabs(w0) * ulp, t, h * head_dim + i);
        c.close(to_f32(x[at + i + half]), w1, 2.0 * scale, std::fabs(w1) * ulp, t, i + half);
      }
      for (int i = rope_dim; i < head_dim; ++i)
        c.expect(x[at + i].bits == before[at + i].bits, "an unrotated dimension moved", t, i);
    }
}

int main() {
  scaled_case<f16>(2, 64, 64, 1.0f);
  scaled_case<f16>(2, 64, 48, 1.1547f);
  scaled_case<bf16>(2, 128, 96, 1.1386f);
  rope_cache_case<f16>(4, 2, 64, 64, 0, 0);
  rope_cache_case<bf16>(4, 2, 64, 48, 1, 0);
  rope_cache_case<f16>(6, 3, 64, 32, 0, 4);  // rows 8 bytes off 16: element copies
  rope_cache_case<bf16>(8, 2, 128, 128, 0, 0);
  rope_cache_case<f16>(4, 2, 64, 0, 0, 0);  // SmolLM3's NoPE layers: the cache write alone
  return Check::report();
}
