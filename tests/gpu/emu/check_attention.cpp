// Decode attention under the CPU emulation (emu.h): attention.cu's one-launch decode (each
// partition's block counts itself in; the last of a (sequence, kv head) combines them) against
// an f64 softmax over the paged cache, for short and long contexts, a sliding window, GQA groups
// smaller than and equal to a pass, head sizes 64 and 128; launched twice, as a graph replays
// it, for the same bits and counters back at zero.
#define ATTN_HD 64
#include "attention.cu"

#include "check.h"

template <typename T>
static const char* name() {
  return std::is_same<T, f16>::value ? "f16" : "bf16";
}

template <typename T, int HD>
static void decode_case(int n_heads, int kv_heads, int head_dim, std::vector<int> ctx, int window) {
  const int bs = 16, seqs = (int)ctx.size(), group = n_heads / kv_heads;
  const int q_stride = n_heads * head_dim + 64, out_stride = n_heads * head_dim + 8;
  const int longest = *std::max_element(ctx.begin(), ctx.end());
  const int n_parts = std::max((longest + 255) / 256, 16);  // attention.rs decode_parts
  int max_blocks = (longest + bs - 1) / bs, total_blocks = 0;
  for (int c : ctx) total_blocks += (c + bs - 1) / bs;
  Rng rng(n_heads * 131 + head_dim + longest);
  // Block tables: every sequence's blocks scattered over the cache.
  std::vector<int> perm(total_blocks);
  for (int i = 0; i < total_blocks; ++i) perm[i] = i;
  for (int i = total_blocks - 1; i > 0; --i) std::swap(perm[i], perm[rng.next() % (i + 1)]);
  std::vector<i32> tables(seqs * max_blocks, 0);
  for (int s = 0, used = 0; s < seqs; ++s)
    for (int b = 0; b < (ctx[s] + bs - 1) / bs; ++b) tables[s * max_blocks + b] = perm[used++];
  const int row = kv_heads * head_dim;
  auto bits = [](const std::vector<float>& v) {
    std::vector<T> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = from_f32<T>(v[i]);
    return b;
  };
  const auto q = bits(rng.floats(seqs * q_stride, 1.0f));
  const auto k = bits(rng.floats(total_blocks * bs * row, 1.0f));
  const auto v = bits(rng.floats(total_blocks * bs * row, 1.0f));
  const std::vector<i32> lens(ctx.begin(), ctx.end());
  const float scale = 1.0f / std::sqrt((float)head_dim);
  std::vector<float> part_out(seqs * n_heads * n_parts * head_dim), part_max(seqs * n_heads * n_parts),
      part_sum(part_max.size());
  std::vector<unsigned> counters(seqs * kv_heads, 0);
  std::vector<T> out[2];
  for (auto& o : out) {
    o.assign(seqs * out_stride, from_f32<T>(0.0f));
    emu_launch({(unsigned)kv_heads, (unsigned)seqs, (unsigned)n_parts}, attn::DEC_THREADS, [&] {
      attn::decode<T, HD>(o.data(), out_stride, counters.data(), part_out.data(),
                          part_max.data(), part_sum.data(), q.data(), q_stride, k.data(),
                          v.data(), tables.data(), max_blocks, lens.data(), n_heads, kv_heads,
                          head_dim, bs, scale, 0.0f, window, 256, n_parts);
    });
  }
  std::string what = std::string("attention_decode hd") + std::to_string(HD) + " " + name<T>() +
                     " heads " + std::to_string(n_heads) + "/" + std::to_string(kv_heads) +
                     " head_dim " + std::to_string(head_dim) + " ctx";
  for (int c : ctx) what += " " + std::to_string(c);
  if (window) what += " window " + std::to_string(window);
  Check c(what);
  for (unsigned n : counters) c.expect(n == 0, "a counter left nonzero", 0, (int)n);
  for (int s = 0; s < seqs; ++s)
    for (int h = 0; h < n_heads; ++h) {
      const int kvh = h / group, lo = window > 0 ? std::max(0, ctx[s] - window) : 0;
      std::vector<double> p;
      double mx = -1e300, sum = 0;
      for (int pos = lo; pos < ctx[s]; ++pos) {
        const int slot = tables[s * max_blocks + pos / bs] * bs + pos % bs;
        double d = 0;
        for (int e = 0; e < head_dim; ++e)
          d += (double)to_f32(q[s * q_stride + h * head_dim + e]) * scale *
               to_f32(k[(size_t)slot * row + kvh * head_dim + e]);
        p.push_back(d);
        mx = std::max(mx, d);
      }
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int e = 0; e < head_dim; ++e) {
        double want = 0, mag = 0;
        for (int pos = lo; pos < ctx[s]; ++pos) {
          const int slot = tables[s * max_blocks + pos / bs] * bs + pos % bs;
          const double t = p[pos - lo] / sum * to_f32(v[(size_t)slot * row + kvh * head_dim + e]);
          want += t, mag += std::fabs(t);
        }
        const int at = s * out_stride + h * head_dim + e;
        c.expect(out[0][at].bits == out[1][at].bits, "a second launch gave other bits", s, at);
        // f32 scores, __expf and partition sums: a few parts in 10^5 of the terms' magnitude.
        c.close(to_f32(out[1][at]), want, 20 * mag, ulp<T>(want), s, h * head_dim + e);
      }
    }
}

int main() {
  decode_case<f16, 64>(6, 2, 64, {1, 37, 200, 700}, 0);
  decode_case<bf16, 64>(6, 2, 64, {1, 37, 200, 700}, 0);
  decode_case<f16, 64>(9, 3, 64, {513, 90}, 100);
  decode_case<f16, 128>(8, 2, 128, {5, 300}, 0);
  decode_case<bf16, 128>(8, 1, 128, {129}, 0);
  return Check::report();
}
