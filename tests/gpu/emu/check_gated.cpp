// The GEMVs reading the MLP's gate|up buffer (dense_gemv.cu, wq_gemv.cu with gemv.cuh's
// GatedX) under the CPU emulation (emu.h): their product must be the activation kernel's
// (activation.cu) followed by the plain GEMV, bit for bit, for SiLU and GELU-tanh, f16 and bf16,
// one and two n8 tiles of rows, row lengths (d_ff) whose last step is short, and weight-only
// formats with and without zeros and per-group minimums.
#include "activation.cu"
#include "dense_gemv.cu"
#include "wq_gemv.cu"

#include "check.h"

template <typename T>
static std::vector<T> values(Rng& rng, size_t n, float scale) {
  const auto f = rng.floats(n, scale);
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = from_f32<T>(f[i]);
  return v;
}

// The gate|up rows (gate wide enough to reach SiLU's and GELU's curved parts) and the
// activation kernel's output from them.
template <typename T, typename Op>
struct GateUp {
  int m, ff;
  std::vector<T> gu, act;
  GateUp(int m_, int ff_) : m(m_), ff(ff_), gu(), act((size_t)m_ * ff_) {
    Rng rng(m * 131 + ff);
    gu = values<T>(rng, (size_t)m * 2 * ff, 4.0f);
    emu_launch({(unsigned)((ff + 2047) / 2048), (unsigned)m, 1}, 256,
               [&] { gated<Op>(act.data(), gu.data(), m, ff); });
  }
};

template <typename T>
static const char* dtype() {
  return std::is_same<T, f16>::value ? "f16" : "bf16";
}
template <typename Op>
static const char* act_name() {
  return std::is_same<Op, SiluOp>::value ? "silu" : "gelu";
}

// The two outputs, equal bit for bit, and not trivially so (some nonzero).
template <typename O>
static void same_bits(Check& c, const std::vector<O>& two, const std::vector<O>& one, int width) {
  bool nonzero = false;
  for (size_t i = 0; i < two.size(); ++i) {
    c.expect(two[i].bits == one[i].bits, "fused differs", (int)i / width, (int)i % width);
    nonzero |= (two[i].bits & 0x7fff) != 0;
  }
  c.expect(nonzero, "all zero", 0, 0);
}

template <typename T, typename Op, int NT>
static void dense_case(int m, int rows, int ff) {
  const GateUp<T, Op> a(m, ff);
  Rng rng(rows + ff);
  const auto w = values<T>(rng, (size_t)rows * ff, 0.05f);
  std::vector<T> two(m * rows), one(m * rows);
  const unsigned grid = (rows + 15) / 16;
  emu_launch({grid, 1, 1}, 256, [&] {
    dense::gemv<T, T, NT>(two.data(), a.act.data(), w.data(), m, rows, ff, ff, rows);
  });
  emu_launch({grid, 1, 1}, 256, [&] {
    dense::gemv<T, T, NT, gemv::GatedX<Op>>(one.data(), a.gu.data(), w.data(), m, rows, ff,
                                            2 * ff, rows);
  });
  Check c(std::string("dense_gemv") + (NT == 2 ? "16_" : "_") + act_name<Op>() + " " +
          dtype<T>() + " m=" + std::to_string(m) + " " + std::to_string(rows) + "x" +
          std::to_string(ff));
  same_bits(c, two, one, rows);
}

template <typename T, typename Op, int BITS, int NT>
static void wq_case(int m, int rows, int ff, int gs, bool zeros, bool mins) {
  const GateUp<T, Op> a(m, ff);
  Rng rng(BITS * 7 + rows + ff + gs);
  const int groups = (ff + gs - 1) / gs;
  std::vector<u8> codes((size_t)rows * ff * BITS / 8), zero(zeros ? rows * groups : 0);
  for (auto& b : codes) b = (u8)rng.next();
  for (auto& z : zero) z = (u8)(rng.next() % (1u << BITS));
  const auto scales = values<T>(rng, (size_t)rows * groups, 0.02f);
  const auto mv = values<T>(rng, (size_t)rows * groups, 0.1f);
  const u8* zp = zeros ? zero.data() : nullptr;
  const T* mp = mins ? mv.data() : nullptr;
  std::vector<T> two(m * rows), one(m * rows);
  const unsigned grid = (rows + 15) / 16;
  emu_launch({grid, 1, 1}, 256, [&] {
    wq::gemv<T, BITS, NT>(two.data(), a.act.data(), codes.data(), scales.data(), zp, mp, m,
                          rows, ff, gs);
  });
  emu_launch({grid, 1, 1}, 256, [&] {
    wq::gemv<T, BITS, NT, gemv::GatedX<Op>>(one.data(), a.gu.data(), codes.data(),
                                            scales.data(), zp, mp, m, rows, ff, gs);
  });
  Check c(std::string("wq_gemv") + (NT == 2 ? "16_" : "_") + act_name<Op>() + "_b" +
          std::to_string(BITS) + " " + dtype<T>() + " m=" + std::to_string(m) + " " +
          std::to_string(rows) + "x" + std::to_string(ff) + " g" + std::to_string(gs) +
          (zeros ? " zeros" : "") + (mins ? " mins" : ""));
  same_bits(c, two, one, rows);
}

// d_ff 592 and 576: the last step of a warp holds one pair of units (dense: 32 columns a
// step), or half a step (4-bit: 128 columns a step; 2-bit: 9 units of 64).
template <typename T, typename Op>
static void all_for() {
  for (int m : {1, 5, 8}) {
    dense_case<T, Op, 1>(m, 40, 592);
    wq_case<T, Op, 4, 1>(m, 40, 576, 64, true, false);
    wq_case<T, Op, 4, 1>(m, 24, 576, 32, false, true);
  }
  for (int m : {9, 16}) {
    dense_case<T, Op, 2>(m, 33, 592);
    wq_case<T, Op, 4, 2>(m, 40, 576, 64, true, true);
    wq_case<T, Op, 4, 2>(m, 17, 576, 576, false, false);
  }
  wq_case<T, Op, 8, 1>(3, 24, 592, 32, true, true);
  wq_case<T, Op, 2, 1>(5, 17, 576, 32, true, true);  // 2-bit units split between two groups
  wq_case<T, Op, 2, 2>(12, 17, 576, 64, false, false);
}

int main() {
  all_for<f16, SiluOp>();
  all_for<bf16, SiluOp>();
  all_for<f16, GeluTanhOp>();
  all_for<bf16, GeluTanhOp>();
  return Check::report();
}
