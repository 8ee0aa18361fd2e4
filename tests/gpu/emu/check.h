// What the emulated kernels are held to: a seeded generator, and closeness to an f64 reference
// within f32 accumulation over the terms' magnitudes plus one rounding to the output type.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>
#include <vector>

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 0x9E3779B97F4A7C15ull + 1) {}
  uint32_t next() {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;
    return (uint32_t)(s >> 32);
  }
  // Uniform in [-scale, scale].
  std::vector<float> floats(size_t n, float scale) {
    std::vector<float> v(n);
    for (auto& x : v) x = scale * ((float)next() / 2147483648.0f - 1.0f);
    return v;
  }
};

// One unit in the last place of T (f16, bf16) at |v|.
template <typename T>
double ulp(double v) {
  const int mant = std::is_same<T, f16>::value ? 10 : 7;
  const double a = std::fabs(v);
  if (a < 6.1e-5 && mant == 10) return std::ldexp(1.0, -24);
  return std::ldexp(1.0, (a > 0 ? (int)std::floor(std::log2(a)) : -126) - mant);
}

struct Check {
  std::string what;
  int fails = 0;
  static inline int cases = 0, failed = 0;

  explicit Check(std::string w) : what(std::move(w)) { ++cases; }
  ~Check() {
    if (fails) ++failed;
    std::printf("%s %s\n", fails ? "FAIL" : "ok  ", what.c_str());
  }
  void expect(bool ok, const char* why, int n, int r) {
    if (!ok && fails++ < 3) std::printf("  [%d][%d]: %s\n", n, r, why);
  }
  // |got - want| within f32 accumulation of terms of total magnitude `mag`, plus `out_ulp`
  // (the rounding to the stored type).
  void close(double got, double want, double mag, double out_ulp, int n, int r) {
    const double tol = 2e-6 * mag + out_ulp + 1e-7;
    if (!(std::fabs(got - want) <= tol) && fails++ < 3)
      std::printf("  [%d][%d]: got %.7g want %.7g (tolerance %.3g)\n", n, r, got, want, tol);
  }
  static int report() {
    std::printf("%d cases, %d failed\n", cases, failed);
    return failed ? 1 : 0;
  }
};
