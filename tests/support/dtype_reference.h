// An independent reference for the kernel layer's element types,
// shared by the CPU unit tests and the GPU tests. It does the same
// arithmetic as docs/dtypes.md specifies, by other means than
// service/core/scalar_types.h: half types are decoded with ldexp and
// rounded by searching the (monotonic) table of finite values for the
// nearest, ties to the even pattern; complex products are the plain formula
// written out here. Build users of this header with -ffp-contract=off.
#ifndef DGMM_TESTS_SUPPORT_DTYPE_REFERENCE_H_
#define DGMM_TESTS_SUPPORT_DTYPE_REFERENCE_H_

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "service/core/scalar_types.h"

namespace dgmm::ref {

inline double DecodeHalf(uint16_t h) {
  const int e = (h >> 10) & 0x1f;
  const int m = h & 0x3ff;
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  if (e == 31) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -24);
  return sign * std::ldexp(1024 + m, e - 25);
}

inline double DecodeBFloat16(uint16_t b) {
  const int e = (b >> 7) & 0xff;
  const int m = b & 0x7f;
  const double sign = (b & 0x8000) ? -1.0 : 1.0;
  if (e == 255) return m ? std::numeric_limits<double>::quiet_NaN() : sign * INFINITY;
  if (e == 0) return sign * std::ldexp(m, -133);
  return sign * std::ldexp(128 + m, e - 134);
}

// Nearest of the positive patterns [0, inf_bits) (values increasing with
// the pattern), inf_bits standing for the next power of two past the
// largest finite value (IEEE's rule for overflow); ties to the even pattern.
template <typename Decode>
uint16_t RoundBySearch(float f, uint16_t inf_bits, double inf_value, Decode decode) {
  if (std::isnan(f)) return 0x7fff;  // a NaN in both formats
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double x = std::fabs(static_cast<double>(f));
  if (std::isinf(f)) return sign | inf_bits;
  auto value = [&](uint32_t b) { return b == inf_bits ? inf_value : decode(static_cast<uint16_t>(b)); };
  // Largest b with value(b) <= x.
  uint32_t lo = 0, hi = inf_bits;
  if (x >= inf_value) return sign | inf_bits;
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (value(mid) <= x) lo = mid; else hi = mid;
  }
  const double below = x - value(lo), above = value(lo + 1) - x;
  uint32_t b = lo;
  if (above < below || (above == below && (lo & 1))) b = lo + 1;
  return static_cast<uint16_t>(sign | b);
}

inline uint16_t RoundToHalf(float f) {
  return RoundBySearch(f, 0x7c00, 65536.0, DecodeHalf);
}
inline uint16_t RoundToBFloat16(float f) {
  return RoundBySearch(f, 0x7f80, std::ldexp(1.0, 128), DecodeBFloat16);
}

// ---------------------------------------------------------- element ops

// The reference's compute types: float (for half), float, double, and
// std-free complex pairs.
struct C64 { float re, im; };
struct C128 { double re, im; };

template <typename T> struct RefCompute { using type = T; };
template <> struct RefCompute<Half> { using type = float; };
template <> struct RefCompute<BFloat16> { using type = float; };
template <> struct RefCompute<Complex64> { using type = C64; };
template <> struct RefCompute<Complex128> { using type = C128; };

// Exact widening of a storage value to K.
template <typename K> K To(Half x) {
  if constexpr (std::is_same_v<K, C64> || std::is_same_v<K, C128>) {
    return K{static_cast<decltype(K::re)>(DecodeHalf(x.bits)), 0};
  } else {
    return static_cast<K>(DecodeHalf(x.bits));
  }
}
template <typename K> K To(BFloat16 x) {
  if constexpr (std::is_same_v<K, C64> || std::is_same_v<K, C128>) {
    return K{static_cast<decltype(K::re)>(DecodeBFloat16(x.bits)), 0};
  } else {
    return static_cast<K>(DecodeBFloat16(x.bits));
  }
}
template <typename K> K To(float x) {
  if constexpr (std::is_same_v<K, C64> || std::is_same_v<K, C128>) {
    return K{x, 0};
  } else {
    return static_cast<K>(x);
  }
}
template <typename K> K To(double x) {
  if constexpr (std::is_same_v<K, C128>) {
    return K{x, 0};
  } else {
    return x;
  }
}
template <typename K> K To(Complex64 x) { return K{x.re, x.im}; }
template <typename K> K To(Complex128 x) { return K{x.re, x.im}; }

