// One small reactor per RPC shape (gRPC's callback API, as in route_guide's
// callback server). Each holds its call's state and a CallContext; OnDone
// detaches the job (gRPC-free, service/job) and deletes the reactor, the one
// lifetime scheme for every RPC: the job is shared with the workers that run
// it and uses the reactor only until OnDone. No reactor blocks a callback
// thread: compute runs on job workers (but for a small job admitted at once,
// docs/architecture.md), region mapping on the registry's. The unary
// reactors' OnDone runs where the call ended (inline_reactions.h).
//
//   Multiply            multiply_reactor.cc  UnaryJob
//   MultiplySmall       multiply_reactor.cc  UnaryJob (BeginRead)
//   MultiplyBatch       batch_reactor.cc     BatchJob
//   MultiplyStream      stream_reactor.cc    StreamJob with ComputeStreamStages
//   bench Echo          stream_reactor.cc    StreamJob with EchoStreamStages
//   MultiplyRegion      region_reactors.cc   RegionJob
//   Register/Unregister/GetRegionStatus      region_reactors.cc  RegionRegistry
//   GetServerInfo, refusals                  dgmm_service.cc     UnaryReply
//   OIP ModelInfer      oip_service.cc       UnaryJob (as Multiply, oip_model.h)
//   OIP control calls, Triton's ModelConfig  oip_service.cc      UnaryReply, OneMessageReply
#ifndef DGMM_SERVICE_RPC_REACTORS_H_
#define DGMM_SERVICE_RPC_REACTORS_H_

#include <cstdint>
#include <functional>
#include <memory>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/support/byte_buffer.h"
#include "service/engine/engine.h"
#include "service/job/intake.h"
#include "service/job/receive_gate.h"
#include "service/job/session.h"
#include "service/job/watchdog.h"
#include "service/regions/region_registry.h"
#include "service/rpc/call_context.h"
#include "service/rpc/inline_reactions.h"

namespace dgmm {

using StreamReactorBase = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

// What the job reactors need of the server; owned by DgmmService.
struct JobServices {
  Engine* engine = nullptr;
  const Intake* intake = nullptr;
  ReceiveGate* gate = nullptr;
  StreamWatchdog* watchdog = nullptr;  // null: calls are not timed out (Echo)
  StreamTimeouts timeouts;
  RegionRegistry* regions = nullptr;  // null: regions off
};

// gRPC reads a unary request whole, of any size, before its handler runs;
// the handlers refuse one over its method's limit before parsing it (a
// parse would copy it again): RESOURCE_EXHAUSTED naming the limit.
// GetServerInfo, RegisterRegion, UnregisterRegion and GetRegionStatus
// requests are at most kMaxControlRequestBytes; MultiplyRegion's (whose
// header may carry two diagonals of --max_dim complex128 elements) at most
// that much plus kMaxControlRequestBytes, or --max_unary_message_bytes when
// larger. Not counted as message_too_large (no job was drafted).
inline constexpr int64_t kMaxControlRequestBytes = int64_t{64} << 10;
absl::Status CheckRequestSize(const grpc::ByteBuffer& request, int64_t limit,
                              absl::string_view method);

// What every job reactor's Io does to fail or cancel its call, inside a
// GrpcOpScope: ends `reactor`'s call with `status` (as a gRPC status, its
// pushback in the trailers), or cancels it at the transport.
template <typename Reactor>
void FailFromJob(Reactor* reactor, const CallContext& call, const absl::Status& status) {
  GrpcOpScope op;
  reactor->Finish(call.Status(status));
}
inline void CancelFromJob(const CallContext& call) {
  GrpcOpScope op;
  call.grpc()->TryCancel();
}

// Ends a unary call UNAUTHENTICATED when its token is wrong; false then.
inline bool Authenticated(grpc::ServerUnaryReactor* reactor, const CallContext& call) {
  if (call.auth().ok()) return true;
  reactor->Finish(call.Status(call.auth()));
  return false;
}

// A job's request (`Base`: UnaryRequest, BatchRequest) over the message
// gRPC read, taken over from the reactor's buffer.
template <typename Base>
class GrpcRequest : public Base {
 public:
  explicit GrpcRequest(grpc::ByteBuffer* message) { message_.Swap(message); }
  int64_t size() const override { return static_cast<int64_t>(message_.Length()); }

 protected:
  grpc::ByteBuffer message_;
};

// A unary call answered at once: UNAUTHENTICATED, or what `serve` returns
// (having filled the response when OK).
class UnaryReply final : public InlineUnaryReactor {
 public:
  UnaryReply(grpc::CallbackServerContext* context, CallPolicy* policy,
             const std::function<absl::Status()>& serve)
      : call_(context, policy) {
    Finish(call_.Status(call_.auth().ok() ? serve() : call_.auth()));
  }
  void OnDone() override { delete this; }

