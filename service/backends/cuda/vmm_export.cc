#include "service/backends/cuda/vmm_export.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "service/backends/cuda/driver_api.h"

namespace dgmm::cuda {

absl::StatusOr<std::unique_ptr<VmmAllocation>> VmmAllocation::Create(int ordinal, int64_t min_bytes,
                                                                     bool compressible) {
  auto driver = Driver();
  if (!driver.ok()) return driver.status();
  const DriverApi& api = **driver;
  auto fail = [&](CUresult r, const char* what) {
    return absl::InternalError(absl::StrCat(what, ": ", DriverErrorString(api, r)));
  };
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  if (compressible) prop.allocFlags.compressionType = CU_MEM_ALLOCATION_COMP_GENERIC;
  std::unique_ptr<VmmAllocation> a(new VmmAllocation());
  if (CUresult r = api.MemGetAllocationGranularity(&a->granularity_, &prop,
                                                   CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS) {
    return fail(r, "cuMemGetAllocationGranularity");
  }
  const size_t g = a->granularity_;
  const size_t bytes = (static_cast<size_t>(min_bytes) + g - 1) / g * g;
  if (CUresult r = api.MemCreate(&a->handle_, bytes, &prop, 0); r != CUDA_SUCCESS) {
    return fail(r, "cuMemCreate");
  }
  CUmemAllocationProp granted{};
  if (api.MemGetAllocationPropertiesFromHandle(&granted, a->handle_) == CUDA_SUCCESS) {
    a->compressed_ = granted.allocFlags.compressionType == CU_MEM_ALLOCATION_COMP_GENERIC;
  }
  a->bytes_ = bytes;
  if (CUresult r = api.MemAddressReserve(&a->va_, bytes, g, 0, 0); r != CUDA_SUCCESS) {
    return fail(r, "cuMemAddressReserve");  // the destructor releases the handle
  }
  if (CUresult r = api.MemMap(a->va_, bytes, 0, a->handle_, 0); r != CUDA_SUCCESS) {
    return fail(r, "cuMemMap");
  }
  a->mapped_ = true;
  CUmemAccessDesc access{};
  access.location = prop.location;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = api.MemSetAccess(a->va_, bytes, &access, 1); r != CUDA_SUCCESS) {
    return fail(r, "cuMemSetAccess");
  }
  return a;
}

VmmAllocation::~VmmAllocation() {
  auto driver = Driver();
  if (!driver.ok()) return;
  const DriverApi& api = **driver;
  if (mapped_) api.MemUnmap(va_, bytes_);
  if (va_ != 0) api.MemAddressFree(va_, bytes_);
  if (handle_ != 0) api.MemRelease(handle_);
}

absl::StatusOr<int> VmmAllocation::ExportFd() const {
  auto driver = Driver();
  if (!driver.ok()) return driver.status();
  int fd = -1;
  if (CUresult r = (*driver)->MemExportToShareableHandle(
          &fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
      r != CUDA_SUCCESS) {
    return absl::InternalError(
        absl::StrCat("cuMemExportToShareableHandle: ", DriverErrorString(**driver, r)));
  }
  return fd;
}

}  // namespace dgmm::cuda
