// Element types of the kernel layer and their arithmetic, shared
// by the CPU backend (g++) and the CUDA kernels (nvcc): float16, bfloat16,
// float32, float64, complex64 and complex128. docs/dtypes.md is the
// contract; in short:
//
//  - Half types (Half = IEEE binary16, BFloat16) are stored as their 16-bit
//    patterns and computed in float32: each operand is widened exactly, the
//    products are float32 products, and the float32 result is rounded once to
//    the storage type, to nearest, ties to even (overflow gives inf, NaN stays
//    NaN with its sign and becomes quiet, subnormals are kept).
//  - Complex products are the plain formula in the element type, as NumPy
//    computes them: (a+bi)(c+di) = (ac - bd) + (ad + bc)i, each product and
//    sum rounded separately (no fused multiply-add, no C99 Annex G recovery
//    of infinities from NaN results).
//  - A real operand promoted to complex gets imaginary part +0 and then the
//    full complex formula (NumPy promotes before it multiplies).
//
// The host conversions are written here from the IEEE formats; device code
// uses the hardware conversions (cvt.rn), which round the same way. Only NaN
// bit patterns may differ between the two (the GPU returns its canonical
// NaN): results are equal bit for bit everywhere else.
#ifndef DGMM_SERVICE_CORE_SCALAR_TYPES_H_
#define DGMM_SERVICE_CORE_SCALAR_TYPES_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#define DGMM_HD __host__ __device__ __forceinline__
#else
#define DGMM_HD inline
#endif

namespace dgmm {

// The runtime names of the element types (the wiring maps the proto's dtype
// onto these).
enum class Scalar { kFloat16, kBFloat16, kFloat32, kFloat64, kComplex64, kComplex128 };

inline constexpr int ScalarSize(Scalar s) {
  switch (s) {
    case Scalar::kFloat16:
    case Scalar::kBFloat16:
      return 2;
    case Scalar::kFloat32:
      return 4;
    case Scalar::kFloat64:
    case Scalar::kComplex64:
      return 8;
    case Scalar::kComplex128:
      return 16;
  }
  return 0;
}

inline constexpr const char* ScalarName(Scalar s) {
  switch (s) {
    case Scalar::kFloat16: return "float16";
    case Scalar::kBFloat16: return "bfloat16";
    case Scalar::kFloat32: return "float32";
    case Scalar::kFloat64: return "float64";
    case Scalar::kComplex64: return "complex64";
    case Scalar::kComplex128: return "complex128";
  }
  return "?";
}

// The type products are computed in: float32 for the half types, the type
// itself otherwise. Diagonals handed to the kernels are in this type of the
// result (ComputeOf(c)).
inline constexpr Scalar ComputeOf(Scalar s) {
  return s == Scalar::kFloat16 || s == Scalar::kBFloat16 ? Scalar::kFloat32 : s;
}

// NumPy's result_type for two of these types (with ml_dtypes' bfloat16:
// float16 with bfloat16 gives float32; real with complex gives the complex
// type wide enough for both).
inline constexpr Scalar ResultType(Scalar a, Scalar b) {
  if (a == b) return a;
  const bool complex = a == Scalar::kComplex64 || a == Scalar::kComplex128 ||
                       b == Scalar::kComplex64 || b == Scalar::kComplex128;
  // Width of the real part: 0 half, 1 float32, 2 float64.
  auto real_rank = [](Scalar s) {
    switch (s) {
      case Scalar::kFloat16:
      case Scalar::kBFloat16:
        return 0;
      case Scalar::kFloat32:
      case Scalar::kComplex64:
        return 1;
      default:
        return 2;
    }
  };
  int rank = real_rank(a) > real_rank(b) ? real_rank(a) : real_rank(b);
  if (rank == 0) rank = 1;  // float16 with bfloat16 (a != b)
  if (complex) return rank == 1 ? Scalar::kComplex64 : Scalar::kComplex128;
  return rank == 1 ? Scalar::kFloat32 : Scalar::kFloat64;
}

// True when a kernel reads `in` and writes `out`: out is NumPy's result of
// `in` with some diagonal type, so `in` widens to ComputeOf(out) exactly.
inline constexpr bool KernelSupports(Scalar in, Scalar out) {
  return ResultType(in, out) == out;
}

// ------------------------------------------------------------ storage types

struct Half {
  uint16_t bits;
};
struct BFloat16 {
  uint16_t bits;
};
struct alignas(8) Complex64 {
  float re, im;
};
struct alignas(16) Complex128 {
  double re, im;
};

template <typename T> struct ScalarOf;
template <> struct ScalarOf<Half> { static constexpr Scalar value = Scalar::kFloat16; };
template <> struct ScalarOf<BFloat16> { static constexpr Scalar value = Scalar::kBFloat16; };
template <> struct ScalarOf<float> { static constexpr Scalar value = Scalar::kFloat32; };
template <> struct ScalarOf<double> { static constexpr Scalar value = Scalar::kFloat64; };
template <> struct ScalarOf<Complex64> { static constexpr Scalar value = Scalar::kComplex64; };
template <> struct ScalarOf<Complex128> { static constexpr Scalar value = Scalar::kComplex128; };

template <typename T> struct ComputeTypeOf { using type = T; };
template <> struct ComputeTypeOf<Half> { using type = float; };
template <> struct ComputeTypeOf<BFloat16> { using type = float; };
template <typename T> using Compute = typename ComputeTypeOf<T>::type;

// ------------------------------------------------ host conversions (bits)

DGMM_HD uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
DGMM_HD float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// binary16 -> float32, exact. NaN keeps its sign and payload and is quieted.
DGMM_HD float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {  // inf or NaN
    return BitsFloat(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u));
  }
  if (exp == 0) {  // zero or subnormal: mant · 2^-24, exact in float32
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return BitsFloat(sign | FloatBits(v));
  }
  return BitsFloat(sign | ((exp + 112u) << 23) | (mant << 13));
}

