// cuBLAS dgmm on the normalized tile form. A tile of `lines` contiguous lines
// of `line_len` elements is, to column-major cuBLAS, a line_len × lines
// matrix with leading dimension line_len: a line is a column. Scaling whole
// lines therefore scales columns (SIDE_RIGHT, x of length `lines`), scaling
// positions within lines scales rows (SIDE_LEFT, x of length line_len).
// For a row-major user matrix this swaps the user's side, as it must.
#include <cstdint>

#include "service/backends/cuda/dgmm_kernel.h"

namespace dgmm::cuda {
namespace {

cublasStatus_t Dgmm(cublasHandle_t h, cublasSideMode_t side, int64_t m,
                    int64_t n, const float* a, int64_t lda, const float* x,
                    float* c, int64_t ldc) {
  return cublasSdgmm_64(h, side, m, n, a, lda, x, 1, c, ldc);
}

cublasStatus_t Dgmm(cublasHandle_t h, cublasSideMode_t side, int64_t m,
                    int64_t n, const double* a, int64_t lda, const double* x,
                    double* c, int64_t ldc) {
  return cublasDdgmm_64(h, side, m, n, a, lda, x, 1, c, ldc);
}

cublasStatus_t Dgmm(cublasHandle_t h, cublasSideMode_t side, int64_t m,
                    int64_t n, const Complex64* a, int64_t lda, const Complex64* x,
                    Complex64* c, int64_t ldc) {
  // Complex64 is laid out as cuComplex (two floats, 8-byte aligned).
  return cublasCdgmm_64(h, side, m, n, reinterpret_cast<const cuComplex*>(a), lda,
                        reinterpret_cast<const cuComplex*>(x), 1,
                        reinterpret_cast<cuComplex*>(c), ldc);
}

cublasStatus_t Dgmm(cublasHandle_t h, cublasSideMode_t side, int64_t m,
                    int64_t n, const Complex128* a, int64_t lda, const Complex128* x,
                    Complex128* c, int64_t ldc) {
  // Complex128 is laid out as cuDoubleComplex (two doubles, 16-byte aligned).
  return cublasZdgmm_64(h, side, m, n, reinterpret_cast<const cuDoubleComplex*>(a), lda,
                        reinterpret_cast<const cuDoubleComplex*>(x), 1,
                        reinterpret_cast<cuDoubleComplex*>(c), ldc);
}

static_assert(sizeof(Complex64) == sizeof(cuComplex) && alignof(Complex64) == alignof(cuComplex));
static_assert(sizeof(Complex128) == sizeof(cuDoubleComplex) &&
              alignof(Complex128) == alignof(cuDoubleComplex));

}  // namespace

template <typename T>
cublasStatus_t LaunchCublasDgmm(cublasHandle_t handle,
                                const DeviceTile<T>& tile) {
  if (tile.lines <= 0 || tile.line_len <= 0) return CUBLAS_STATUS_SUCCESS;
  const cublasSideMode_t side =
      tile.per_line ? CUBLAS_SIDE_RIGHT : CUBLAS_SIDE_LEFT;
  return Dgmm(handle, side, tile.line_len, tile.lines, tile.in, tile.line_len,
              tile.diag, tile.out, tile.line_len);
}

template cublasStatus_t LaunchCublasDgmm<float>(cublasHandle_t,
                                                const DeviceTile<float>&);
template cublasStatus_t LaunchCublasDgmm<double>(cublasHandle_t,
                                                 const DeviceTile<double>&);
template cublasStatus_t LaunchCublasDgmm<Complex64>(cublasHandle_t,
                                                    const DeviceTile<Complex64>&);
template cublasStatus_t LaunchCublasDgmm<Complex128>(cublasHandle_t,
                                                     const DeviceTile<Complex128>&);

}  // namespace dgmm::cuda