inline float M(float a, float b) { return a * b; }
inline double M(double a, double b) { return a * b; }
// volatile: each product is stored, so nothing can fuse it with the sum.
inline C64 M(C64 a, C64 b) {
  volatile const float rr = a.re * b.re, ii = a.im * b.im, ri = a.re * b.im, ir = a.im * b.re;
  return C64{rr - ii, ri + ir};
}
inline C128 M(C128 a, C128 b) {
  volatile const double rr = a.re * b.re, ii = a.im * b.im, ri = a.re * b.im, ir = a.im * b.re;
  return C128{rr - ii, ri + ir};
}

template <typename T> T Store(typename RefCompute<T>::type k);
template <> inline Half Store<Half>(float k) { return Half{RoundToHalf(k)}; }
template <> inline BFloat16 Store<BFloat16>(float k) { return BFloat16{RoundToBFloat16(k)}; }
template <> inline float Store<float>(float k) { return k; }
template <> inline double Store<double>(double k) { return k; }
template <> inline Complex64 Store<Complex64>(C64 k) { return Complex64{k.re, k.im}; }
template <> inline Complex128 Store<Complex128>(C128 k) { return Complex128{k.re, k.im}; }

// ------------------------------------------------------------ comparison

// Equal bit for bit, except that any NaN equals any NaN (the GPU returns
// its canonical NaN; x86 keeps an operand's payload).
inline bool SameReal(uint64_t a, uint64_t b, bool a_nan, bool b_nan) {
  return (a_nan && b_nan) || (!a_nan && !b_nan && a == b);
}
inline bool Same(Half a, Half b) {
  auto nan = [](uint16_t x) { return (x & 0x7fff) > 0x7c00; };
  return SameReal(a.bits, b.bits, nan(a.bits), nan(b.bits));
}
inline bool Same(BFloat16 a, BFloat16 b) {
  auto nan = [](uint16_t x) { return (x & 0x7fff) > 0x7f80; };
  return SameReal(a.bits, b.bits, nan(a.bits), nan(b.bits));
}
inline bool Same(float a, float b) {
  uint32_t x, y;
  std::memcpy(&x, &a, 4);
  std::memcpy(&y, &b, 4);
  return SameReal(x, y, std::isnan(a), std::isnan(b));
}
inline bool Same(double a, double b) {
  uint64_t x, y;
  std::memcpy(&x, &a, 8);
  std::memcpy(&y, &b, 8);
  return SameReal(x, y, std::isnan(a), std::isnan(b));
}
inline bool Same(Complex64 a, Complex64 b) { return Same(a.re, b.re) && Same(a.im, b.im); }
inline bool Same(Complex128 a, Complex128 b) { return Same(a.re, b.re) && Same(a.im, b.im); }

inline std::string Show(Half x) { return "half:" + std::to_string(x.bits) + "=" + std::to_string(DecodeHalf(x.bits)); }
inline std::string Show(BFloat16 x) {
  return "bf16:" + std::to_string(x.bits) + "=" + std::to_string(DecodeBFloat16(x.bits));
}
inline std::string Show(float x) {
  char b[64];
  std::snprintf(b, sizeof b, "%a", x);
  return b;
}
inline std::string Show(double x) {
  char b[64];
  std::snprintf(b, sizeof b, "%a", x);
  return b;
}
inline std::string Show(Complex64 x) { return "(" + Show(x.re) + "," + Show(x.im) + ")"; }
inline std::string Show(Complex128 x) { return "(" + Show(x.re) + "," + Show(x.im) + ")"; }

// ------------------------------------------------------------ test values

// A mix for the matrix: IEEE specials, subnormals, the extremes, values
// whose products round (and tie), random patterns and ordinary values.
template <typename T> T Value(std::mt19937_64& rng);

