// norm.cu's int8 output under the CPU emulation (emu.h): rms_norm and add_rms_norm rounding their
// output to int8 in the same launch give the codes and scales w8a8.cu's quantize makes from
// that output, bit for bit (and the same output and residual as without it).
#include "norm.cu"
#include "w8a8.cu"

#include "check.h"

template <typename T, int MODE>
static void norm_case(int rows, int hidden, bool vec) {
  Rng rng(rows * 3 + hidden + MODE);
  auto bits = [](const std::vector<float>& v) {
    std::vector<T> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = from_f32<T>(v[i]);
    return b;
  };
  const auto x = bits(rng.floats(rows * hidden, 2.0f)), w = bits(rng.floats(hidden, 1.0f));
  const auto res0 = bits(rng.floats(rows * hidden, 1.0f));
  std::vector<T> out[2] = {std::vector<T>(rows * hidden), std::vector<T>(rows * hidden)};
  std::vector<T> res[2] = {res0, res0};
  std::vector<u8> q[2] = {std::vector<u8>(rows * hidden), std::vector<u8>(rows * hidden)};
  std::vector<float> s[2] = {std::vector<float>(rows), std::vector<float>(rows)};
  for (int fused = 0; fused < 2; ++fused) {
    emu_launch({(unsigned)rows, 1, 1}, 256, [&] {
      const T* xp = x.data();
      // Scalar path: a misaligned weight pointer would do too, but the stride is simpler.
      norm_rows<T, MODE, 1>(out[fused].data(), res[fused].data(), xp, hidden, w.data(), rows,
                            hidden, 1e-5f, 0.0f, fused ? q[1].data() : nullptr,
                            fused ? s[1].data() : nullptr);
    });
    if (vec && fused) {  // the vector path as well, into fresh buffers
      std::vector<T> o2(rows * hidden), r2 = res0;
      std::vector<u8> q2(rows * hidden);
      std::vector<float> s2(rows);
      emu_launch({(unsigned)rows, 1, 1}, 256, [&] {
        norm_rows<T, MODE, 8>(o2.data(), r2.data(), x.data(), hidden, w.data(), rows, hidden,
                              1e-5f, 0.0f, q2.data(), s2.data());
      });
      Check c("rms_norm int8 vector path mode " + std::to_string(MODE));
      for (int i = 0; i < rows * hidden; ++i) c.expect(q2[i] == q[1][i], "codes", i / hidden, i % hidden);
      for (int r = 0; r < rows; ++r) c.expect(s2[r] == s[1][r], "scale", r, 0);
    }
  }
  emu_launch({(unsigned)rows, 1, 1}, 256, [&] {
    w8a8::quantize<T>(q[0].data(), s[0].data(), out[0].data(), rows, hidden);
  });
  Check c("rms_norm int8 mode " + std::to_string(MODE) + " " + std::to_string(rows) + "x" +
          std::to_string(hidden));
  for (int i = 0; i < rows * hidden; ++i) {
    c.expect(out[0][i].bits == out[1][i].bits, "output", i / hidden, i % hidden);
    c.expect(res[0][i].bits == res[1][i].bits, "residual", i / hidden, i % hidden);
    c.expect(q[0][i] == q[1][i], "codes", i / hidden, i % hidden);
  }
  for (int r = 0; r < rows; ++r) c.expect(s[0][r] == s[1][r], "scale", r, 0);
}

int main() {
  norm_case<f16, NORM>(5, 576, true);
  norm_case<bf16, ADD_NORM>(3, 1024, true);
  norm_case<f16, ADD_NORM>(2, 100, false);
  return Check::report();
}
