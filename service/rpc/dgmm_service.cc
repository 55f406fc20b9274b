#include "service/rpc/dgmm_service.h"

#include "absl/strings/str_cat.h"
#include "proto/wire.h"
#include "service/rpc/server_info.h"

namespace dgmm {

DgmmService::DgmmService(Engine* engine, std::optional<TokenAuth> auth, StreamTimeouts timeouts,
                         int64_t unary_receive_bytes, int unary_max_waiting,
                         RegionRegistry* regions)
    : intake_(engine, regions),
      gate_(unary_receive_bytes, unary_max_waiting),
      services_{.engine = engine,
                .intake = &intake_,
                .gate = &gate_,
                .watchdog = &watchdog_,
                .timeouts = timeouts,
                .regions = regions} {
  policy_.auth = std::move(auth);
}

absl::Status CheckRequestSize(const grpc::ByteBuffer& request, int64_t limit,
                              absl::string_view method) {
  const int64_t size = static_cast<int64_t>(request.Length());
  if (size <= limit) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrCat(method, " request of ", size,
                                                   " bytes exceeds the ", limit,
                                                   " bytes this server takes for it"));
}

StreamReactorBase* DgmmService::NewMultiply(grpc::CallbackServerContext* context) {
  return NewMultiplyReactor(context, &policy_, services_);
}

grpc::ServerUnaryReactor* DgmmService::MultiplySmall(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  if (!multiply_small_) {
    return new UnaryReply(context, &policy_, [] {
      return absl::UnimplementedError(
          "MultiplySmall is off on this server (--multiply_small=false); send the job with "
          "Multiply");
    });
  }
  return NewMultiplySmallReactor(context, &policy_, services_, request, response);
}

StreamReactorBase* DgmmService::NewMultiplyBatch(grpc::CallbackServerContext* context) {
  return NewMultiplyBatchReactor(context, &policy_, services_);
}

StreamReactorBase* DgmmService::MultiplyStream(grpc::CallbackServerContext* context) {
  return NewMultiplyStreamReactor(context, &policy_, services_);
}

grpc::ServerUnaryReactor* DgmmService::MultiplyRegion(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return NewMultiplyRegionReactor(context, &policy_, services_, request, response);
}

grpc::ServerUnaryReactor* DgmmService::RegisterRegion(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  return NewRegionCallReactor(context, &policy_, services_.regions, RegionMethod::kRegister,
                              request, response);
}

grpc::ServerUnaryReactor* DgmmService::UnregisterRegion(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return NewRegionCallReactor(context, &policy_, services_.regions, RegionMethod::kUnregister,
                              request, response);
}

grpc::ServerUnaryReactor* DgmmService::GetRegionStatus(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return NewRegionCallReactor(context, &policy_, services_.regions, RegionMethod::kStatus,
                              request, response);
}

// Served at the ByteBuffer level so that a request that does not parse gets
// INVALID_ARGUMENT like the other RPCs (gRPC's generated parsing would answer
// UNIMPLEMENTED with an empty message).
grpc::ServerUnaryReactor* DgmmService::GetServerInfo(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return new UnaryReply(context, &policy_, [&]() -> absl::Status {
    if (absl::Status s = CheckRequestSize(*request, kMaxControlRequestBytes, "GetServerInfo");
        !s.ok()) {
      return s;
    }
    v1::GetServerInfoRequest parsed;
    if (!wire::ParseMessage(*request, &parsed)) {
      return absl::InvalidArgumentError(
          "GetServerInfo request does not parse as a dgmm.v1.GetServerInfoRequest");
    }
    v1::GetServerInfoResponse info = DescribeServer(*services_.engine, services_.regions);
    if (!multiply_small_) info.mutable_limits()->set_max_small_message_bytes(0);
    *response = wire::EncodeMessage(info);
    return absl::OkStatus();
  });
}

StreamReactorBase* DgmmGenericService::CreateReactor(grpc::GenericCallbackServerContext* context) {
  if (context->method() == kMultiplyMethod) return service_->NewMultiply(context);
  if (context->method() == kMultiplyBatchMethod) return service_->NewMultiplyBatch(context);
  for (const auto& [method, make] : routes_) {
    if (context->method() == method) return make(context);
  }
  return new RefusedStream(
      context, &unknown_,
      absl::UnimplementedError(absl::StrCat("unknown method ", context->method())));
}

}  // namespace dgmm
