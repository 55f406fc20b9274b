#include "service/backends/cuda/cuda_status.h"

#include "absl/strings/str_format.h"

namespace dgmm::cuda {

absl::Status CudaStatus(cudaError_t err, std::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  return absl::InternalError(absl::StrFormat("CUDA error in %s: %s (%s)", what,
                                             cudaGetErrorString(err),
                                             cudaGetErrorName(err)));
}

absl::Status CublasStatus(cublasStatus_t st, std::string_view what) {
  if (st == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("cuBLAS error in %s: %s (%s)",
                                             what, cublasGetStatusString(st),
                                             cublasGetStatusName(st)));
}

bool IsStickyError(cudaError_t err) {
  // The errors the CUDA runtime documents as leaving the process in an
  // inconsistent state ("the process must be terminated and relaunched").
  switch (err) {
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
    case cudaErrorLaunchTimeout:
    case cudaErrorHardwareStackError:
    case cudaErrorIllegalInstruction:
    case cudaErrorMisalignedAddress:
    case cudaErrorInvalidAddressSpace:
    case cudaErrorInvalidPc:
    case cudaErrorAssert:
    case cudaErrorECCUncorrectable:
    case cudaErrorNvlinkUncorrectable:
    case cudaErrorContextIsDestroyed:
      return true;
    default:
      return false;
  }
}

}  // namespace dgmm::cuda