 private:
  CallContext call_;
};

// A stream that ends at once with `status` (authentication, unknown method).
class RefusedStream final : public StreamReactorBase {
 public:
  RefusedStream(grpc::CallbackServerContext* context, CallPolicy* policy, const absl::Status& s)
      : call_(context, policy) {
    Finish(call_.Status(s));
  }
  void OnDone() override { delete this; }

 private:
  CallContext call_;
};

// A call whose one request message a GatedCall job reads (Multiply,
// MultiplyBatch: unary on the wire, served as a stream of one message, so
// that the job asks for the message only once the ReceiveGate has room and
// a draining server refuses it unread). Everything but the reply, which
// the final class writes (`Io`'s Reply). `Request` is the job's request
// over the message. Made and started by NewGatedReactor.
template <typename Job, typename Io, typename Request>
class GatedReactor : public StreamReactorBase, public Io {
 public:
  // `extra`: what the job takes beyond the services (UnaryJob: its names).
  template <typename... Extra>
  GatedReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
               const JobServices& services, Extra... extra)
      : call_(context, policy),
        job_(std::make_shared<Job>(std::make_shared<JobSession>(services.engine, call_.info()),
                                   services.intake, services.gate, services.timeouts, this,
                                   extra...)) {}
  // Authenticates the call, then lets the job wait at the gate.
  void Start(const JobServices& services) {
    if (!call_.auth().ok()) {
      Finish(call_.Status(call_.auth()));
      return;
    }
    services.watchdog->Watch(job_);
    job_->Begin();
  }

 protected:

  void OnReadDone(bool ok) override {
    job_->OnRequest(ok ? TakeRequest() : nullptr, call_.grpc()->IsCancelled());
  }
  // The job's request over the message just read (request_, taken over).
  virtual std::unique_ptr<Request> TakeRequest() { return std::make_unique<Request>(&request_); }
  void OnCancel() override { job_->OnCancel(); }
  void OnDone() override {
    job_->Detach();
    delete this;
  }
  // Job::Io, called under the job's lock.
  void StartRead() override {
    GrpcOpScope op;
    StreamReactorBase::StartRead(&request_);
  }
  void Fail(const absl::Status& status) override { FailFromJob(this, call_, status); }
  void CancelCall() override { CancelFromJob(call_); }
  // Sends response_ and ends the call OK.
  void SendResponse() {
    GrpcOpScope op;
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }

  CallContext call_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  const std::shared_ptr<Job> job_;
};

// A gated reactor, started once it is whole (the job may call any of its
// Io at once, from gRPC's threads).
template <typename Reactor>
StreamReactorBase* NewGatedReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                                   const JobServices& services) {
  auto* reactor = new Reactor(context, policy, services);
  reactor->Start(services);
  return reactor;
}

// A unary call whose message gRPC read whole, served by a job
// (MultiplySmall, MultiplyRegion): its context, its response and its job
// (null when refused before one was made), and the reactions it forwards
// to the job. The final class's Start(services, request) makes the job.
// Made and started by NewInlineJobReactor.
template <typename Job>
class InlineJobReactor : public InlineUnaryReactor {
 public:
  InlineJobReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                   grpc::ByteBuffer* response)
      : call_(context, policy), response_(response) {}
  void OnCancel() override {
    if (job_ != nullptr) job_->OnCancel();
  }
  void OnDone() override {
    if (job_ != nullptr) job_->Detach();
    delete this;
  }
  const CallContext& call() const { return call_; }

 protected:
  CallContext call_;
  grpc::ByteBuffer* const response_;
  std::shared_ptr<Job> job_;
};

template <typename Reactor>
grpc::ServerUnaryReactor* NewInlineJobReactor(grpc::CallbackServerContext* context,
                                              CallPolicy* policy, const JobServices& services,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response) {
  auto* reactor = new Reactor(context, policy, response);
  if (Authenticated(reactor, reactor->call())) reactor->Start(services, *request);
  return reactor;
}

StreamReactorBase* NewMultiplyReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                                      const JobServices& services);
// The unary job reactors (NewInlineJobReactor of each).
using InlineJobRpc = grpc::ServerUnaryReactor* (*)(grpc::CallbackServerContext* context,
                                                   CallPolicy* policy, const JobServices& services,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response);
extern const InlineJobRpc NewMultiplySmallReactor;
extern const InlineJobRpc NewMultiplyRegionReactor;
StreamReactorBase* NewMultiplyBatchReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                                           const JobServices& services);
StreamReactorBase* NewMultiplyStreamReactor(grpc::CallbackServerContext* context,
                                            CallPolicy* policy, const JobServices& services);
StreamReactorBase* NewEchoReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                                  Engine* engine);
enum class RegionMethod { kRegister, kUnregister, kStatus };
grpc::ServerUnaryReactor* NewRegionCallReactor(grpc::CallbackServerContext* context,
                                               CallPolicy* policy, RegionRegistry* regions,
                                               RegionMethod method,
                                               const grpc::ByteBuffer* request,
                                               grpc::ByteBuffer* response);

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_REACTORS_H_
