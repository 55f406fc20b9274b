#include "service/rpc/server_info.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dgmm {

v1::GetServerInfoResponse DescribeServer(const Engine& engine, const RegionRegistry* regions) {
  const Engine::State state = engine.Snapshot();
  v1::GetServerInfoResponse info;
  info.set_version(DGMM_VERSION);
  std::set<int> backends;  // of the devices in service, once, in the enum's order
  for (const Engine::DeviceState& s : state.devices) {
    v1::DeviceInfo* d = info.add_devices();
    d->set_index(s.index);
    d->set_name(s.name);
    d->set_total_memory_bytes(s.total_memory_bytes);
    d->set_budget_bytes(s.budget.capacity);
    d->set_reserved_bytes(s.budget.reserved);
    d->set_streams(s.streams);
    d->set_queued_jobs(s.budget.queued);
    d->set_running_jobs(s.budget.running);
    d->set_completed_jobs(s.budget.completed);
    for (const auto& [reason, n] : s.budget.rejected) (*d->mutable_rejected_jobs())[reason] = n;
    d->set_in_service(s.in_service);
    for (BackendKind b : s.backends) {
      d->add_backends(WireBackend(b));
      if (s.in_service) backends.insert(WireBackend(b));
    }
  }
  const EngineOptions& options = engine.options();
  v1::Limits* l = info.mutable_limits();
  l->set_max_unary_message_bytes(options.limits.max_unary_message_bytes);
  l->set_max_small_message_bytes(options.limits.max_small_message_bytes());
  l->set_max_block_bytes(options.limits.max_block_bytes);
  l->set_max_dim(options.limits.max_dim);
  l->set_max_queue(options.max_queue);
  l->set_max_batch_jobs(options.limits.max_batch_jobs);
  l->set_auto_cpu_max_bytes(state.auto_cpu_max_bytes);
  // Every dtype some backend takes (docs/dtypes.md).
  constexpr v1::DType kAll[] = {v1::DTYPE_FLOAT32,  v1::DTYPE_FLOAT64,   v1::DTYPE_FLOAT16,
                                v1::DTYPE_BFLOAT16, v1::DTYPE_COMPLEX64, v1::DTYPE_COMPLEX128};
  for (v1::DType t : kAll) info.add_dtypes(t);
  for (int b : backends) {
    v1::BackendCapabilities* c = info.add_capabilities();
    c->set_backend(static_cast<v1::Backend>(b));
    // cuBLAS: S, D, C and Z dgmm, one dtype, one side (CublasTakes).
    const bool cublas = b == v1::BACKEND_CUBLAS;
    for (v1::DType t : kAll) {
      if (cublas && (t == v1::DTYPE_FLOAT16 || t == v1::DTYPE_BFLOAT16)) continue;
      c->add_dtypes(t);
    }
    c->add_sides(v1::SIDE_LEFT);
    c->add_sides(v1::SIDE_RIGHT);
    if (!cublas) c->add_sides(v1::SIDE_BOTH);
    c->set_mixed_diagonal(!cublas);
  }
  info.set_default_backend(WireBackend(state.default_backend));
  if (regions != nullptr) info.set_instance_id(regions->instance_id());
  if (regions != nullptr && regions->enabled()) {
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