inline uint16_t HalfValueBits(std::mt19937_64& rng) {
  static const uint16_t special[] = {0x0000, 0x8000, 0x7c00, 0xfc00, 0x7e00, 0xfe01, 0x7c01,
                                     0x0001, 0x8001, 0x03ff, 0x0200, 0x0400, 0x7bff, 0xfbff,
                                     0x3c01, 0x3c03, 0x3e00, 0x3bff, 0x1400, 0x0c00};
  const int k = rng() % 10;
  if (k < 2) return special[rng() % (sizeof special / 2)];
  if (k < 5) return static_cast<uint16_t>(rng());  // any pattern
  // Near 1 with random low bits: products of these round, some tie.
  return static_cast<uint16_t>((rng() & 0x8000) | (0x3800 + (rng() % 0x800)));
}
inline uint16_t BFloat16ValueBits(std::mt19937_64& rng) {
  static const uint16_t special[] = {0x0000, 0x8000, 0x7f80, 0xff80, 0x7fc0, 0xffc1, 0x7f81,
                                     0x0001, 0x8001, 0x007f, 0x0080, 0x7f7f, 0xff7f, 0x3f81,
                                     0x3f83, 0x3fc0, 0x0040, 0x00ff};
  const int k = rng() % 10;
  if (k < 2) return special[rng() % (sizeof special / 2)];
  if (k < 5) return static_cast<uint16_t>(rng());
  return static_cast<uint16_t>((rng() & 0x8000) | (0x3f00 + (rng() % 0x100)));
}
template <> inline Half Value<Half>(std::mt19937_64& rng) { return Half{HalfValueBits(rng)}; }
template <> inline BFloat16 Value<BFloat16>(std::mt19937_64& rng) {
  return BFloat16{BFloat16ValueBits(rng)};
}
template <> inline float Value<float>(std::mt19937_64& rng) {
  static const float special[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, -NAN,
                                  std::numeric_limits<float>::denorm_min(),
                                  -std::numeric_limits<float>::denorm_min(),
                                  std::numeric_limits<float>::min(),
                                  0x1.fffffcp-127f, std::numeric_limits<float>::max(),
                                  -std::numeric_limits<float>::max(), 0x1p-75f, 0x1p+70f};
  const int k = rng() % 10;
  if (k < 2) return special[rng() % (sizeof special / sizeof(float))];
  if (k < 4) {
    const uint32_t u = static_cast<uint32_t>(rng());
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
  // Half-representable values, so that half diagonals widen to these.
  if (k < 5) return static_cast<float>(DecodeHalf(HalfValueBits(rng)));
  return std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng);
}
template <> inline double Value<double>(std::mt19937_64& rng) {
  static const double special[] = {0.0, -0.0, INFINITY, -INFINITY, NAN, -NAN,
                                   std::numeric_limits<double>::denorm_min(),
                                   -std::numeric_limits<double>::denorm_min(),
                                   std::numeric_limits<double>::min(),
                                   std::numeric_limits<double>::max(), 0x1p-540, 0x1p+520};
  const int k = rng() % 10;
  if (k < 2) return special[rng() % (sizeof special / sizeof(double))];
  if (k < 4) {
    const uint64_t u = rng();
    double f;
    std::memcpy(&f, &u, 8);
    return f;
  }
  if (k < 5) return Value<float>(rng);
  return std::uniform_real_distribution<double>(-2.0, 2.0)(rng);
}
template <> inline Complex64 Value<Complex64>(std::mt19937_64& rng) {
  return Complex64{Value<float>(rng), Value<float>(rng)};
}
template <> inline Complex128 Value<Complex128>(std::mt19937_64& rng) {
  return Complex128{Value<double>(rng), Value<double>(rng)};
}

// A diagonal value of TD widened to TC's compute type by the reference's
// own decoding (not the server's Widen), as the kernels take it.
template <typename TC, typename TD>
Compute<TC> RefWiden(TD d) {
  const auto k = To<typename RefCompute<TC>::type>(d);
  if constexpr (std::is_same_v<decltype(k), const C64>) {
    return Complex64{k.re, k.im};
  } else if constexpr (std::is_same_v<decltype(k), const C128>) {
    return Complex128{k.re, k.im};
  } else {
    return k;
  }
}

// A diagonal value in compute type K for the result type TC: drawn from
// TC's own values (so half results get half-representable scales).
template <typename TC>
Compute<TC> DiagValue(std::mt19937_64& rng) {
  return RefWiden<TC>(Value<TC>(rng));
}


// The reference element: (l · a) · r in the reference compute type, stored
// as TC; `l` or `r` null means that side is left out.
template <typename TA, typename TC>
TC Element(TA a, const Compute<TC>* l, const Compute<TC>* r) {
  using K = typename RefCompute<TC>::type;
  K x = To<K>(a);
  if (l != nullptr) x = M(To<K>(*l), x);
  if (r != nullptr) x = M(x, To<K>(*r));
  return Store<TC>(x);
}

// ---------------------------------------------------- user-level cases

