// The CPU kernel layer for every element type: the half
// conversions against an independent search of the nearest value, and
// ScaleElements for every supported (A, C) pair, layout and side (left,
// right, both), element by element and bit for bit against
// tests/support/dtype_reference.h, with IEEE specials, subnormals and values
// that round, outputs poisoned, tiles split mid-line and in place.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/backends/cpu/cpu_device.h"
#include "service/core/scalar_types.h"
#include "tests/support/dtype_reference.h"

namespace dgmm {
namespace {

float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

TEST(HalfConversion, EveryBinary16PatternWidensExactly) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float got = HalfBitsToFloat(static_cast<uint16_t>(b));
    const double want = ref::DecodeHalf(static_cast<uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << b;
      EXPECT_EQ(std::signbit(got), (b & 0x8000) != 0) << b;
      EXPECT_NE(FloatBits(got) & 0x00400000u, 0u) << "quiet " << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << b;
      ASSERT_EQ(std::signbit(got), (b & 0x8000) != 0) << b;
    }
  }
}

TEST(HalfConversion, EveryBFloat16PatternWidensExactly) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float got = BFloat16BitsToFloat(static_cast<uint16_t>(b));
    const double want = ref::DecodeBFloat16(static_cast<uint16_t>(b));
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(got)) << b;
      EXPECT_EQ(std::signbit(got), (b & 0x8000) != 0) << b;
      EXPECT_NE(FloatBits(got) & 0x00400000u, 0u) << "quiet " << b;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << b;
    }
  }
}

// Every midpoint between neighbouring finite halves (and the one past the
// largest), a float ulp either side of it, and a sweep of float patterns.
std::vector<float> RoundingProbes(double (*decode)(uint16_t), uint16_t inf_bits,
                                  double inf_value) {
  std::vector<float> probes;
  for (uint32_t b = 0; b < inf_bits; ++b) {
    const double lo = decode(static_cast<uint16_t>(b));
    const double hi = b + 1 == inf_bits ? inf_value : decode(static_cast<uint16_t>(b + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact in float
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY),
                    static_cast<float>(lo)}) {
      probes.push_back(f);
      probes.push_back(-f);
    }
  }
  for (uint64_t u = 0; u <= 0xffffffffu; u += 65521) probes.push_back(FloatOf(static_cast<uint32_t>(u)));
  return probes;
}

TEST(HalfConversion, RoundsToNearestEvenOnceLikeTheSearch) {
  for (float f : RoundingProbes(ref::DecodeHalf, 0x7c00, 65536.0)) {
    const uint16_t got = FloatToHalfBits(f), want = ref::RoundToHalf(f);
    if (std::isnan(f)) {
      ASSERT_TRUE((got & 0x7fff) > 0x7c00 && (got & 0x0200)) << std::hexfloat << f;
      ASSERT_EQ(got & 0x8000, std::signbit(f) ? 0x8000 : 0);
    } else {
      ASSERT_EQ(got, want) << std::hexfloat << f;
    }
  }
}

TEST(HalfConversion, RoundsBFloat16ToNearestEvenOnceLikeTheSearch) {
  for (float f : RoundingProbes(ref::DecodeBFloat16, 0x7f80, std::ldexp(1.0, 128))) {
    const uint16_t got = FloatToBFloat16Bits(f), want = ref::RoundToBFloat16(f);
    if (std::isnan(f)) {
      ASSERT_TRUE((got & 0x7fff) > 0x7f80 && (got & 0x0040)) << std::hexfloat << f;
      ASSERT_EQ(got & 0x8000, std::signbit(f) ? 0x8000 : 0);
    } else {
      ASSERT_EQ(got, want) << std::hexfloat << f;
    }
  }
}

