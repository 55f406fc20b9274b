#include "service/rpc/wire_buffers.h"

#include <utility>

namespace dgmm {

grpc::Slice ToSlice(HostBuffer buffer, size_t bytes) {
  auto* owner = new HostBuffer(std::move(buffer));
  return grpc::Slice(
      owner->data(), bytes, +[](void* p) { delete static_cast<HostBuffer*>(p); }, owner);
}

}  // namespace dgmm
