// sampling.cu's sample_extras_f32 under the CPU emulation (emu.h), against a reference of the
// CPU sampler's `Sampler::sample` (services/engine/src/sampler.rs) written here: a row with a
// NaN, a +inf or nothing above -inf draws MAX_ID and is left alone; otherwise the raw row's
// log-sum-exp and top logprobs (total order: +0 above -0, ties to the smaller id), then the
// logit bias (l + b, tokens outside the vocabulary skipped) and after it the repetition /
// presence / frequency penalties over the (token, output count) pairs and the pending token,
// in place and bit for bit, the draw from the adjusted row (greedy: first maximum; sampled:
// what sample_f32 draws from the reference's adjusted row), and the drawn token's logprob with
// its penalties, then its bias, undone. Rows without extras draw what sample_f32 draws and
// keep their logits. Launches mix plain and extra rows, over vocabularies of 1000 (the float4
// path), 1001 and 7 (the scalar one), with the records packed out of row order and the bias
// pairs after the seen pairs, after decoy pairs, or before them (bias_at its own index).
#include "sampling.cu"

#include <algorithm>
#include <climits>
#include <string>

#include "check.h"

static_assert(sizeof(DrawExtra) == 48, "DrawExtra is 48 bytes");

namespace {

constexpr u32 SENTINEL = 0xDEADBEEFu;
constexpr int kMaxTop = 20, kWords = 1 + 2 * kMaxTop, kRecordWords = 12;

struct Row {
  std::string what;
  std::vector<float> logits;  // raw
  float temp = 0.0f, top_p = 1.0f, min_p = 0.0f;
  int top_k = 0;
  u64 seed = 0, step = 0;
  bool extra = false;
  float rep = 1.0f, pres = 0.0f, freq = 0.0f;
  std::vector<std::pair<i32, i32>> pairs;  // (token, output count) as the host packs them
  int pending = -1;                        // index into the launch's ids
  int logprobs = -1;
  std::vector<std::pair<i32, float>> bias;  // (token, bias), added before the penalties
  int gap = 0;              // decoy pairs between its seen pairs and its biases
  bool bias_first = false;  // its biases packed before its seen pairs
  int built_for = -1;       // the draw the case is built around (-1: none), the reference's
};

float bits_f(u32 b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
u32 f_bits(float f) {
  u32 b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Rust's f32::total_cmp as a signed key: flip the magnitude bits of negatives.
int32_t total_key(float f) {
  int32_t k = (int32_t)f_bits(f);
  return k ^ (int32_t)((uint32_t)(k >> 31) >> 1);
}

// log_sum_exp(...).is_finite() fails: a NaN, a +inf, or no value above -inf.
bool no_distribution(const std::vector<float>& l) {
  bool above = false;
  for (float v : l) {
    if (std::isnan(v) || v == INFINITY) return true;
    if (v > -INFINITY) above = true;
  }
  return !above;
}

double lse_of(const std::vector<float>& l) {
  double m = -INFINITY;
  for (float v : l) m = std::max(m, (double)v);
  double s = 0.0;
  for (float v : l) s += std::exp((double)v - m);
  return m + std::log(s);
}

// top_by_logit: the n largest by total order, larger first, ties to the smaller id.
std::vector<u32> top_ids(const std::vector<float>& l, int n) {
  std::vector<u32> idx(l.size());
  for (u32 i = 0; i < idx.size(); ++i) idx[i] = i;
  std::stable_sort(idx.begin(), idx.end(), [&](u32 a, u32 b) {
    const int32_t ka = total_key(l[a]), kb = total_key(l[b]);
    return ka != kb ? ka > kb : a < b;
  });
  idx.resize(std::min<size_t>(n, idx.size()));
  return idx;
}

// seen_with: the pairs (tokens as the CPU's u32) with one more output occurrence of `pending`.
std::vector<std::pair<u32, u32>> seen_of(const Row& r, const std::vector<i32>& ids) {
  std::vector<std::pair<u32, u32>> seen;
  for (auto [t, c] : r.pairs) seen.push_back({(u32)t, (u32)c});
  if (r.pending >= 0) {
    const u32 t = (u32)ids[r.pending];
    auto it = std::find_if(seen.begin(), seen.end(), [&](auto& p) { return p.first == t; });
    if (it != seen.end())
      it->second += 1;
    else
      seen.push_back({t, 1});
  }
  return seen;
}

// Adjustments::apply's bias: l + b on each token in the vocabulary (the CPU's tokens are u32:
// a negative one is past every vocabulary).
void bias_ref(std::vector<float>& l, const Row& r) {
  for (auto [t, b] : r.bias) {
    if (t < 0 || (size_t)t >= l.size()) continue;
    l[t] = l[t] + b;
  }
}

// Adjustments::apply's penalties, one f32 rounding per operation.
void penalize_ref(std::vector<float>& l, const Row& r, const std::vector<std::pair<u32, u32>>& seen) {
  const bool by_count = r.pres != 0.0f || r.freq != 0.0f;
  for (auto [t, c] : seen) {
    if (t >= l.size()) continue;
    float v = l[t];
    if (r.rep != 1.0f) {
      if (v > 0.0f) {
        v = v / r.rep;
      } else {
        v = v * r.rep;
      }
    }
    if (by_count && c > 0) {
      const float fc = r.freq * (float)c;
      const float sub = r.pres + fc;
      v = v - sub;
    }
    l[t] = v;
  }
}

// Adjustments::raw_logit: the penalties undone for `id`, then its bias.
float raw_logit_ref(u32 id, const std::vector<float>& adj, const Row& r,
                    const std::vector<std::pair<u32, u32>>& seen) {
  float v = adj[id];
  auto it = std::find_if(seen.begin(), seen.end(), [&](auto& p) { return p.first == id; });
  if (it != seen.end()) {
    if (it->second > 0) {
      const float fc = r.freq * (float)it->second;
      const float add = r.pres + fc;
      v = v + add;
    }
    if (r.rep != 1.0f) {
      if (v > 0.0f) {
        v = v * r.rep;
      } else {
        v = v / r.rep;
      }
    }
  }
  auto b = std::find_if(r.bias.begin(), r.bias.end(), [&](auto& p) { return (u32)p.first == id; });
  if (b != r.bias.end()) v = v - b->second;
  return v;
}

// argmax: the first of the largest.
int first_max(const std::vector<float>& l) {
  int best = 0;
  for (int i = 0; i < (int)l.size(); ++i)
    if (l[i] > l[best]) best = i;
  return best;
}

bool close_lp(float got, double want) {
  if (std::isinf(want)) return got == (float)want;
  return std::fabs((double)got - want) <= 2e-6 * (std::fabs(want) + 4.0) + 1e-7;
}

void run(const char* name, int vocab, std::vector<Row> rows, const std::vector<i32>& ids) {
  const int n = (int)rows.size();
  // Records in reverse row order, pairs in record order, so neither index is the row's. Each
  // record's biases follow its seen pairs (as the host packs them), or follow `gap` decoy
  // pairs (a +64 bias on its first biased token: read by mistake, it moves the row), or come
  // before them.
  std::vector<int> extra_rows;
  for (int r = n - 1; r >= 0; --r)
    if (rows[r].extra) extra_rows.push_back(r);
  const int n_extras = (int)extra_rows.size();
  std::vector<i32> extra_of_row(n, -1), seen;
  std::vector<u32> records(kRecordWords * std::max(n_extras, 1), 0);
  seen.push_back(-7), seen.push_back(3);  // a pair of nobody's, before the first record's
  for (int e = 0; e < n_extras; ++e) {
    const Row& r = rows[extra_rows[e]];
    extra_of_row[extra_rows[e]] = e;
    const auto at = [&] { return (u32)(seen.size() / 2); };
    const auto push_seen = [&] {
      for (auto [t, c] : r.pairs) seen.push_back(t), seen.push_back(c);
    };
    const auto push_bias = [&] {
      for (auto [t, b] : r.bias) seen.push_back(t), seen.push_back((i32)f_bits(b));
    };
    u32 seen_at, bias_at;
    if (r.bias_first) {
      bias_at = at(), push_bias(), seen_at = at(), push_seen();
    } else {
      seen_at = at(), push_seen();
      for (int g = 0; g < r.gap; ++g)
        seen.push_back(r.bias.empty() ? 0 : r.bias[0].first), seen.push_back((i32)f_bits(64.0f));
      bias_at = at(), push_bias();
    }
    u32* w = &records[kRecordWords * e];
    w[0] = f_bits(r.rep), w[1] = f_bits(r.pres), w[2] = f_bits(r.freq);
    w[3] = seen_at, w[4] = (u32)r.pairs.size();
    w[5] = (u32)r.pending, w[6] = (u32)r.logprobs;
    w[7] = bias_at, w[8] = (u32)r.bias.size(), w[9] = w[10] = w[11] = 0;
  }
  std::vector<DrawExtra> extras(std::max(n_extras, 1));
  std::memcpy(extras.data(), records.data(), sizeof(DrawExtra) * extras.size());

  std::vector<float> logits(n * vocab), temp(n), top_p(n), min_p(n);
  std::vector<i32> top_k(n), got(n, -1), plain(n, -1);
  std::vector<u64> seeds(n), steps(n);
  for (int r = 0; r < n; ++r) {
    if ((int)rows[r].logits.size() != vocab) std::abort();
    std::copy(rows[r].logits.begin(), rows[r].logits.end(), logits.begin() + r * vocab);
    temp[r] = rows[r].temp, top_p[r] = rows[r].top_p, min_p[r] = rows[r].min_p;
    top_k[r] = rows[r].top_k, seeds[r] = rows[r].seed, steps[r] = rows[r].step;
  }

  // The reference: each row as the kernel must leave it, and sample_f32's draws from those.
  std::vector<float> want_logits = logits;
  std::vector<std::vector<std::pair<u32, u32>>> seen_ref(n);
  std::vector<bool> bad(n, false);
  for (int r = 0; r < n; ++r) {
    if (!rows[r].extra) continue;
    bad[r] = no_distribution(rows[r].logits);
    if (bad[r]) continue;
    seen_ref[r] = seen_of(rows[r], ids);
    std::vector<float> adj = rows[r].logits;
    bias_ref(adj, rows[r]);
    penalize_ref(adj, rows[r], seen_ref[r]);
    std::copy(adj.begin(), adj.end(), want_logits.begin() + r * vocab);
  }
  emu_launch({(unsigned)n, 1, 1}, 1024, [&] {
    sample_f32(plain.data(), want_logits.data(), vocab, temp.data(), top_k.data(), top_p.data(),
               min_p.data(), seeds.data(), steps.data());
  });

  std::vector<u32> lp(kWords * std::max(n_extras, 1), SENTINEL);
  emu_launch({(unsigned)n, 1, 1}, 1024, [&] {
    sample_extras_f32(got.data(), logits.data(), vocab, temp.data(), top_k.data(), top_p.data(),
                      min_p.data(), seeds.data(), steps.data(), extra_of_row.data(),
                      extras.data(), seen.data(), ids.data(), lp.data());
  });

  for (int r = 0; r < n; ++r) {
    const Row& row = rows[r];
    Check c(std::string(name) + " row " + std::to_string(r) + ": " + row.what);
    const std::vector<float> want(want_logits.begin() + r * vocab,
                                  want_logits.begin() + (r + 1) * vocab);
    for (int i = 0; i < vocab; ++i)
      c.expect(f_bits(logits[r * vocab + i]) == f_bits(want[i]),
               row.extra && !bad[r] ? "adjusted logit" : "logit untouched", r, i);
    if (!row.extra) {
      c.expect(got[r] == plain[r], "plain row: sample_f32's draw", r, got[r]);
      if (!(row.temp > 0.0f) && !no_distribution(row.logits))
        c.expect(got[r] == first_max(row.logits), "plain row: first maximum", r, got[r]);
      continue;
    }
    const u32* w = &lp[kWords * extra_of_row[r]];
    if (bad[r]) {
      c.expect(got[r] == MAX_ID, "no distribution: MAX_ID", r, got[r]);
      for (int j = 0; j < kWords; ++j) c.expect(w[j] == SENTINEL, "no logprobs written", r, j);
      continue;
    }
    const int want_id = row.temp > 0.0f ? plain[r] : first_max(want);
    c.expect(got[r] == want_id, "draw from the adjusted row", r, got[r]);
    if (row.built_for >= 0)
      c.expect(want_id == row.built_for, "the reference draws what the case is built for", r,
               want_id);
    if (row.temp > 0.0f) c.expect(plain[r] >= 0 && plain[r] < vocab, "a draw at all", r, plain[r]);
    const double lse = lse_of(row.logits);
    const int n_top = row.logprobs > 0 ? std::min({row.logprobs, kMaxTop, vocab}) : 0;
    const int written = row.logprobs >= 0 ? 1 + 2 * n_top : 0;
    if (row.logprobs >= 0 && want_id >= 0 && want_id < vocab) {
      const float raw = raw_logit_ref((u32)want_id, want, row, seen_ref[r]);
      c.expect(close_lp(bits_f(w[0]), (double)raw - lse), "the draw's logprob", r, want_id);
      if (!close_lp(bits_f(w[0]), (double)raw - lse))
        std::printf("    got %.8g want %.8g\n", bits_f(w[0]), (double)raw - lse);
      // The CPU's difference of two equal numbers is +0, whatever their signs.
      if ((double)raw - lse == 0.0)
        c.expect(w[0] == f_bits(0.0f), "a zero logprob is +0, as the CPU's", r, want_id);
    }
    const std::vector<u32> top = top_ids(row.logits, n_top);
    for (int j = 0; j < n_top; ++j) {
      c.expect(w[1 + 2 * j] == top[j], "top id", r, j);
      c.expect(close_lp(bits_f(w[2 + 2 * j]), (double)row.logits[top[j]] - lse), "top logprob",
               r, j);
    }
    for (int j = written; j < kWords; ++j) c.expect(w[j] == SENTINEL, "word past the top", r, j);
  }
  // The records of no row and the words past the extras stay as they were.
  Check c(std::string(name) + ": nothing written outside the extras' words");
  for (size_t j = kWords * n_extras; j < lp.size(); ++j)
    c.expect(lp[j] == SENTINEL, "spare word", -1, (int)j);
}

std::vector<float> uniform(Rng& rng, int vocab, float lo, float hi) {
  std::vector<float> v = rng.floats(vocab, 1.0f);
  for (auto& x : v) x = lo + (hi - lo) * 0.5f * (x + 1.0f);
  return v;
}

}  // namespace

int main() {
  Rng rng(23);
  Rng rb(29);  // the rows with biases: the other rows' logits as they were
  // Launch A: vocab 1000 (float4 path). ids: the step's input ids, for the pending tokens.
  {
    const int V = 1000;
    const std::vector<i32> ids = {5, 17, 999, 78, 4, 40000, 250};
    std::vector<Row> rows(20);

    rows[0].what = "plain greedy";
    rows[0].logits = uniform(rng, V, -5, 5);

    Row& a = rows[1];  // the top token, seen, stays on top: its logprob is undone
    a.what = "repetition only, no pending, logprobs 5, greedy";
    a.logits = uniform(rng, V, -5, 5);
    a.logits[17] = 9.0f, a.logits[400] = 8.5f, a.logits[3] = -2.0f, a.logits[250] = -0.5f;
    a.extra = true, a.rep = 1.3f, a.logprobs = 5;
    a.pairs = {{17, 0}, {400, 2}, {3, 1}, {250, 0}};

    rows[2].what = "plain sampled (T 0.8, top-k 50, top-p 0.9)";
    rows[2].logits = uniform(rng, V, -5, 5);
    rows[2].temp = 0.8f, rows[2].top_k = 50, rows[2].top_p = 0.9f, rows[2].seed = 11;
    rows[2].step = 4;

    Row& b = rows[3];  // 7 - (0.5 + 0.25 * 3) = 5.75 < 5.9; with the pending token lost, 6.0
    b.what = "presence + frequency only, pending among the pairs, logprobs 20, greedy";
    b.logits = uniform(rng, V, -5, 5);
    b.logits[5] = 7.0f, b.logits[6] = 5.9f;
    b.extra = true, b.pres = 0.5f, b.freq = 0.25f, b.logprobs = 20, b.pending = 0;
    b.pairs = {{5, 2}, {999, 0}, {6, 0}, {42, 1}};

    Row& d = rows[4];
    d.what = "all three, pending not among the pairs, logprobs 0, sampled (T 1, k 40, p 0.95, "
             "min-p 0.01)";
    d.logits = uniform(rng, V, -5, 5);
    d.logits[17] = 8.0f, d.logits[100] = 7.9f, d.logits[200] = 7.8f, d.logits[300] = 7.7f;
    d.extra = true, d.rep = 1.2f, d.pres = 0.4f, d.freq = 0.3f, d.logprobs = 0, d.pending = 1;
    d.temp = 1.0f, d.top_k = 40, d.top_p = 0.95f, d.min_p = 0.01f, d.seed = 99, d.step = 7;
    for (int i = 0; i < 30; ++i) d.pairs.push_back({100 + 7 * i, (int)(rng.next() % 4)});
    d.pairs[0].second = 3;

    rows[5].what = "a NaN: no distribution, logprobs 5";
    rows[5].logits = uniform(rng, V, -5, 5);
    rows[5].logits[321] = NAN;
    rows[5].extra = true, rows[5].logprobs = 5, rows[5].rep = 1.5f, rows[5].pairs = {{321, 1}};

    rows[6].what = "a +inf: no distribution, logprobs 20";
    rows[6].logits = uniform(rng, V, -5, 5);
    rows[6].logits[0] = INFINITY;
    rows[6].extra = true, rows[6].logprobs = 20, rows[6].pres = 1.0f, rows[6].pairs = {{0, 2}};
    rows[6].pending = 4;

    rows[7].what = "all -inf: no distribution, logprobs 5";
    rows[7].logits.assign(V, -INFINITY);
    rows[7].extra = true, rows[7].logprobs = 5, rows[7].rep = 2.0f, rows[7].freq = 1.0f;
    rows[7].pairs = {{1, 1}, {2, 0}};

    Row& m = rows[8];  // ties at 2.5 and at ±0 in the top list; half the row masked
    m.what = "-inf mask, ties, +0/-0, pairs outside the vocabulary, all three, logprobs 20, "
             "greedy";
    m.logits = uniform(rng, V, -10, -1);
    for (int i = 0; i < V; ++i)
      if (rng.next() % 2) m.logits[i] = -INFINITY;
    m.logits[3] = m.logits[10] = m.logits[700] = 2.5f;
    m.logits[43] = m.logits[41] = 1.5f;  // a tie within one thread's float4
    m.logits[50] = 0.0f, m.logits[900] = 0.0f, m.logits[20] = -0.0f, m.logits[11] = -INFINITY;
    m.extra = true, m.rep = 1.2f, m.pres = 0.5f, m.freq = 0.25f, m.logprobs = 20;
    m.pairs = {{-5, 3}, {1000, 1}, {5000, 0}, {INT_MIN, 2}, {700, 0}, {3, 1}, {20, 0}, {11, 2},
               {-1, 1}};

    Row& s = rows[9];
    s.what = "all three, no logprobs, pending among the pairs (count 0), sampled (T 0.7, p 0.8)";
    s.logits = uniform(rng, V, -4, 6);
    s.logits[999] = 9.0f, s.logits[998] = 8.9f;
    s.extra = true, s.rep = 1.1f, s.pres = 0.2f, s.freq = 0.1f, s.pending = 2;
    s.temp = 0.7f, s.top_p = 0.8f, s.seed = 5, s.step = 123;
    s.pairs = {{999, 0}, {1, 5}, {998, 1}};

    rows[10].what = "plain row with a NaN (what sample_f32 draws)";
    rows[10].logits = uniform(rng, V, -5, 5);
    rows[10].logits[2] = NAN;

    Row& g = rows[11];  // negative logits: l * r, undone by l / r
    g.what = "repetition only, negative logits, pending among the pairs, logprobs 5, greedy";
    g.logits = uniform(rng, V, -12, -2);
    g.logits[77] = -1.0f;
    g.extra = true, g.rep = 1.1f, g.logprobs = 5, g.pending = 3;
    g.pairs = {{77, 1}, {78, 0}, {79, 2}};

    Row& h = rows[12];  // 10 / 1.2 - (0.5 + 0.5 * 2) = 6.83 stays on top: all three undone
    h.what = "all three, the drawn token twice in the output, logprobs 5, greedy";
    h.logits = uniform(rng, V, -5, 5);
    h.logits[123] = 10.0f;
    h.extra = true, h.rep = 1.2f, h.pres = 0.5f, h.freq = 0.5f, h.logprobs = 5;
    h.pairs = {{123, 2}, {124, 0}};

    // 6 + 3 = 9 ties the argmax at 10 (which the first maximum would keep) and passes 20's 8.5:
    // without the ban the draw is 10, without the +3 it is 20. Its logprob: 6 - lse.
    Row& o = rows[13];
    o.what = "bias only (no penalties, no pairs): +3 lifts 300 to the argmax's 9, -100 bans the "
             "argmax, logprobs 5, greedy, biases after a decoy";
    o.logits = uniform(rb, V, -5, 5);
    o.logits[10] = 9.0f, o.logits[20] = 8.5f, o.logits[300] = 6.0f;
    o.extra = true, o.logprobs = 5, o.gap = 1, o.built_for = 300;
    o.bias = {{10, -100.0f}, {300, 3.0f}};

    Row& x = rows[14];  // the top list is the raw row's: 10 still leads it
    x.what = "a -100 bias bans the argmax, no penalties, pending with nothing to do, logprobs 20, "
             "greedy";
    x.logits = uniform(rb, V, -5, 5);
    x.logits[10] = 9.0f, x.logits[20] = 8.5f;
    x.extra = true, x.logprobs = 20, x.pending = 4, x.built_for = 20;
    x.bias = {{10, -100.0f}};

    // The bias first: -1 + 3 = 2, / 1.5 = 1.33 < 1.4, 60 drawn; the repetition first:
    // -1 * 1.5 + 3 = 1.5 > 1.4, 50 drawn.
    Row& y = rows[15];
    y.what = "bias then repetition on one token (a negative logit made positive: divided), "
             "greedy, logprobs 5, biases after two decoys";
    y.logits = uniform(rb, V, -5, 1);
    y.logits[50] = -1.0f, y.logits[60] = 1.4f;
    y.extra = true, y.rep = 1.5f, y.logprobs = 5, y.gap = 2, y.built_for = 60;
    y.pairs = {{50, 0}, {70, 2}, {80, 1}};
    y.bias = {{50, 3.0f}, {70, -0.5f}};

    // 123: -0.5 + 6 = 5.5, / 1.25 = 4.4, - (0.5 + 0.25 * 3) = 3.15 above the rest (< 3): drawn,
    // each step undone in reverse for its logprob. 1000, -1 and the others: outside (ignored;
    // 1000 would be the next row's first logit). 124: -inf stays -inf.
    Row& z = rows[16];
    z.what = "bias, repetition, presence and frequency on the drawn token, pending among the "
             "pairs and biased, biases outside the vocabulary and on -inf, logprobs 5, greedy";
    z.logits = uniform(rb, V, -5, 3);
    z.logits[123] = -0.5f, z.logits[78] = -3.0f, z.logits[124] = -INFINITY;
    z.extra = true, z.rep = 1.25f, z.pres = 0.5f, z.freq = 0.25f, z.logprobs = 5, z.pending = 3;
    z.pairs = {{123, 3}, {78, 0}, {400, 1}}, z.built_for = 123;
    z.bias = {{-1, 50.0f}, {1000, 50.0f}, {123, 6.0f}, {INT_MIN, 50.0f}, {78, 2.0f},
              {INT_MAX, 50.0f}, {124, 5.0f}, {1024, 50.0f}};

    // 777: -4 + 16 = 12, / 1.2 = 10, far above the rest (< 5): the likely draw; 900 and 901
    // banned; 33: -1 + 2.5 = 1.5, / 1.2, - (0.3 + 0.2).
    Row& q = rows[17];
    q.what = "biases with all three, sampled (T 0.9, k 30, p 0.9), logprobs 3, biases before "
             "the pairs";
    q.logits = uniform(rb, V, -5, 5);
    q.logits[777] = -4.0f, q.logits[900] = 6.0f, q.logits[901] = 5.9f, q.logits[33] = -1.0f;
    q.extra = true, q.rep = 1.2f, q.pres = 0.3f, q.freq = 0.2f, q.logprobs = 3;
    q.temp = 0.9f, q.top_k = 30, q.top_p = 0.9f, q.seed = 4242, q.step = 17;
    q.pairs = {{33, 1}, {777, 0}, {5, 2}};
    q.bias = {{900, -100.0f}, {777, 16.0f}, {901, -100.0f}, {33, 2.5f}};
    q.bias_first = true, q.built_for = 777;

    rows[18].what = "plain sampled (T 1.1)";
    rows[18].logits = uniform(rb, V, -5, 5);
    rows[18].temp = 1.1f, rows[18].seed = 6, rows[18].step = 2;

    Row& nb = rows[19];
    nb.what = "a NaN with biases and penalties: no distribution, nothing biased, logprobs 5";
    nb.logits = uniform(rb, V, -5, 5);
    nb.logits[4] = NAN;
    nb.extra = true, nb.rep = 1.3f, nb.logprobs = 5, nb.pairs = {{7, 1}}, nb.gap = 1;
    nb.bias = {{4, 1.0f}, {7, 2.0f}};

    run("vocab 1000", V, rows, ids);
  }
  // Launch B: vocab 7 (the scalar path), fewer tokens than 20 logprobs.
  {
    const int V = 7;
    const std::vector<i32> ids = {4, 2, 6};
    std::vector<Row> rows(7);
    Row& t = rows[0];
    t.what = "ties, +0/-0 and -inf in a top list longer than the row, all three, pending new";
    t.logits = {1.0f, -INFINITY, 1.0f, -0.0f, 0.0f, 3.0f, -INFINITY};
    t.extra = true, t.rep = 1.5f, t.pres = 0.5f, t.freq = 0.5f, t.logprobs = 20, t.pending = 0;
    t.pairs = {{5, 1}, {2, 0}, {9, 1}};

    Row& u = rows[1];
    u.what = "all three, sampled (T 1.5), logprobs 5, pending among the pairs";
    u.logits = uniform(rng, V, -2, 2);
    u.extra = true, u.rep = 1.3f, u.pres = 0.3f, u.freq = 0.6f, u.logprobs = 5, u.pending = 1;
    u.temp = 1.5f, u.seed = 77, u.step = 1;
    u.pairs = {{2, 1}, {0, 0}, {6, 3}};

    rows[2].what = "plain greedy";
    rows[2].logits = uniform(rng, V, -2, 2);

    rows[3].what = "all -inf: no distribution, logprobs 20";
    rows[3].logits.assign(V, -INFINITY);
    rows[3].extra = true, rows[3].logprobs = 20, rows[3].pending = 2;

    // 4 (pending, new): -0.5 + 2 = 1.5, / 1.5 = 1, - 0.5 = 0.5 above 2's 0.3 / 1.5: drawn.
    // 7: the vocabulary's end (the next row's first logit); 6: a -0 bias.
    Row& v = rows[4];
    v.what = "bias, repetition and presence on the pending token (new), biases outside the "
             "vocabulary, logprobs 20, greedy, biases after a decoy";
    v.logits = {-1.0f, -2.0f, 0.3f, -INFINITY, -0.5f, -3.0f, 0.2f};
    v.extra = true, v.rep = 1.5f, v.pres = 0.5f, v.logprobs = 20, v.pending = 0, v.gap = 1;
    v.pairs = {{2, 0}, {5, 1}}, v.built_for = 4;
    v.bias = {{4, 2.0f}, {7, 9.0f}, {6, -0.0f}, {-3, 9.0f}};

    Row& w = rows[5];  // 3: -inf + 4 stays -inf
    w.what = "biases only, sampled (T 1), logprobs 3: -100 on the argmax, +3 on 1, +4 on -inf";
    w.logits = uniform(rb, V, -2, 2);
    w.logits[0] = 2.5f, w.logits[3] = -INFINITY;
    w.extra = true, w.logprobs = 3, w.temp = 1.0f, w.seed = 31, w.step = 5;
    w.bias = {{0, -100.0f}, {1, 3.0f}, {3, 4.0f}}, w.built_for = 1;

    Row& z = rows[6];
    z.what = "a -0 bias on the one finite logit, -0, drawn: its logprob is +0, as the CPU's";
    z.logits.assign(V, -INFINITY);
    z.logits[2] = -0.0f;
    z.extra = true, z.logprobs = 1, z.bias = {{2, -0.0f}}, z.built_for = 2;

    run("vocab 7", V, rows, ids);
  }
  // Launch C: vocab 1001 (the scalar path).
  {
    const int V = 1001;
    const std::vector<i32> ids = {600, 601, 5000, 1000};
    std::vector<Row> rows(7);
    Row& a = rows[0];
    a.what = "all three, sampled (T 0.9, k 20, min-p 0.05), logprobs 5, pending among the pairs";
    a.logits = uniform(rng, V, -6, 4);
    a.logits[600] = 6.0f, a.logits[10] = 5.8f, a.logits[1000] = 5.7f;
    a.extra = true, a.rep = 1.25f, a.pres = 0.3f, a.freq = 0.2f, a.logprobs = 5, a.pending = 0;
    a.temp = 0.9f, a.top_k = 20, a.min_p = 0.05f, a.seed = 1234, a.step = 9;
    a.pairs = {{600, 1}, {10, 0}, {1000, 2}, {1001, 1}};

    Row& b = rows[1];  // 7 - (0.5 + 1 * 1) = 5.5 < 5.6 < 7: the pending token decides
    b.what = "presence + frequency only, pending not among the pairs, logprobs 20, greedy";
    b.logits = uniform(rng, V, -5, 5);
    b.logits[601] = 7.0f, b.logits[602] = 5.6f;
    b.extra = true, b.pres = 0.5f, b.freq = 1.0f, b.logprobs = 20, b.pending = 1;
    b.pairs = {{602, 0}, {3, 4}};

    rows[2].what = "plain sampled (T 1)";
    rows[2].logits = uniform(rng, V, -5, 5);
    rows[2].temp = 1.0f, rows[2].seed = 3, rows[2].step = 3;

    rows[3].what = "a NaN at the row's end: no distribution, logprobs 5";
    rows[3].logits = uniform(rng, V, -5, 5);
    rows[3].logits[1000] = NAN;
    rows[3].extra = true, rows[3].logprobs = 5;

    Row& e = rows[4];
    e.what = "repetition only, pending outside the vocabulary, sampled (T 1.2), logprobs 0";
    e.logits = uniform(rng, V, -3, 3);
    e.logits[500] = 4.0f, e.logits[501] = 3.9f;
    e.extra = true, e.rep = 1.4f, e.logprobs = 0, e.pending = 2;
    e.temp = 1.2f, e.seed = 8, e.step = 2;
    e.pairs = {{500, 1}, {501, 0}, {502, 3}};

    // 1000 (pending, among the pairs): -2 + 5 = 3, / 1.3, - (0.2 + 0.1 * 2); 3: + 1.5, * or /
    // 1.3 as the bias leaves it; 1001: outside (the next row's first logit).
    Row& f = rows[5];
    f.what = "biases with all three, sampled (T 0.8, min-p 0.1), pending among the pairs and "
             "biased, logprobs 5, biases after the pairs";
    f.logits = uniform(rb, V, -4, 4);
    f.logits[1000] = -2.0f;
    f.extra = true, f.rep = 1.3f, f.pres = 0.2f, f.freq = 0.1f, f.logprobs = 5, f.pending = 3;
    f.temp = 0.8f, f.min_p = 0.1f, f.seed = 555, f.step = 40;
    f.pairs = {{1000, 1}, {3, 0}};
    f.bias = {{1000, 5.0f}, {3, 1.5f}, {1001, 40.0f}};

    rows[6].what = "plain greedy";
    rows[6].logits = uniform(rb, V, -5, 5);

    run("vocab 1001", V, rows, ids);
  }
  return Check::report();
}
