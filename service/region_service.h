// The region RPCs of dgmm.v1.Dgmm (RegisterRegion, UnregisterRegion,
// GetRegionStatus, MultiplyRegion), served at the ByteBuffer level like the
// other RPCs so that a request that does not parse is INVALID_ARGUMENT.
// DgmmService (handlers.h) authenticates the call and names its client; these
// do the rest. The bookkeeping is RegionRegistry's (service/regions).
#ifndef DGMM_SERVICE_REGION_SERVICE_H_
#define DGMM_SERVICE_REGION_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "service/engine.h"
#include "service/regions/region_registry.h"

namespace dgmm {

enum class RegionMethod { kRegister, kUnregister, kStatus };

// RegisterRegion, UnregisterRegion or GetRegionStatus for client `owner`:
// the call's status, with `response` filled when OK. `registry` null or
// disabled: FAILED_PRECONDITION.
absl::Status ServeRegionCall(RegionMethod method, RegionRegistry* registry,
                             const std::string& owner, const grpc::ByteBuffer* request,
                             grpc::ByteBuffer* response);

// MultiplyRegion for client `owner`, due by `deadline`: validated, admitted
// and run like any job (JobMode::kHostRegion or kDeviceRegion), on a job
// worker.
grpc::ServerUnaryReactor* ServeMultiplyRegion(Engine* engine, RegionRegistry* registry,
                                              grpc::CallbackServerContext* context,
                                              const std::string& owner, absl::Time deadline,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response,
                                              std::atomic<int64_t>* calls);

}  // namespace dgmm

#endif  // DGMM_SERVICE_REGION_SERVICE_H_