// C = diag(l)·A (kLeft), A·diag(r) (kRight) or diag(l)·A·diag(r) (kBoth) on
// a rows × cols matrix in either layout, as the wiring will hand it to a
// kernel in tile form.
enum class Sides { kLeft, kRight, kBoth };

struct UserCase {
  int64_t rows = 0, cols = 0;
  bool row_major = true;
  Sides sides = Sides::kBoth;
};

inline std::string CaseName(const UserCase& c) {
  return std::to_string(c.rows) + "x" + std::to_string(c.cols) + (c.row_major ? " row" : " col") +
         (c.sides == Sides::kLeft ? " left" : c.sides == Sides::kRight ? " right" : " both");
}

// The tile form of a case: what the kernels are given.
template <typename TA, typename TC>
struct TileArgs {
  const TA* in;
  TC* out;
  const Compute<TC>* left;   // whole diagonal, or null
  const Compute<TC>* right;  // whole diagonal, or null
  bool left_per_line;
  int64_t lines, line_len;
};

// Runs `run(TileArgs)` on fresh values (output poisoned with 0xff bytes, a
// NaN in every type; or in place when `in_place`, only for TA == TC) and
// compares every element with the reference from the definition
// C[i][j] = (l[i] · A[i][j]) · r[j]. Returns "" or the first mismatches.
template <typename TA, typename TC, typename Run>
std::string CheckCase(const UserCase& c, uint64_t seed, bool in_place, Run run) {
  using K = Compute<TC>;
  std::mt19937_64 rng(seed);
  const int64_t n = c.rows * c.cols;
  std::vector<TA> a(n);
  for (auto& x : a) x = Value<TA>(rng);
  std::vector<K> l(c.rows), r(c.cols);
  for (auto& x : l) x = DiagValue<TC>(rng);
  for (auto& x : r) x = DiagValue<TC>(rng);
  std::vector<TC> out(n);
  std::memset(static_cast<void*>(out.data()), 0xff, n * sizeof(TC));
  if (in_place) {
    if constexpr (std::is_same_v<TA, TC>) out = a;
  }
  const bool use_l = c.sides != Sides::kRight, use_r = c.sides != Sides::kLeft;
  TileArgs<TA, TC> t{.in = in_place ? reinterpret_cast<const TA*>(out.data()) : a.data(),
                     .out = out.data(),
                     .left = use_l ? l.data() : nullptr,
                     .right = use_r ? r.data() : nullptr,
                     .left_per_line = c.row_major,
                     .lines = c.row_major ? c.rows : c.cols,
                     .line_len = c.row_major ? c.cols : c.rows};
  run(t);
  std::string failures;
  int count = 0;
  for (int64_t i = 0; i < c.rows; ++i) {
    for (int64_t j = 0; j < c.cols; ++j) {
      const int64_t at = c.row_major ? i * c.cols + j : j * c.rows + i;
      const TC want = Element<TA, TC>(a[at], use_l ? &l[i] : nullptr, use_r ? &r[j] : nullptr);
      if (!Same(out[at], want) && ++count <= 5) {
        failures += "C[" + std::to_string(i) + "][" + std::to_string(j) + "]: got " +
                    Show(out[at]) + " want " + Show(want) + " (a " + Show(a[at]) +
                    (use_l ? " l " + Show(l[i]) : std::string()) +
                    (use_r ? " r " + Show(r[j]) : std::string()) + ")\n";
      }
    }
  }
  if (count > 5) failures += std::to_string(count) + " mismatches in all\n";
  return failures;
}

// An (A, C) element-type pair for typed tests.
template <typename A, typename C>
struct Pair {
  using TA = A;
  using TC = C;
};

// Every (A, C) pair the kernels take: the six types with themselves, then each
// narrower A with every wider C that NumPy's result_type can give.
using AllPairs = ::testing::Types<
    Pair<Half, Half>, Pair<BFloat16, BFloat16>, Pair<float, float>, Pair<double, double>,
    Pair<Complex64, Complex64>, Pair<Complex128, Complex128>, Pair<Half, float>,
    Pair<Half, double>, Pair<Half, Complex64>, Pair<Half, Complex128>, Pair<BFloat16, float>,
    Pair<BFloat16, double>, Pair<BFloat16, Complex64>, Pair<BFloat16, Complex128>,
    Pair<float, double>, Pair<float, Complex64>, Pair<float, Complex128>,
    Pair<double, Complex128>, Pair<Complex64, Complex128>>;

}  // namespace dgmm::ref

#endif  // DGMM_TESTS_SUPPORT_DTYPE_REFERENCE_H_
