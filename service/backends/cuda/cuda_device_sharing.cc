// Memory another process shares with this GPU: CUDA IPC handles
// (OpenIpcMemory) and CUDA VMM allocations passed as POSIX descriptors
// (ImportVmmMemory). Part of CudaDevice (cuda_device.h).
#include <cuda.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/backends/cuda/cuda_device.h"
#include "service/backends/cuda/cuda_status.h"
#include "service/backends/cuda/driver_api.h"

namespace dgmm::cuda {

absl::StatusOr<Device::IpcMapping> CudaDevice::OpenIpcMemory(
    absl::string_view handle) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError("a CUDA IPC handle has 64 bytes");
  }
  if (auto st = Enter(); !st.ok()) return st;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  const cudaError_t err =
      cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA IPC handle does not open on GPU ", ordinal_, ": ",
        cudaGetErrorString(err),
        " (a handle opens only in another process than the one that made "
        "it, and only while its allocation lives)"));
  }
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, base) != cudaSuccess ||
      attr.type != cudaMemoryTypeDevice || attr.device != ordinal_) {
    const int actual = attr.device;
    cudaIpcCloseMemHandle(base);
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA IPC handle names memory on GPU ", actual, ", not on GPU ",
        ordinal_, " (client and server must number the GPUs alike: same "
        "CUDA_VISIBLE_DEVICES)"));
  }
  // The allocation's size, from the driver (the runtime has no call for it).
  size_t size = 0;
  CUdeviceptr range_base = 0;
  auto api = Driver();
  if (!api.ok() || (*api)->MemGetAddressRange(&range_base, &size,
                                              reinterpret_cast<CUdeviceptr>(base)) !=
                       CUDA_SUCCESS) {
    cudaIpcCloseMemHandle(base);
    cudaGetLastError();
    return absl::InternalError(
        "cannot read the size of the CUDA IPC allocation (cuMemGetAddressRange)");
  }
  const int64_t bytes = static_cast<int64_t>(
      size - (reinterpret_cast<CUdeviceptr>(base) - range_base));
  const int ordinal = ordinal_;
  return IpcMapping{
      .base = static_cast<std::byte*>(base),
      .bytes = bytes,
      .close = [base, ordinal] {
        cudaSetDevice(ordinal);
        cudaIpcCloseMemHandle(base);
        cudaGetLastError();
      }};
}

namespace {

// Driver errors that say the driver or the device cannot do it now, as
// opposed to a descriptor or a size the caller got wrong.
bool IsDeviceProblem(CUresult r) {
  switch (r) {
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_DEINITIALIZED:
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_OUT_OF_MEMORY:
    case CUDA_ERROR_SYSTEM_NOT_READY:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_DEVICE_UNAVAILABLE:
      return true;
    default:
      return false;
  }
}

}  // namespace

