// dgmm.v1.Dgmm's method table: each method makes its call's reactor
// (reactors.h) from the services the jobs share. Every RPC is served at the
// ByteBuffer level: MultiplyStream so that its payloads skip protobuf's
// copies (proto/wire.h), the unary ones so that a request that does not
// parse gets INVALID_ARGUMENT. Multiply (and MultiplyBatch, the same way) is
// left to DgmmGenericService, which takes it as a stream of one message: a
// unary method's message is read whole by gRPC before its handler runs, a
// stream's only when the handler asks (see ReceiveGate). MultiplySmall, the
// same job for small messages, is a plain unary method: cheaper per call.
#ifndef DGMM_SERVICE_RPC_DGMM_SERVICE_H_
#define DGMM_SERVICE_RPC_DGMM_SERVICE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dgmm/v1/dgmm.grpc.pb.h"
#include "grpcpp/generic/async_generic_service.h"
#include "service/engine/engine.h"
#include "service/job/intake.h"
#include "service/job/receive_gate.h"
#include "service/job/watchdog.h"
#include "service/regions/region_registry.h"
#include "service/rpc/auth.h"
#include "service/rpc/call_context.h"
#include "service/rpc/reactors.h"

namespace dgmm {

inline constexpr char kMultiplyMethod[] = "/dgmm.v1.Dgmm/Multiply";
inline constexpr char kMultiplyBatchMethod[] = "/dgmm.v1.Dgmm/MultiplyBatch";

class DgmmService final
    : public v1::Dgmm::WithGenericMethod_Multiply<v1::Dgmm::WithRawCallbackMethod_MultiplySmall<
          v1::Dgmm::WithGenericMethod_MultiplyBatch<v1::Dgmm::WithRawCallbackMethod_MultiplyStream<
              v1::Dgmm::WithRawCallbackMethod_GetServerInfo<
                  v1::Dgmm::WithRawCallbackMethod_RegisterRegion<
                      v1::Dgmm::WithRawCallbackMethod_UnregisterRegion<
                          v1::Dgmm::WithRawCallbackMethod_GetRegionStatus<
                              v1::Dgmm::WithRawCallbackMethod_MultiplyRegion<
                                  v1::Dgmm::Service>>>>>>>>> {
 public:
  // `engine` and `regions` (may be null: regions off) must outlive the
  // service. With `auth`, every RPC of this service needs the bearer token
  // (UNAUTHENTICATED otherwise). Multiply requests not yet admitted hold at
  // most `unary_receive_bytes` (at least one request of
  // --max_unary_message_bytes is let in), and at most `unary_max_waiting`
  // calls wait for that room.
  DgmmService(Engine* engine, std::optional<TokenAuth> auth, StreamTimeouts timeouts,
              int64_t unary_receive_bytes, int unary_max_waiting,
              RegionRegistry* regions = nullptr);

  // Proxies whose `x-forwarded-for` names the client for the fair share
  // (CallPolicy). Call before serving.
  void set_trusted_proxies(std::vector<std::string> proxies) {
    policy_.trusted_proxies = std::move(proxies);
  }

  // Whether MultiplySmall is served (UNIMPLEMENTED otherwise, as by a server
  // older than it; --multiply_small). Call before serving.
  void set_multiply_small(bool on) { multiply_small_ = on; }

  // A Multiply call (from DgmmGenericService).
  StreamReactorBase* NewMultiply(grpc::CallbackServerContext* context);
  // MultiplySmall: a plain unary call (its message is small; see the proto).
  grpc::ServerUnaryReactor* MultiplySmall(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  // A MultiplyBatch call (from DgmmGenericService), served as Multiply is.
  StreamReactorBase* NewMultiplyBatch(grpc::CallbackServerContext* context);
  StreamReactorBase* MultiplyStream(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetRegionStatus(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* MultiplyRegion(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;

  // Calls of this service that gRPC is not yet done with.
  int64_t calls_in_progress() const { return policy_.calls.load(); }

  // What another surface over the same jobs shares (OipService): the token
  // check and the count of calls Drain waits for, the intake, the receive
  // gate and the watchdog.
  CallPolicy* policy() { return &policy_; }
  const JobServices& services() const { return services_; }

 private:
  bool multiply_small_ = true;
  CallPolicy policy_;
  Intake intake_;
  ReceiveGate gate_;
  StreamWatchdog watchdog_;
  JobServices services_;
};

// Takes the calls of methods no service registered: Multiply and
// MultiplyBatch (for DgmmService) and unknown methods (UNIMPLEMENTED).
class DgmmGenericService final : public grpc::CallbackGenericService {
 public:
  explicit DgmmGenericService(DgmmService* service) : service_(service) {}
  StreamReactorBase* CreateReactor(grpc::GenericCallbackServerContext* context) override;

  // Another method served here (a full name, "/package.Service/Method"), by
  // `make`. Call before serving.
  using MakeReactor = std::function<StreamReactorBase*(grpc::CallbackServerContext*)>;
  void Route(std::string method, MakeReactor make) {
    routes_.emplace_back(std::move(method), std::move(make));
  }

 private:
  DgmmService* service_;
  CallPolicy unknown_;
  std::vector<std::pair<std::string, MakeReactor>> routes_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_DGMM_SERVICE_H_
