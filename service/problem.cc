#include "service/problem.h"

namespace dgmm {

absl::string_view DTypeName(DType t) {
  return t == DType::kFloat32 ? "float32" : "float64";
}
absl::string_view LayoutName(Layout l) {
  return l == Layout::kRowMajor ? "row-major" : "column-major";
}
absl::string_view SideName(Side s) { return s == Side::kRight ? "right" : "left"; }
absl::string_view BackendName(BackendKind b) {
  switch (b) {
    case BackendKind::kCpu:
      return "cpu";
    case BackendKind::kCudaKernel:
      return "cuda-kernel";
    case BackendKind::kCublas:
      return "cublas";
  }
  return "?";
}

}  // namespace dgmm
