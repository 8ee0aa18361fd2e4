// sampling.cu's grammar masking under the CPU emulation (emu.h): mask_logits_f32 leaves the
// allowed logits of each row as they are and makes the others -inf, as the CPU sampler's
// apply_mask does; argmax_f32 after it picks the best allowed token.
#include "sampling.cu"

#include "check.h"

int main() {
  const int rows = 3, vocab = 1000, words = (vocab + 31) / 32;
  Rng rng(5);
  const std::vector<float> logits0 = rng.floats(rows * vocab, 5.0f);
  std::vector<u32> mask(rows * words, 0);
  for (int r = 0; r < rows; ++r)
    for (int i = 0; i < vocab; ++i)
      if (rng.next() % (r + 2) == 0) mask[r * words + i / 32] |= 1u << (i % 32);
  std::vector<float> logits = logits0;
  emu_launch({2, 1, 1}, 256, [&] { mask_logits_f32(logits.data(), mask.data(), vocab, words, rows); });
  std::vector<i32> ids(rows);
  emu_launch({rows, 1, 1}, 1024, [&] { argmax_f32(ids.data(), logits.data(), vocab); });
  Check c("mask_logits then argmax, 3 rows of 1000");
  for (int r = 0; r < rows; ++r) {
    int best = -1;
    for (int i = 0; i < vocab; ++i) {
      const bool allowed = (mask[r * words + i / 32] >> (i % 32)) & 1;
      const float got = logits[r * vocab + i];
      c.expect(allowed ? got == logits0[r * vocab + i] : got == -INFINITY, "masked logit", r, i);
      if (allowed && (best < 0 || logits0[r * vocab + i] > logits0[r * vocab + best])) best = i;
    }
    c.expect(ids[r] == best, "argmax after the mask", r, ids[r]);
  }
  return Check::report();
}
