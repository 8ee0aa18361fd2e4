// embedding.cu's carry_ids under the CPU emulation (emu.h): a chained step's input ids take
// the draws of the step before where its pairs say (placeholders among prompt tokens, more
// pairs than threads), a draw outside the vocabulary becomes token 0, and the embedding after
// it reads the rows of the ids it was given.
#include "embedding.cu"

#include "check.h"

int main() {
  const int vocab = 50, hidden = 16, tokens = 300, n = 90;
  Rng rng(9);
  std::vector<i32> ids(tokens), drawn(n), pairs(2 * n);
  for (int t = 0; t < tokens; ++t) ids[t] = (int)(rng.next() % vocab);
  for (int i = 0; i < n; ++i) {
    drawn[i] = (int)(rng.next() % vocab);
    pairs[2 * i] = 3 * i + 1;      // every third token is a placeholder
    pairs[2 * i + 1] = n - 1 - i;  // rows in another order than the tokens
  }
  drawn[4] = 0x7fffffff;  // argmax over a row of NaN
  drawn[7] = -3;
  std::vector<i32> want = ids;
  for (int i = 0; i < n; ++i) {
    const i32 d = drawn[pairs[2 * i + 1]];
    want[pairs[2 * i]] = d >= 0 && d < vocab ? d : 0;
  }
  emu_launch({1, 1, 1}, 64, [&] { carry_ids(ids.data(), drawn.data(), pairs.data(), n, vocab); });
  std::vector<f16> table(vocab * hidden), out(tokens * hidden);
  const auto f = rng.floats(table.size(), 1.0f);
  for (size_t i = 0; i < table.size(); ++i) table[i] = from_f32<f16>(f[i]);
  emu_launch({1, (unsigned)tokens, 1}, 256, [&] {
    embedding_f16(out.data(), table.data(), ids.data(), tokens, hidden, 1.0f);
  });
  Check c("carry_ids: 90 draws into 300 ids, two outside the vocabulary, then the embedding");
  for (int t = 0; t < tokens; ++t) {
    c.expect(ids[t] == want[t], "input id", t, ids[t]);
    for (int h = 0; h < hidden; ++h)
      c.expect(out[t * hidden + h].bits == table[want[t] * hidden + h].bits, "embedding row", t, h);
  }
  return Check::report();
}
