// FP8 (e4m3) under the CPU emulation (emu.h): fp8.cu's activation rounding (s = max|x| / 448
// per run, codes e4m3(x / s)) and its decode and prefill tiles against an f64 product of the
// decoded codes times their scales, for per-channel, per-tensor and 128 x 128 block weights
// with per-token and per-group activations.
#include "fp8.cu"

#include "check.h"

template <typename T>
static const char* name() {
  return std::is_same<T, f16>::value ? "f16" : "bf16";
}

// Weight blocks of br x bc (br = 1, bc = k: per channel; br = n, bc = k: per tensor), activation
// groups of `group`.
template <typename T>
static void fp8_case(int m, int n, int k, int br, int bc, int group) {
  Rng rng(m * 131 + n * 7 + k + br + group);
  std::vector<T> x(m * k);
  const auto xf = rng.floats(m * k, 3.0f);
  for (size_t i = 0; i < x.size(); ++i) x[i] = from_f32<T>(xf[i]);
  std::vector<u8> w(n * k);
  for (auto& b : w) b = emu_e4m3(rng.floats(1, 300.0f)[0]);
  const int grid_rows = (n + br - 1) / br, grid_cols = k / bc, runs = k / group;
  std::vector<float> ws = rng.floats(grid_rows * grid_cols, 0.01f);
  for (auto& s : ws) s = std::fabs(s) + 1e-4f;
  std::vector<u8> q(m * k);
  std::vector<float> xs(m * runs), by_run(m * runs);
  emu_launch({(unsigned)(m * runs), 1, 1}, 128, [&] {
    fp8::quantize<T>(q.data(), xs.data(), x.data(), m, k, group, 0.0f, runs, 1);
  });
  // The same codes with the scales token-major within each run (cuBLASLt's 1 x 128 blocks).
  std::vector<u8> q2(m * k);
  emu_launch({(unsigned)(m * runs), 1, 1}, 128, [&] {
    fp8::quantize<T>(q2.data(), by_run.data(), x.data(), m, k, group, 0.0f, 1, m);
  });
  Check cq(std::string("fp8_quantize ") + name<T>() + " m=" + std::to_string(m) + " group " +
           std::to_string(group));
  cq.expect(q2 == q, "codes differ with the scales by run", 0, 0);
  for (int i = 0; i < m; ++i)
    for (int g = 0; g < runs; ++g) {
      float amax = 0;
      for (int c = g * group; c < (g + 1) * group; ++c) amax = std::max(amax, std::fabs(to_f32(x[i * k + c])));
      const float s = amax / 448.0f;
      cq.expect(xs[i * runs + g] == s, "scale", i, g);
      cq.expect(by_run[g * m + i] == s, "scale by run", i, g);
      for (int c = g * group; c < (g + 1) * group; ++c)
        cq.expect(q[i * k + c] == emu_e4m3(to_f32(x[i * k + c]) / s), "code", i, c);
    }
  const bool decode = m <= 8;
  const int run = std::min(bc, group);
  std::vector<T> out(m * n);
  const unsigned gx = decode ? (n + 15) / 16 : (n + 63) / 64, gy = decode ? 1 : (m + 63) / 64;
  const fp8::Weights wt{w.data(), ws.data(), br, bc, grid_cols};
  emu_launch({gx, gy, 1}, 32 * tile8::WARPS, [&] {
    if (decode)
      fp8::gemm<T, 1>(out.data(), q.data(), xs.data(), group, wt, m, n, k, run);
    else
      fp8::gemm<T, 8>(out.data(), q.data(), xs.data(), group, wt, m, n, k, run);
  });
  Check cg(std::string("fp8_gemm_t") + (decode ? "1 " : "8 ") + name<T>() + " m=" +
           std::to_string(m) + " " + std::to_string(n) + "x" + std::to_string(k) + " blocks " +
           std::to_string(br) + "x" + std::to_string(bc) + " group " + std::to_string(group));
  for (int i = 0; i < m; ++i)
    for (int j = 0; j < n; ++j) {
      double want = 0, mag = 0;
      for (int c = 0; c < k; ++c) {
        const double p = (double)emu_e4m3_value(q[i * k + c]) * xs[i * runs + c / group] *
                         emu_e4m3_value(w[j * k + c]) * ws[(j / br) * grid_cols + c / bc];
        want += p, mag += std::fabs(p);
      }
      cg.close(to_f32(out[i * n + j]), want, mag, ulp<T>(want), i, j);
    }
}

int main() {
  for (int m : {1, 8}) fp8_case<f16>(m, 40, 256, 1, 256, 256);  // per channel, per token
  fp8_case<bf16>(3, 33, 512, 128, 128, 128);                     // blocks, groups of 128
  fp8_case<f16>(9, 70, 256, 70, 256, 256);                       // per tensor
  fp8_case<bf16>(70, 20, 256, 128, 128, 128);
  return Check::report();
}
