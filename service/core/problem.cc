#include "service/core/problem.h"

#include <cstring>
#include <type_traits>

#include "service/core/enum_names.h"

namespace dgmm {

absl::string_view DTypeName(DType t) { return ScalarName(t); }
absl::string_view LayoutName(Layout l) {
  return l == Layout::kRowMajor ? "row-major" : "column-major";
}
absl::string_view SideName(Side s) {
  static constexpr EnumName<Side> kNames[] = {
      {Side::kRight, "right"}, {Side::kLeft, "left"}, {Side::kBoth, "both"}};
  return NameOf(kNames, s);
}
absl::string_view BackendName(BackendKind b) {
  static constexpr EnumName<BackendKind> kNames[] = {{BackendKind::kCpu, "cpu"},
                                                     {BackendKind::kCudaKernel, "cuda-kernel"},
                                                     {BackendKind::kCublas, "cublas"}};
  return NameOf(kNames, b);
}

namespace {

// `n` elements of T at `from`, widened exactly to K, to `to`.
template <typename K, typename T>
void WidenAll(const char* from, int64_t n, char* to) {
  for (int64_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, from + i * sizeof(T), sizeof(T));
    const K k = Widen<K>::From(x);
    std::memcpy(to + i * sizeof(K), &k, sizeof(K));
  }
}

template <typename K>
void WidenFrom(Scalar from_type, const char* from, int64_t n, char* to) {
  switch (from_type) {
    case Scalar::kFloat16:
      return WidenAll<K, Half>(from, n, to);
    case Scalar::kBFloat16:
      return WidenAll<K, BFloat16>(from, n, to);
    case Scalar::kFloat32:
      return WidenAll<K, float>(from, n, to);
    case Scalar::kFloat64:
      if constexpr (std::is_same_v<K, double> || std::is_same_v<K, Complex128>) {
        return WidenAll<K, double>(from, n, to);
      }
      return;
    case Scalar::kComplex64:
      if constexpr (std::is_same_v<K, Complex64> || std::is_same_v<K, Complex128>) {
        return WidenAll<K, Complex64>(from, n, to);
      }
      return;
    case Scalar::kComplex128:
      if constexpr (std::is_same_v<K, Complex128>) return WidenAll<K, Complex128>(from, n, to);
      return;
  }
}

// One diagonal of `n` elements of `from_type` into `to`, as ComputeOf(out).
void WidenDiagonal(Scalar from_type, Scalar out, const char* from, int64_t n, char* to) {
  switch (ComputeOf(out)) {
    case Scalar::kFloat32:
      return WidenFrom<float>(from_type, from, n, to);
    case Scalar::kFloat64:
      return WidenFrom<double>(from_type, from, n, to);
    case Scalar::kComplex64:
      return WidenFrom<Complex64>(from_type, from, n, to);
    case Scalar::kComplex128:
      return WidenFrom<Complex128>(from_type, from, n, to);
    default:
      return;  // ComputeOf is never a half type
  }
}

}  // namespace

std::string PrepareDiagonals(const Problem& p, absl::string_view diagonal,
                             absl::string_view right_diagonal) {
  std::string out(static_cast<size_t>(p.prepared_diag_bytes()), '\0');
  const Scalar compute = ComputeOf(p.out_dtype());
  if (p.diag_dtype() == compute) {  // nothing to widen: copied as is
    std::memcpy(out.data(), diagonal.data(), diagonal.size());
    if (p.two_sided()) {
      std::memcpy(out.data() + p.right_diag_offset(), right_diagonal.data(), right_diagonal.size());
    }
    return out;
  }
  const int64_t esize = static_cast<int64_t>(p.diag_elem_size());
  WidenDiagonal(p.diag_dtype(), p.out_dtype(), diagonal.data(),
                static_cast<int64_t>(diagonal.size()) / esize, out.data());
  if (p.two_sided()) {
    WidenDiagonal(p.diag_dtype(), p.out_dtype(), right_diagonal.data(),
                  static_cast<int64_t>(right_diagonal.size()) / esize,
                  out.data() + p.right_diag_offset());
  }
  return out;
}

}  // namespace dgmm
