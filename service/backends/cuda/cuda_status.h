// Turning CUDA runtime and cuBLAS results into absl::Status, and telling
// errors that end a job from errors that end the device.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_CUDA_STATUS_H_
#define DGMM_SERVICE_BACKENDS_CUDA_CUDA_STATUS_H_

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <string_view>

#include "absl/status/status.h"

namespace dgmm::cuda {

// OK for cudaSuccess; otherwise INTERNAL naming `what` (the call that failed),
// the error's name and its text from cudaGetErrorString. Also clears the
// calling thread's last-error slot so that a later launch check does not
// report this error again (sticky errors stay, by CUDA's design).
absl::Status CudaStatus(cudaError_t err, std::string_view what);

// OK for CUBLAS_STATUS_SUCCESS; otherwise INTERNAL with cuBLAS's status name
// and text (cublasGetStatusName / cublasGetStatusString).
absl::Status CublasStatus(cublasStatus_t st, std::string_view what);

// True for the errors after which the CUDA context is unusable and every
// later call fails the same way (an illegal address, a failed or timed-out
// launch, an uncorrectable ECC error, ...): the device must leave service.
bool IsStickyError(cudaError_t err);

}  // namespace dgmm::cuda

#endif  // DGMM_SERVICE_BACKENDS_CUDA_CUDA_STATUS_H_
