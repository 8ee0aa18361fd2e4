// The GEMVs under the CPU emulation (emu.h): dense_gemv.cu and wq_gemv.cu against f64
// references over the values the kernels read (inputs rounded to the 16-bit type), at 1-16
// activation rows (one and two n8 tiles), rows not a multiple of a block's 16, row lengths
// whose last step is short, every code width, zero points, per-group minimums and the 2-bit
// split groups. Outputs outside the extents must stay untouched.
#include "dense_gemv.cu"
#include "wq_gemv.cu"

#include "check.h"

template <typename T>
static std::vector<u16> to_bits(const std::vector<float>& v) {
  std::vector<u16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = from_f32<T>(v[i]).bits;
  return b;
}
template <typename T>
static float val(u16 b) {
  return to_f32(T{b});
}
template <typename T>
static const char* name() {
  return sizeof(T) == 2 && std::is_same<T, f16>::value ? "f16" : "bf16";
}

// dense: out[n][r] = sum_c x[n][c] w[r][c] (x rows x_stride apart, out rows out_stride apart).
template <typename T, typename O, int NT>
static void dense_case(int m, int rows, int cols) {
  const int xs = cols + 64, os = rows + 32;
  Rng rng(m * 7919 + rows * 31 + cols);
  const auto x = to_bits<T>(rng.floats(m * xs, 1.0f));
  const auto w = to_bits<T>(rng.floats(rows * cols, 0.05f));
  std::vector<O> out(m * os, O{});
  const O sentinel = from_f32<O>(-12345.0f);
  std::fill(out.begin(), out.end(), sentinel);
  emu_launch({(unsigned)((rows + 15) / 16), 1, 1}, 256, [&] {
    dense::gemv<T, O, NT>(out.data(), reinterpret_cast<const T*>(x.data()),
                          reinterpret_cast<const T*>(w.data()), m, rows, cols, xs, os);
  });
  Check c(std::string("dense_gemv") + (NT == 2 ? "16 " : " ") + name<T>() +
          (sizeof(O) == 4 ? "->f32" : "") + " m=" + std::to_string(m) + " " +
          std::to_string(rows) + "x" + std::to_string(cols));
  for (int n = 0; n < m; ++n)
    for (int r = 0; r < os; ++r) {
      const float got = to_f32(out[n * os + r]);
      if (r >= rows) {
        c.expect(got == to_f32(sentinel), "wrote past the rows", n, r);
        continue;
      }
      double want = 0, mag = 0;
      for (int k = 0; k < cols; ++k) {
        const double p = (double)val<T>(x[n * xs + k]) * val<T>(w[r * cols + k]);
        want += p, mag += std::fabs(p);
      }
      c.close(got, want, mag, sizeof(O) == 4 ? 0.0 : ulp<T>(want), n, r);
    }
}

// A weight-only matrix in wq_gemv's layout: codes packed little-end first, scales (and
// minimums) [rows][groups] of T, zeros [rows][groups] u8 or none (zero = 2^(bits-1)).
struct Wq {
  int bits, rows, cols, gs, groups;
  std::vector<u8> codes, zeros;
  std::vector<u16> scales, mins;
  int code(int r, int c) const {
    const int bit = c * bits;
    const int byte = r * (cols * bits / 8) + bit / 8;
    return (codes[byte] >> (bit % 8)) & ((1 << bits) - 1);
  }
};

template <typename T>
static Wq wq_matrix(int bits, int rows, int cols, int gs, bool zeros, bool mins) {
  Rng rng(bits * 1000003 + rows * 101 + cols + gs);
  Wq w{bits, rows, cols, gs, (cols + gs - 1) / gs, {}, {}, {}, {}};
  w.codes.resize(rows * cols * bits / 8);
  for (auto& b : w.codes) b = (u8)rng.next();
  w.scales = to_bits<T>(rng.floats(rows * w.groups, 0.02f));
  if (zeros) {
    w.zeros.resize(rows * w.groups);
    for (auto& z : w.zeros) z = (u8)(rng.next() % (1u << bits));
  }
  if (mins) w.mins = to_bits<T>(rng.floats(rows * w.groups, 0.1f));
  return w;
}

template <typename T, int BITS, int NT>
static void wq_case(int m, int rows, int cols, int gs, bool zeros, bool mins) {
  const Wq w = wq_matrix<T>(BITS, rows, cols, gs, zeros, mins);
  Rng rng(m + 17);
  // A nonzero mean, so the minimums' term matters.
  auto xf = rng.floats(m * cols, 1.0f);
  for (auto& v : xf) v += 0.3f;
  const auto x = to_bits<T>(xf);
  std::vector<T> out(m * rows);
  emu_launch({(unsigned)((rows + 15) / 16), 1, 1}, 256, [&] {
    wq::gemv<T, BITS, NT>(out.data(), reinterpret_cast<const T*>(x.data()), w.codes.data(),
                          reinterpret_cast<const T*>(w.scales.data()),
                          zeros ? w.zeros.data() : nullptr,
                          mins ? reinterpret_cast<const T*>(w.mins.data()) : nullptr, m, rows,
                          cols, gs);
  });
  Check c(std::string("wq_gemv") + (NT == 2 ? "16" : "") + "_b" + std::to_string(BITS) + " " +
          name<T>() + " m=" + std::to_string(m) + " " + std::to_string(rows) + "x" +
          std::to_string(cols) + " g" + std::to_string(gs) + (zeros ? " zeros" : "") +
          (mins ? " mins" : ""));
  for (int n = 0; n < m; ++n)
    for (int r = 0; r < rows; ++r) {
      double want = 0, mag = 0;
      for (int k = 0; k < cols; ++k) {
        const int g = k / gs;
        const double z = zeros ? w.zeros[r * w.groups + g] : (1 << (BITS - 1));
        double wv = val<T>(w.scales[r * w.groups + g]) * (w.code(r, k) - z);
        if (mins) wv += val<T>(w.mins[r * w.groups + g]);
        const double p = val<T>(x[n * cols + k]) * wv;
        want += p, mag += std::fabs(p);
      }
      c.close(to_f32(out[n * rows + r]), want, mag, ulp<T>(want), n, r);
    }
}

template <typename T>
static void all_for() {
  for (int m : {1, 3, 8}) dense_case<T, T, 1>(m, 40, 592);
  for (int m : {9, 16}) dense_case<T, T, 2>(m, 33, 1536);
  dense_case<T, float, 1>(5, 70, 4112);
  dense_case<T, float, 2>(12, 20, 576);
  for (int m : {1, 8}) {
    wq_case<T, 4, 1>(m, 40, 1024, 128, true, true);
    wq_case<T, 8, 1>(m, 24, 576, 32, false, true);
    wq_case<T, 2, 1>(m, 17, 512, 32, true, true);  // 2-bit units split between two groups
    wq_case<T, 2, 1>(m, 17, 512, 64, false, false);
    wq_case<T, 4, 1>(m, 16, 576, 576, true, false);  // one group per row
  }
  for (int m : {9, 16}) {
    wq_case<T, 4, 2>(m, 40, 1024, 128, true, true);
    wq_case<T, 8, 2>(m, 24, 576, 32, false, false);
    wq_case<T, 2, 2>(m, 17, 512, 32, true, true);
  }
}

int main() {
  all_for<f16>();
  all_for<bf16>();
  return Check::report();
}