// float32 -> binary16, rounded to nearest, ties to even, once.
DGMM_HD uint16_t FloatToHalfBits(float f) {
  const uint32_t x = FloatBits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {  // NaN: quiet, sign and top payload bits kept
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  // 65520 = 65504 + half an ulp: it and everything above (inf too) round
  // to inf (the tie goes to the even significand, which is inf's).
  if (ax >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (ax >= 0x38800000u) {  // a normal half (2^-14 and up)
    const uint32_t t = ax - (112u << 23);  // rebias the exponent
    const uint32_t r = (t + 0xfffu + ((t >> 13) & 1u)) >> 13;
    return static_cast<uint16_t>(sign | r);
  }
  // Subnormal half or zero: the value in units of 2^-24, rounded to an
  // integer (1024 is the smallest normal, which encodes itself).
  const uint32_t e = ax >> 23;
  const uint32_t m = e == 0 ? (ax & 0x7fffffu) : ((ax & 0x7fffffu) | 0x800000u);
  // value = m · 2^(max(e,1) - 150) = (m >> shift) units of 2^-24.
  uint32_t shift = 126u - (e == 0 ? 1u : e);
  if (shift > 25u) shift = 25u;  // below a quarter unit: rounds to 0
  const uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1u);
  const uint32_t up = (rem > half || (rem == half && (q & 1u))) ? 1u : 0u;
  return static_cast<uint16_t>(sign | (q + up));
}

// bfloat16 -> float32, exact. NaN keeps its sign and payload and is quieted.
DGMM_HD float BFloat16BitsToFloat(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
  return BitsFloat(u);
}

// float32 -> bfloat16, rounded to nearest, ties to even, once. bfloat16 has
// float32's exponent range, so subnormals and overflow need no special case.
DGMM_HD uint16_t FloatToBFloat16Bits(float f) {
  const uint32_t x = FloatBits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((x >> 16) | 0x0040u);
  }
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ------------------------------------------ widening to the compute type

// Load<K>(x): x widened exactly to the compute type K (a real promoted to
// complex gets imaginary part +0).
template <typename K> struct Widen;

template <> struct Widen<float> {
  DGMM_HD static float From(float x) { return x; }
  DGMM_HD static float From(Half x) {
#if defined(__CUDA_ARCH__)
    return __half2float(__ushort_as_half(x.bits));
#else
    return HalfBitsToFloat(x.bits);
#endif
  }
  DGMM_HD static float From(BFloat16 x) {
#if defined(__CUDA_ARCH__)
    return __bfloat162float(__ushort_as_bfloat16(x.bits));
#else
    return BFloat16BitsToFloat(x.bits);
#endif
  }
};

template <> struct Widen<double> {
  DGMM_HD static double From(double x) { return x; }
  DGMM_HD static double From(float x) { return x; }
  DGMM_HD static double From(Half x) { return Widen<float>::From(x); }
  DGMM_HD static double From(BFloat16 x) { return Widen<float>::From(x); }
};

template <> struct Widen<Complex64> {
  DGMM_HD static Complex64 From(Complex64 x) { return x; }
  template <typename R>
  DGMM_HD static Complex64 From(R x) {
    return Complex64{Widen<float>::From(x), 0.0f};
  }
};

template <> struct Widen<Complex128> {
  DGMM_HD static Complex128 From(Complex128 x) { return x; }
  DGMM_HD static Complex128 From(Complex64 x) { return Complex128{x.re, x.im}; }
  template <typename R>
  DGMM_HD static Complex128 From(R x) {
    return Complex128{Widen<double>::From(x), 0.0};
  }
};

// Narrow<T>(k): the compute-type value k stored as T (one rounding for the
// half types, the identity otherwise).
template <typename T> struct Narrow {
  DGMM_HD static T From(T k) { return k; }
};
template <> struct Narrow<Half> {
  DGMM_HD static Half From(float k) {
#if defined(__CUDA_ARCH__)
    return Half{__half_as_ushort(__float2half_rn(k))};
#else
    return Half{FloatToHalfBits(k)};
#endif
  }
};
template <> struct Narrow<BFloat16> {
  DGMM_HD static BFloat16 From(float k) {
#if defined(__CUDA_ARCH__)
    return BFloat16{__bfloat16_as_ushort(__float2bfloat16_rn(k))};
#else
    return BFloat16{FloatToBFloat16Bits(k)};
#endif
  }
};

// ------------------------------------------------------------ products

// Mul(x, y) in the compute type, each operation rounded once (on the device
// through the _rn intrinsics, which the compiler never fuses).
DGMM_HD float Mul(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}
DGMM_HD double Mul(double x, double y) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(x, y);
#else
  return x * y;
#endif
}
#if !defined(__CUDA_ARCH__)
// The value of v, opaque to the optimizer. g++ 12's vectorizer recognizes
// the complex product and emits vfmaddsub (a fused multiply-add) even with
// -ffp-contract=off; a product that passes through here cannot be fused.
// It also keeps complex loops scalar on the CPU.
template <typename R>
inline R Rounded(R v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+x"(v));
#elif defined(__GNUC__)
  asm("" : "+w"(v));
#endif
  return v;
}
#endif

DGMM_HD Complex64 Mul(Complex64 x, Complex64 y) {
#if defined(__CUDA_ARCH__)
  return Complex64{__fsub_rn(__fmul_rn(x.re, y.re), __fmul_rn(x.im, y.im)),
                   __fadd_rn(__fmul_rn(x.re, y.im), __fmul_rn(x.im, y.re))};
#else
  return Complex64{Rounded(x.re * y.re) - Rounded(x.im * y.im),
                   Rounded(x.re * y.im) + Rounded(x.im * y.re)};
#endif
}
DGMM_HD Complex128 Mul(Complex128 x, Complex128 y) {
#if defined(__CUDA_ARCH__)
  return Complex128{__dsub_rn(__dmul_rn(x.re, y.re), __dmul_rn(x.im, y.im)),
                    __dadd_rn(__dmul_rn(x.re, y.im), __dmul_rn(x.im, y.re))};
#else
  return Complex128{Rounded(x.re * y.re) - Rounded(x.im * y.im),
                    Rounded(x.re * y.im) + Rounded(x.im * y.re)};
#endif
}

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_SCALAR_TYPES_H_
