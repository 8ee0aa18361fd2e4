// W8A8 under the CPU emulation (emu.h): w8a8.cu's per-token int8 rounding, its decode tile
// (k split among a block's warps, m <= 8) and prefill tile (64 tokens a warp), and the scale
// kernel that follows cuBLASLt's i32 products, against the CPU's arithmetic bit for bit:
// q = round-half-away(x * 127 / max|x|), out = T(xs * ws * (float)sum).
#include "w8a8.cu"

#include "check.h"

template <typename T>
static const char* name() {
  return std::is_same<T, f16>::value ? "f16" : "bf16";
}

template <typename T>
static void w8a8_case(int m, int n, int k) {
  Rng rng(m * 1009 + n * 17 + k);
  std::vector<T> x(m * k);
  const auto xf = rng.floats(m * k, 2.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = from_f32<T>(xf[i]);
  if (m > 2)
    for (int i = 0; i < k; ++i) x[2 * k + i] = from_f32<T>(0.0f);  // an all-zero row
  std::vector<u8> w(n * k);
  for (auto& b : w) b = (u8)(rng.next() % 255 + 129);  // -127..127 as bytes, -128 never drawn
  for (int j = 0; j < n; j += 7) w[j * k] = 0x80;      // and some -128s
  std::vector<float> ws = rng.floats(n, 0.01f);
  for (auto& s : ws) s = std::fabs(s) + 1e-4f;
  std::vector<u8> q(m * k);
  std::vector<float> xs(m);
  emu_launch({(unsigned)m, 1, 1}, 256, [&] { w8a8::quantize<T>(q.data(), xs.data(), x.data(), m, k); });
  // The CPU's rounding.
  Check cq(std::string("w8a8_quantize ") + name<T>() + " m=" + std::to_string(m) + " k=" +
           std::to_string(k));
  std::vector<i32> sums(m * n, 0);
  for (int i = 0; i < m; ++i) {
    float amax = 0;
    for (int c = 0; c < k; ++c) amax = std::max(amax, std::fabs(to_f32(x[i * k + c])));
    const float inv = amax > 0 ? 127.0f / amax : 0.0f;
    cq.expect(xs[i] == (amax > 0 ? amax / 127.0f : 0.0f), "scale", i, 0);
    for (int c = 0; c < k; ++c) {
      const float v = std::fmin(std::fmax(std::round(to_f32(x[i * k + c]) * inv), -127.0f), 127.0f);
      cq.expect((signed char)q[i * k + c] == (signed char)(int)v, "code", i, c);
    }
    for (int j = 0; j < n; ++j)
      for (int c = 0; c < k; ++c) sums[i * n + j] += (signed char)q[i * k + c] * (signed char)w[j * k + c];
  }
  auto want = [&](int i, int j) { return from_f32<T>(xs[i] * ws[j] * (float)sums[i * n + j]).bits; };
  const bool decode = m <= 8;
  std::vector<T> out(m * n);
  const unsigned gx = decode ? (n + 15) / 16 : (n + 63) / 64, gy = decode ? 1 : (m + 63) / 64;
  emu_launch({gx, gy, 1}, 32 * tile8::WARPS, [&] {
    if (decode)
      w8a8::gemm<T, 1>(out.data(), q.data(), xs.data(), w.data(), ws.data(), m, n, k);
    else
      w8a8::gemm<T, 8>(out.data(), q.data(), xs.data(), w.data(), ws.data(), m, n, k);
  });
  Check cg(std::string("w8a8_gemm_t") + (decode ? "1 " : "8 ") + name<T>() + " m=" +
           std::to_string(m) + " " + std::to_string(n) + "x" + std::to_string(k));
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) cg.expect(out[i * n + j].bits == want(i, j), "not the CPU's bits", i, j);
  std::vector<T> scaled(m * n);
  emu_launch({4, 1, 1}, 256, [&] { w8a8::scale<T>(scaled.data(), sums.data(), xs.data(), ws.data(), m, n); });
  Check cs(std::string("w8a8_scale ") + name<T>() + " m=" + std::to_string(m));
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) cs.expect(scaled[i * n + j].bits == want(i, j), "not the CPU's bits", i, j);
}

int main() {
  for (int m : {1, 5, 8}) w8a8_case<f16>(m, 40, 576);
  w8a8_case<bf16>(3, 33, 1024);
  w8a8_case<f16>(9, 70, 128);
  w8a8_case<bf16>(70, 20, 256);
  return Check::report();
}