TEST(HalfConversion, NamedCases) {
  EXPECT_EQ(FloatToHalfBits(1.0f + 0x1p-11f), 0x3c00);          // tie, to even
  EXPECT_EQ(FloatToHalfBits(1.0f + 3 * 0x1p-11f), 0x3c02);      // tie, to even (up)
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);                 // largest finite
  EXPECT_EQ(FloatToHalfBits(65519.996f), 0x7bff);               // below the tie
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);                 // tie: overflows
  EXPECT_EQ(FloatToHalfBits(-1e30f), 0xfc00);
  EXPECT_EQ(FloatToHalfBits(0x1p-24f), 0x0001);                 // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(0x1p-25f), 0x0000);                 // tie to 0 (even)
  EXPECT_EQ(FloatToHalfBits(0x1.8p-24f), 0x0002);               // tie to 2 (even)
  EXPECT_EQ(FloatToHalfBits(0x1.ff8p-15f), 0x03ff);             // largest subnormal
  EXPECT_EQ(FloatToHalfBits(0x1.ffcp-15f), 0x0400);             // tie: up to normal
  EXPECT_EQ(FloatToHalfBits(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(FloatToHalfBits(-NAN) & 0xfe00, 0xfe00);            // quiet, sign kept
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + 0x1p-8f), 0x3f80);       // tie, to even
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::max()), 0x7f80);  // overflow
  EXPECT_EQ(FloatToBFloat16Bits(0x1p-149f), 0x0000);            // below half a bf16 ulp
  EXPECT_EQ(FloatToBFloat16Bits(0x1p-133f), 0x0001);            // smallest subnormal
  EXPECT_EQ(FloatToBFloat16Bits(FloatOf(0x7f800001u)), 0x7fc0);  // signalling NaN quieted
}

TEST(ResultType, FollowsNumPy) {
  EXPECT_EQ(ResultType(Scalar::kFloat32, Scalar::kFloat64), Scalar::kFloat64);
  EXPECT_EQ(ResultType(Scalar::kFloat16, Scalar::kBFloat16), Scalar::kFloat32);
  EXPECT_EQ(ResultType(Scalar::kFloat16, Scalar::kFloat16), Scalar::kFloat16);
  EXPECT_EQ(ResultType(Scalar::kFloat64, Scalar::kComplex64), Scalar::kComplex128);
  EXPECT_EQ(ResultType(Scalar::kFloat32, Scalar::kComplex64), Scalar::kComplex64);
  EXPECT_EQ(ResultType(Scalar::kBFloat16, Scalar::kComplex64), Scalar::kComplex64);
  EXPECT_EQ(ResultType(Scalar::kComplex64, Scalar::kComplex128), Scalar::kComplex128);
  EXPECT_TRUE(KernelSupports(Scalar::kFloat16, Scalar::kComplex128));
  EXPECT_FALSE(KernelSupports(Scalar::kFloat64, Scalar::kComplex64));
  EXPECT_FALSE(KernelSupports(Scalar::kFloat32, Scalar::kFloat16));
}

// ------------------------------------------------------------ the kernels

template <typename P>
class ScaleElementsTest : public ::testing::Test {};

TYPED_TEST_SUITE(ScaleElementsTest, ref::AllPairs);

// Runs the tile as two tiles (the second with first_line > 0), each in
// three element ranges that cut lines in the middle.
template <typename TA, typename TC>
void RunSplit(const ref::TileArgs<TA, TC>& t) {
  const int64_t split = t.lines / 2;
  for (int part = 0; part < 2; ++part) {
    const int64_t first = part == 0 ? 0 : split;
    const int64_t lines = part == 0 ? split : t.lines - split;
    const ScaleArgs args{.in_type = ScalarOf<TA>::value,
                         .out_type = ScalarOf<TC>::value,
                         .in = reinterpret_cast<const std::byte*>(t.in + first * t.line_len),
                         .out = reinterpret_cast<std::byte*>(t.out + first * t.line_len),
                         .left = reinterpret_cast<const std::byte*>(t.left),
                         .right = reinterpret_cast<const std::byte*>(t.right),
                         .left_per_line = t.left_per_line,
                         .first_line = first,
                         .line_len = t.line_len};
    const int64_t n = lines * t.line_len;
    const int64_t cuts[] = {0, n / 3 + 1, 2 * n / 3 + 2, n};
    for (int k = 0; k < 3; ++k) {
      const int64_t b = std::min(cuts[k], n), e = std::min(cuts[k + 1], n);
      ASSERT_TRUE(ScaleElements(args, b, e));
    }
  }
}

