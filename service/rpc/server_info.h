// GetServerInfo's reply: the engine's devices, budgets, counters and limits
// (Engine::Snapshot and its options) and, when regions are on, their limits.
// gRPC-free.
#ifndef DGMM_SERVICE_RPC_SERVER_INFO_H_
#define DGMM_SERVICE_RPC_SERVER_INFO_H_

#include "dgmm/v1/dgmm.pb.h"
#include "service/engine/engine.h"
#include "service/regions/region_registry.h"

namespace dgmm {

// `regions` may be null (regions off).
v1::GetServerInfoResponse DescribeServer(const Engine& engine, const RegionRegistry* regions);

// What the region registry needs from the engine's GPUs (pinning host
// memory, opening CUDA IPC handles); empty functions where there is none.
RegionMemoryOps GpuRegionOps(Engine& engine);

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_SERVER_INFO_H_
