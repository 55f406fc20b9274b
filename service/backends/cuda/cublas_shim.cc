// Loads cuBLAS on first use instead of at process start.
//
// Why: libcublasLt carries about 94 KB of thread-local storage. Linked as a
// startup dependency, that TLS joins every thread's static TLS block, and
// any thread created with a small stack fails to start; civetweb, which
// serves /metrics, starts its workers with 100 KB stacks and failed with
// "Cannot create first worker thread". A library opened with dlopen gets its
// TLS allocated lazily, per thread that touches it, so nothing else is
// affected. These definitions stand in for the few cuBLAS entry points dgmm
// calls and forward to the real library.
#include <dlfcn.h>

#include <cublas_v2.h>

#include <mutex>

namespace {

struct Cublas {
  void* lib = nullptr;
  decltype(&::cublasCreate_v2) create = nullptr;
  decltype(&::cublasDestroy_v2) destroy = nullptr;
  decltype(&::cublasSetStream_v2) set_stream = nullptr;
  decltype(&::cublasSdgmm_64) sdgmm = nullptr;
  decltype(&::cublasDdgmm_64) ddgmm = nullptr;
  decltype(&::cublasCdgmm_64) cdgmm = nullptr;
  decltype(&::cublasZdgmm_64) zdgmm = nullptr;
  decltype(&::cublasGetStatusString) status_string = nullptr;
  decltype(&::cublasGetStatusName) status_name = nullptr;
};

template <typename F>
void Bind(void* lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
}

const Cublas& Lib() {
  static Cublas c;
  static std::once_flag once;
  std::call_once(once, [] {
    for (const char* name : {"libcublas.so.13", "libcublas.so"}) {
      c.lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (c.lib != nullptr) break;
    }
    if (c.lib == nullptr) return;
    Bind(c.lib, "cublasCreate_v2", &c.create);
    Bind(c.lib, "cublasDestroy_v2", &c.destroy);
    Bind(c.lib, "cublasSetStream_v2", &c.set_stream);
    Bind(c.lib, "cublasSdgmm_64", &c.sdgmm);
    Bind(c.lib, "cublasDdgmm_64", &c.ddgmm);
    Bind(c.lib, "cublasCdgmm_64", &c.cdgmm);
    Bind(c.lib, "cublasZdgmm_64", &c.zdgmm);
    Bind(c.lib, "cublasGetStatusString", &c.status_string);
    Bind(c.lib, "cublasGetStatusName", &c.status_name);
  });
  return c;
}

}  // namespace

extern "C" {

cublasStatus_t CUBLASWINAPI cublasCreate_v2(cublasHandle_t* handle) {
  const Cublas& c = Lib();
  return c.create != nullptr ? c.create(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDestroy_v2(cublasHandle_t handle) {
  const Cublas& c = Lib();
  return c.destroy != nullptr ? c.destroy(handle) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  const Cublas& c = Lib();
  return c.set_stream != nullptr ? c.set_stream(handle, stream) : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasSdgmm_64(cublasHandle_t handle, cublasSideMode_t mode,
                                           int64_t m, int64_t n, const float* A, int64_t lda,
                                           const float* x, int64_t incx, float* C, int64_t ldc) {
  const Cublas& c = Lib();
  return c.sdgmm != nullptr ? c.sdgmm(handle, mode, m, n, A, lda, x, incx, C, ldc)
                            : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasDdgmm_64(cublasHandle_t handle, cublasSideMode_t mode,
                                           int64_t m, int64_t n, const double* A, int64_t lda,
                                           const double* x, int64_t incx, double* C,
                                           int64_t ldc) {
  const Cublas& c = Lib();
  return c.ddgmm != nullptr ? c.ddgmm(handle, mode, m, n, A, lda, x, incx, C, ldc)
                            : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasCdgmm_64(cublasHandle_t handle, cublasSideMode_t mode,
                                           int64_t m, int64_t n, const cuComplex* A,
                                           int64_t lda, const cuComplex* x, int64_t incx,
                                           cuComplex* C, int64_t ldc) {
  const Cublas& c = Lib();
  return c.cdgmm != nullptr ? c.cdgmm(handle, mode, m, n, A, lda, x, incx, C, ldc)
                            : CUBLAS_STATUS_NOT_INITIALIZED;
}

cublasStatus_t CUBLASWINAPI cublasZdgmm_64(cublasHandle_t handle, cublasSideMode_t mode,
                                           int64_t m, int64_t n, const cuDoubleComplex* A,
                                           int64_t lda, const cuDoubleComplex* x, int64_t incx,
                                           cuDoubleComplex* C, int64_t ldc) {
  const Cublas& c = Lib();
  return c.zdgmm != nullptr ? c.zdgmm(handle, mode, m, n, A, lda, x, incx, C, ldc)
                            : CUBLAS_STATUS_NOT_INITIALIZED;
}

const char* CUBLASWINAPI cublasGetStatusString(cublasStatus_t status) {
  const Cublas& c = Lib();
  return c.status_string != nullptr ? c.status_string(status)
                                    : "cuBLAS could not be loaded (libcublas.so.13 not found)";
}

const char* CUBLASWINAPI cublasGetStatusName(cublasStatus_t status) {
  const Cublas& c = Lib();
  return c.status_name != nullptr ? c.status_name(status) : "CUBLAS_STATUS_NOT_INITIALIZED";
}

}  // extern "C"