TYPED_TEST(ScaleElementsTest, EveryLayoutAndSideBitExactAgainstReference) {
  using TA = typename TypeParam::TA;
  using TC = typename TypeParam::TC;
  uint64_t seed = 1;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{13, 29}, {1, 64}, {40, 1}, {64, 48}}) {
    for (bool row_major : {true, false}) {
      for (ref::Sides sides : {ref::Sides::kLeft, ref::Sides::kRight, ref::Sides::kBoth}) {
        const ref::UserCase c{rows, cols, row_major, sides};
        for (bool in_place : {false, true}) {
          if (in_place && !std::is_same_v<TA, TC>) continue;
          const std::string failures = ref::CheckCase<TA, TC>(
              c, ++seed, in_place, [](const ref::TileArgs<TA, TC>& t) { RunSplit(t); });
          EXPECT_EQ(failures, "") << ref::CaseName(c) << (in_place ? " in place" : "");
        }
      }
    }
  }
}

TEST(ScaleElements, RefusesPairsNumPyWouldNotProduceAndMissingDiagonals) {
  float a[4] = {1, 2, 3, 4}, out[4] = {}, d[2] = {1, 1};
  ScaleArgs args{.in_type = Scalar::kFloat64,
                 .out_type = Scalar::kFloat32,
                 .in = reinterpret_cast<const std::byte*>(a),
                 .out = reinterpret_cast<std::byte*>(out),
                 .left = reinterpret_cast<const std::byte*>(d),
                 .line_len = 2};
  EXPECT_FALSE(ScaleElements(args, 0, 2));
  args.in_type = Scalar::kFloat32;
  args.out_type = Scalar::kFloat16;
  EXPECT_FALSE(ScaleElements(args, 0, 2));
  args.out_type = Scalar::kFloat32;
  args.left = nullptr;
  EXPECT_FALSE(ScaleElements(args, 0, 2));
  args.right = reinterpret_cast<const std::byte*>(d);
  EXPECT_TRUE(ScaleElements(args, 0, 4));
  EXPECT_EQ(out[3], 4.0f);
}

// The order of two-sided scaling is (l · a) · r whatever the layout: these
// values give a different float32 result for l · (a · r).
TEST(ScaleElements, TwoSidedOrderIsLeftTimesATimesRight) {
  const float l = 3.0f, a = 1.0f + 0x1p-23f, r = 1.0f / 3.0f;
  ASSERT_NE((l * a) * r, l * (a * r));
  for (bool row_major : {true, false}) {
    float out = 0;
    const ScaleArgs args{.in = reinterpret_cast<const std::byte*>(&a),
                         .out = reinterpret_cast<std::byte*>(&out),
                         .left = reinterpret_cast<const std::byte*>(&l),
                         .right = reinterpret_cast<const std::byte*>(&r),
                         .left_per_line = row_major,
                         .line_len = 1};
    ASSERT_TRUE(ScaleElements(args, 0, 1));
    EXPECT_EQ(out, (l * a) * r) << row_major;
  }
}

// Complex products are the plain formula: inf · (0 + 1i) has a NaN real
// part (inf·0), which C99 Annex G would not recover here either way, and a
// real promoted to complex multiplies in full (NumPy's inf·(1+0j)).
TEST(ScaleElements, ComplexIsThePlainFormula) {
  const Complex64 a{INFINITY, 0.0f}, d{0.0f, 1.0f};
  Complex64 out{};
  const ScaleArgs args{.in_type = Scalar::kComplex64,
                       .out_type = Scalar::kComplex64,
                       .in = reinterpret_cast<const std::byte*>(&a),
                       .out = reinterpret_cast<std::byte*>(&out),
                       .left = reinterpret_cast<const std::byte*>(&d),
                       .line_len = 1};
  ASSERT_TRUE(ScaleElements(args, 0, 1));
  EXPECT_TRUE(std::isnan(out.re));  // inf·0 - 0·1
  EXPECT_EQ(out.im, INFINITY);      // inf·1 + 0·0
  const float ar = INFINITY;
  const Complex64 one{1.0f, 0.0f};
  const ScaleArgs promoted{.in_type = Scalar::kFloat32,
                           .out_type = Scalar::kComplex64,
                           .in = reinterpret_cast<const std::byte*>(&ar),
                           .out = reinterpret_cast<std::byte*>(&out),
                           .left = reinterpret_cast<const std::byte*>(&one),
                           .line_len = 1};
  ASSERT_TRUE(ScaleElements(promoted, 0, 1));
  EXPECT_EQ(out.re, INFINITY);      // inf·1 - 0·0
  EXPECT_TRUE(std::isnan(out.im));  // inf·0 + 0·1, as NumPy gives
}

}  // namespace
}  // namespace dgmm