absl::StatusOr<Device::IpcMapping> CudaDevice::ImportVmmMemory(int fd,
                                                               int64_t allocation_bytes) {
  if (allocation_bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "a CUDA VMM allocation's size must be positive, not ", allocation_bytes));
  }
  if (fd < 0 || fcntl(fd, F_GETFD) == -1) {
    return absl::InvalidArgumentError(
        absl::StrCat("descriptor ", fd, " is not open in the server"));
  }
  auto driver = Driver();
  if (!driver.ok()) return driver.status();
  const DriverApi& api = **driver;
  if (auto st = Enter(); !st.ok()) {
    return absl::FailedPreconditionError(st.message());
  }
  auto device_error = [&](CUresult r, const char* what) {
    return absl::FailedPreconditionError(absl::StrCat(
        what, " failed on GPU ", ordinal_, ": ", DriverErrorString(api, r)));
  };

  // What the device supports is checked first, so that a failed import
  // below is the descriptor's fault.
  CUdevice dev = 0;
  int vmm = 0, posix_fd = 0;
  if (CUresult r = api.DeviceGet(&dev, ordinal_); r != CUDA_SUCCESS) {
    return device_error(r, "cuDeviceGet");
  }
  if (CUresult r = api.DeviceGetAttribute(
          &vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev);
      r != CUDA_SUCCESS) {
    return device_error(r, "cuDeviceGetAttribute");
  }
  if (CUresult r = api.DeviceGetAttribute(
          &posix_fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, dev);
      r != CUDA_SUCCESS) {
    return device_error(r, "cuDeviceGetAttribute");
  }
  if (vmm == 0 || posix_fd == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", ordinal_, " (", name_, ") cannot import CUDA VMM allocations passed as "
        "POSIX descriptors (virtual memory management ", vmm != 0 ? "yes" : "no",
        ", POSIX descriptors ", posix_fd != 0 ? "yes" : "no", "): use a CUDA IPC region"));
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = ordinal_;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  if (CUresult r = api.MemGetAllocationGranularity(&granularity, &prop,
                                                   CU_MEM_ALLOC_GRANULARITY_MINIMUM);
      r != CUDA_SUCCESS || granularity == 0) {
    return device_error(r, "cuMemGetAllocationGranularity");
  }
  const auto bytes = static_cast<size_t>(allocation_bytes);
  if (bytes % granularity != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "allocation_bytes %d is not a multiple of GPU %d's allocation granularity "
        "(%d bytes): pass the size given to cuMemCreate",
        allocation_bytes, ordinal_, granularity));
  }

  CUmemGenericAllocationHandle handle = 0;
  if (CUresult r = api.MemImportFromShareableHandle(
          &handle, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
          CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      r != CUDA_SUCCESS) {
    if (IsDeviceProblem(r)) return device_error(r, "cuMemImportFromShareableHandle");
    return absl::InvalidArgumentError(absl::StrCat(
        "the descriptor does not import as a CUDA VMM allocation (",
        DriverErrorString(api, r),
        "): pass the descriptor cuMemExportToShareableHandle gave for "
        "CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR"));
  }
  CUmemAllocationProp imported{};
  if (CUresult r = api.MemGetAllocationPropertiesFromHandle(&imported, handle);
      r != CUDA_SUCCESS) {
    api.MemRelease(handle);
    return device_error(r, "cuMemGetAllocationPropertiesFromHandle");
  }
  if (imported.location.type != CU_MEM_LOCATION_TYPE_DEVICE ||
      imported.location.id != ordinal_) {
    api.MemRelease(handle);
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA VMM allocation is on GPU ", imported.location.id, ", not on GPU ", ordinal_,
        " (client and server must number the GPUs alike: same CUDA_VISIBLE_DEVICES)"));
  }

  CUdeviceptr va = 0;
  if (CUresult r = api.MemAddressReserve(&va, bytes, granularity, 0, 0); r != CUDA_SUCCESS) {
    api.MemRelease(handle);
    return device_error(r, "cuMemAddressReserve");
  }
  if (CUresult r = api.MemMap(va, bytes, 0, handle, 0); r != CUDA_SUCCESS) {
    api.MemAddressFree(va, bytes);
    api.MemRelease(handle);
    if (IsDeviceProblem(r)) return device_error(r, "cuMemMap");
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot map %d bytes of the CUDA VMM allocation (%s): allocation_bytes must be "
        "the size given to cuMemCreate",
        allocation_bytes, DriverErrorString(api, r)));
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = ordinal_;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (CUresult r = api.MemSetAccess(va, bytes, &access, 1); r != CUDA_SUCCESS) {
    api.MemUnmap(va, bytes);
    api.MemAddressFree(va, bytes);
    api.MemRelease(handle);
    return device_error(r, "cuMemSetAccess");
  }
  const int ordinal = ordinal_;
  const DriverApi* table = &api;
  return IpcMapping{
      .base = reinterpret_cast<std::byte*>(va),
      .bytes = allocation_bytes,
      .close = [table, va, bytes, handle, ordinal] {
        cudaSetDevice(ordinal);
        table->MemUnmap(va, bytes);
        table->MemAddressFree(va, bytes);
        table->MemRelease(handle);
        cudaGetLastError();
      }};
}

}  // namespace dgmm::cuda
