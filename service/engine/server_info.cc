#include "service/engine/server_info.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dgmm {

v1::GetServerInfoResponse DescribeServer(const Engine& engine, const RegionRegistry* regions) {
  v1::GetServerInfoResponse info = engine.Info();
  if (regions != nullptr) info.set_instance_id(regions->instance_id());
  if (regions != nullptr && regions->enabled()) {
    v1::Limits* l = info.mutable_limits();
    l->set_regions_enabled(true);
    l->set_region_budget_bytes(regions->options().budget_bytes);
    l->set_max_regions_per_client(regions->options().max_per_client);
    l->set_region_idle_timeout_s(absl::ToInt64Seconds(regions->options().idle_timeout));
    l->set_local_socket(regions->local_socket_path());
  }
  return info;
}

RegionMemoryOps GpuRegionOps(Engine& engine) {
  RegionMemoryOps ops;
  if (engine.gpu_count() == 0) return ops;
  Device* first = &engine.gpu(0);
  ops.pin_host = [first](void* p, int64_t bytes) { return first->PinHostMemory(p, bytes); };
  // The GPU of CUDA ordinal `device`, or FAILED_PRECONDITION.
  auto gpu = [&engine](int device) -> absl::StatusOr<Device*> {
    for (int i = 0; i < engine.gpu_count(); ++i) {
      if (engine.gpu(i).index() == device) return &engine.gpu(i);
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "this server has no GPU ", device, " in use (GetServerInfo lists its GPUs)"));
  };
  auto as_region_memory = [](absl::StatusOr<Device::IpcMapping> m)
      -> absl::StatusOr<RegionMemoryOps::IpcMemory> {
    if (!m.ok()) return m.status();
    return RegionMemoryOps::IpcMemory{
        .base = m->base, .bytes = m->bytes, .close = std::move(m->close)};
  };
  ops.open_ipc = [gpu, as_region_memory](int device, absl::string_view handle)
      -> absl::StatusOr<RegionMemoryOps::IpcMemory> {
    auto g = gpu(device);
    if (!g.ok()) return g.status();
    return as_region_memory((*g)->OpenIpcMemory(handle));
  };
  ops.open_vmm = [gpu, as_region_memory](int device, int fd, int64_t allocation_bytes)
      -> absl::StatusOr<RegionMemoryOps::IpcMemory> {
    auto g = gpu(device);
    if (!g.ok()) return g.status();
    return as_region_memory((*g)->ImportVmmMemory(fd, allocation_bytes));
  };
  return ops;
}

}  // namespace dgmm
