#include "service/backends/cuda/driver_api.h"

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dgmm::cuda {
namespace {

template <typename Fn>
absl::Status Resolve(const char* name, Fn* fn) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult q{};
  if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
      q != cudaDriverEntryPointSuccess || p == nullptr) {
    cudaGetLastError();
    return absl::FailedPreconditionError(absl::StrCat(
        "the CUDA driver has no ", name, " (a driver for CUDA 12.0 or later is needed)"));
  }
  *fn = reinterpret_cast<Fn>(p);
  return absl::OkStatus();
}

absl::StatusOr<DriverApi> ResolveAll() {
  DriverApi a;
#define DGMM_RESOLVE(field, symbol) \
  if (auto st = Resolve(#symbol, &a.field); !st.ok()) return st
  DGMM_RESOLVE(GetErrorName, cuGetErrorName);
  DGMM_RESOLVE(GetErrorString, cuGetErrorString);
  DGMM_RESOLVE(MemGetAddressRange, cuMemGetAddressRange);
  DGMM_RESOLVE(MemGetAllocationGranularity, cuMemGetAllocationGranularity);
  DGMM_RESOLVE(MemCreate, cuMemCreate);
  DGMM_RESOLVE(MemRelease, cuMemRelease);
  DGMM_RESOLVE(MemExportToShareableHandle, cuMemExportToShareableHandle);
  DGMM_RESOLVE(MemImportFromShareableHandle, cuMemImportFromShareableHandle);
  DGMM_RESOLVE(MemGetAllocationPropertiesFromHandle, cuMemGetAllocationPropertiesFromHandle);
  DGMM_RESOLVE(MemAddressReserve, cuMemAddressReserve);
  DGMM_RESOLVE(MemAddressFree, cuMemAddressFree);
  DGMM_RESOLVE(MemMap, cuMemMap);
  DGMM_RESOLVE(MemUnmap, cuMemUnmap);
  DGMM_RESOLVE(MemSetAccess, cuMemSetAccess);
  DGMM_RESOLVE(PointerGetAttribute, cuPointerGetAttribute);
  DGMM_RESOLVE(DeviceGet, cuDeviceGet);
  DGMM_RESOLVE(DeviceGetAttribute, cuDeviceGetAttribute);
#undef DGMM_RESOLVE
  return a;
}

}  // namespace

absl::StatusOr<const DriverApi*> Driver() {
  static const absl::StatusOr<DriverApi>* const api = new absl::StatusOr<DriverApi>(ResolveAll());
  if (!api->ok()) return api->status();
  return &**api;
}

std::string DriverErrorString(const DriverApi& api, CUresult r) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (api.GetErrorName == nullptr || api.GetErrorName(r, &name) != CUDA_SUCCESS) name = nullptr;
  if (api.GetErrorString == nullptr || api.GetErrorString(r, &text) != CUDA_SUCCESS) text = nullptr;
  return absl::StrCat(name != nullptr ? name : absl::StrCat("CUresult ", static_cast<int>(r)), " (",
                      text != nullptr ? text : "no description", ")");
}

}  // namespace dgmm::cuda
