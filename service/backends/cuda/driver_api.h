// The CUDA driver API calls the GPU backend makes. The backend links the
// static runtime, not libcuda, so these are resolved once through the
// runtime (cudaGetDriverEntryPointByVersion) instead of linked: the build
// machine needs no driver, and the benchmark and tests use the same table.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_DRIVER_API_H_
#define DGMM_SERVICE_BACKENDS_CUDA_DRIVER_API_H_

#include <cuda.h>

#include <string>

#include "absl/status/statusor.h"

namespace dgmm::cuda {

// Entry points, with the signatures of <cuda.h> (versioned names such as
// cuMemGetAddressRange_v2 included) at the ABI of CUDA 12.0.
struct DriverApi {
  decltype(&::cuGetErrorName) GetErrorName = nullptr;
  decltype(&::cuGetErrorString) GetErrorString = nullptr;
  decltype(&::cuMemGetAddressRange) MemGetAddressRange = nullptr;
  decltype(&::cuMemGetAllocationGranularity) MemGetAllocationGranularity = nullptr;
  decltype(&::cuMemCreate) MemCreate = nullptr;
  decltype(&::cuMemRelease) MemRelease = nullptr;
  decltype(&::cuMemExportToShareableHandle) MemExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) MemImportFromShareableHandle = nullptr;
  decltype(&::cuMemGetAllocationPropertiesFromHandle) MemGetAllocationPropertiesFromHandle =
      nullptr;
  decltype(&::cuMemAddressReserve) MemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) MemAddressFree = nullptr;
  decltype(&::cuMemMap) MemMap = nullptr;
  decltype(&::cuMemUnmap) MemUnmap = nullptr;
  decltype(&::cuMemSetAccess) MemSetAccess = nullptr;
  decltype(&::cuPointerGetAttribute) PointerGetAttribute = nullptr;
  decltype(&::cuDeviceGet) DeviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) DeviceGetAttribute = nullptr;
};

// The table, resolved on the first call (thread-safe); FAILED_PRECONDITION
// naming the first entry point the driver does not have (or when there is
// no driver at all).
absl::StatusOr<const DriverApi*> Driver();

// "CUDA_ERROR_INVALID_VALUE (invalid argument)" for `r`, from the driver.
std::string DriverErrorString(const DriverApi& api, CUresult r);

}  // namespace dgmm::cuda

#endif  // DGMM_SERVICE_BACKENDS_CUDA_DRIVER_API_H_
