// The region RPCs: MultiplyRegion over a RegionJob, and Register,
// Unregister and GetRegionStatus over the RegionRegistry, run on the
// registry's worker (mapping an object is a system call per page table, not
// work for a callback thread).
#include <algorithm>
#include <memory>

#include "proto/wire.h"
#include "service/core/enum_names.h"
#include "service/job/region_job.h"
#include "service/rpc/reactors.h"
#include "service/rpc/wire_stats.h"

namespace dgmm {
namespace {

// The caller of a region RPC: its session (metadata dgmm-session) and token.
absl::StatusOr<RegionRegistry::Caller> Identify(const RegionRegistry* registry,
                                                const CallContext& call) {
  if (registry == nullptr || !registry->enabled()) return RegionsOffError();
  const auto& metadata = call.grpc()->client_metadata();
  auto it = metadata.find("dgmm-session");
  const absl::string_view session =
      it == metadata.end() ? absl::string_view() : absl::string_view(it->second.data(), it->second.size());
  return registry->Identify(session, call.info().token);
}

template <typename Request>
absl::StatusOr<Request> Parse(const grpc::ByteBuffer& buffer, const char* name) {
  Request r;
  if (!wire::ParseMessage(buffer, &r)) {
    return absl::InvalidArgumentError(absl::StrCat("request does not parse as a dgmm.v1.", name));
  }
  return r;
}

// The largest valid MultiplyRegion request: its header may carry both
// diagonals inline (a process-memory job must), each up to --max_dim
// complex128 elements, whatever --max_unary_message_bytes says.
int64_t MaxRegionRequestBytes(const RequestLimits& limits) {
  return std::max(limits.max_unary_message_bytes,
                  2 * limits.max_dim * 16 + kMaxControlRequestBytes);
}

class MultiplyRegionReactor final : public InlineJobReactor<RegionJob>, public RegionIo {
 public:
  using InlineJobReactor::InlineJobReactor;

  void Start(const JobServices& services, const grpc::ByteBuffer& request) {
    if (absl::Status s = CheckRequestSize(
            request, MaxRegionRequestBytes(services.engine->options().limits), "MultiplyRegion");
        !s.ok()) {
      grpc::ServerUnaryReactor::Finish(call_.Status(s));
      return;
    }
    // Regions off is answered by the intake, like for any job.
    absl::StatusOr<RegionRegistry::Caller> caller;
    if (services.regions != nullptr && services.regions->enabled()) {
      caller = Identify(services.regions, call_);
      if (!caller.ok()) {
        grpc::ServerUnaryReactor::Finish(call_.Status(caller.status()));
        return;
      }
    }
    job_ = std::make_shared<RegionJob>(std::make_shared<JobSession>(services.engine, call_.info()),
                                       services.intake, services.regions, this);
    const bool parsed = wire::ParseMessage(request, &request_);
    job_->Begin(request_,
                parsed ? absl::OkStatus()
                       : absl::InvalidArgumentError(
                             "request does not parse as a dgmm.v1.MultiplyRegionRequest"),
                caller.ok() ? caller->owner : std::string(),
                caller.ok() ? caller->peer.memory : nullptr);
  }

  // RegionIo, once.
  void Finish(const absl::Status& status, const JobStats& stats) override {
    if (status.ok()) {
      v1::MultiplyRegionResponse reply;
      *reply.mutable_stats() = ToWire(stats);
      *response_ = wire::EncodeMessage(reply);
    }
    GrpcOpScope op;
    grpc::ServerUnaryReactor::Finish(call_.Status(status));
  }

 private:
  v1::MultiplyRegionRequest request_;
};

// Parses `request` as a Request, answers it with `answer` and encodes the
// reply into `response`: the call's status.
template <typename Request, typename Fn>
absl::Status Answer(const grpc::ByteBuffer& request, const char* name, grpc::ByteBuffer* response,
                    Fn answer) {
  auto req = Parse<Request>(request, name);
  if (!req.ok()) return req.status();
  auto reply = answer(*req);
  if (!reply.ok()) return reply.status();
  *response = wire::EncodeMessage(*reply);
  return absl::OkStatus();
}

// RegisterRegion, UnregisterRegion or GetRegionStatus for client `owner`:
// the call's status, with `response` filled when OK.
absl::Status Serve(RegionMethod method, RegionRegistry* registry,
                   const RegionRegistry::Caller& caller, const grpc::ByteBuffer& request,
                   grpc::ByteBuffer* response) {
  const std::string& owner = caller.owner;
  switch (method) {
    case RegionMethod::kRegister:
      return Answer<v1::RegisterRegionRequest>(
          request, "RegisterRegionRequest", response,
          [&](const v1::RegisterRegionRequest& req) -> absl::StatusOr<v1::RegisterRegionResponse> {
            auto status = registry->Register(caller, req);
            if (!status.ok()) return status.status();
            v1::RegisterRegionResponse reply;
            *reply.mutable_region() = *status;
            return reply;
          });
    case RegionMethod::kUnregister:
      return Answer<v1::UnregisterRegionRequest>(
          request, "UnregisterRegionRequest", response,
          [&](const v1::UnregisterRegionRequest& req)
              -> absl::StatusOr<v1::UnregisterRegionResponse> {
            auto n = registry->Unregister(owner, req.name());
            if (!n.ok()) return n.status();
            v1::UnregisterRegionResponse reply;
            reply.set_unregistered(*n);
            return reply;
          });
    case RegionMethod::kStatus:
      return Answer<v1::GetRegionStatusRequest>(
          request, "GetRegionStatusRequest", response,
          [&](const v1::GetRegionStatusRequest& req) { return registry->Status(owner, req.name()); });
  }
  return absl::InternalError("unknown region method");
}

const char* MethodName(RegionMethod method) {
  static constexpr EnumName<RegionMethod> kNames[] = {
      {RegionMethod::kRegister, "RegisterRegion"},
      {RegionMethod::kUnregister, "UnregisterRegion"},
      {RegionMethod::kStatus, "GetRegionStatus"}};
  return NameOf(kNames, method, "region");
}

class RegionCallReactor final : public InlineUnaryReactor {
 public:
  RegionCallReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                    RegionRegistry* registry, RegionMethod method,
                    const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : call_(context, policy) {
    if (!call_.auth().ok()) {
      Finish(call_.Status(call_.auth()));
    } else if (absl::Status s =
                   CheckRequestSize(*request, kMaxControlRequestBytes, MethodName(method));
               !s.ok()) {
      Finish(call_.Status(s));
    } else if (auto caller = Identify(registry, call_); !caller.ok()) {
      Finish(call_.Status(caller.status()));
    } else {
      // gRPC keeps the request and response alive until Finish; the reactor
      // lives until OnDone, which comes after it.
      registry->Post([this, registry, method, request, response, caller = *std::move(caller)] {
        const grpc::Status status =
            call_.Status(Serve(method, registry, caller, *request, response));
        GrpcOpScope op;  // on the registry's worker
        Finish(status);
      });
    }
  }
  void OnDone() override { delete this; }

 private:
  CallContext call_;
};

}  // namespace

const InlineJobRpc NewMultiplyRegionReactor = &NewInlineJobReactor<MultiplyRegionReactor>;

grpc::ServerUnaryReactor* NewRegionCallReactor(grpc::CallbackServerContext* context,
                                               CallPolicy* policy, RegionRegistry* regions,
                                               RegionMethod method,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response) {
  return new RegionCallReactor(context, policy, regions, method, request, response);
}

}  // namespace dgmm
