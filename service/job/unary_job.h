// A Multiply job apart from gRPC: the whole matrix in one request message,
// read only once the ReceiveGate has room for it, checked by the intake,
// admitted through a JobSession, copied once into a block buffer of the
// job's device, computed in place and sent back from that buffer (C of a
// wider dtype than A's: computed into a second buffer of C's size, sent
// from that).
//
//   Begin --gate has room--> StartRead --OnRequest--> intake --> session.Start
//     |  \-waits at the gate--/                                     |
//     draining: UNAVAILABLE                         admitted (worker): copy, Process,
//                                                   End, Reply -- or Fail at any step
//
// A MultiplySmall call arrives with its request already read (gRPC reads a
// unary method's message whole): BeginRead skips the gate and goes straight
// to OnRequest, the intake holding the message to its own smaller limit.
//
// A small job (Engine::kRunHereMaxMatrixBytes, CPU) that admission admits at
// once runs inside OnRequest, on the caller's thread (gRPC's callback
// thread), after the session's and engine's locks are released: no hop to a
// worker and back. Any other job runs on a job worker.
//
// The RPC layer (service/rpc/multiply_reactor.cc) implements UnaryIo and
// forwards its reactions; io is used until Detach. gRPC-free.
#ifndef DGMM_SERVICE_JOB_UNARY_JOB_H_
#define DGMM_SERVICE_JOB_UNARY_JOB_H_

#include <memory>
#include <mutex>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/core/host_buffers.h"
#include "service/job/gated_call.h"
#include "service/job/intake.h"

namespace dgmm {

// The Multiply request as it was read, in the RPC layer's wire format.
class UnaryRequest {
 public:
  virtual ~UnaryRequest() = default;
  virtual int64_t size() const = 0;
  // Decodes the header without touching the matrix: `*header` stays valid
  // while this lives; `*matrix_bytes` is the payload's size.
  virtual absl::Status Peek(const v1::JobHeader** header, int64_t* matrix_bytes) = 0;
  // Copies the matrix payload (`bytes` bytes) to `dst`.
  virtual absl::Status CopyMatrix(std::byte* dst, int64_t bytes) = 0;
};

// What the job asks of its call, besides GatedCallIo's.
class UnaryIo : public GatedCallIo {
 public:
  // OK: `bytes` of result in `result` and the job's stats.
  virtual void Reply(HostBuffer result, size_t bytes, const JobStats& stats) = 0;
};

// How a unary job's RPC is named in its errors: Multiply's by default; the
// Open Inference Protocol's ModelInfer runs the same job under its own name.
struct UnaryJobNames {
  const char* method = "Multiply";
  // What a request over --max_unary_message_bytes is told to do instead.
  const char* too_large_advice = "send it with MultiplyStream";
};

class UnaryJob final : public GatedCall {
 public:
  UnaryJob(std::shared_ptr<JobSession> session, const Intake* intake, ReceiveGate* gate,
           StreamTimeouts timeouts, UnaryIo* io, UnaryJobNames names = {})
      : GatedCall(std::move(session), intake, gate, timeouts, io, names.method),
        names_(names) {}

  // Begin (GatedCall) waits at the gate, then asks io for the request.
  // MultiplySmall: the request is here already; io's StartRead is not used.
  void BeginRead(std::unique_ptr<UnaryRequest> request);
  // The request arrived (null: the call ended without one, cancelled or
  // not). May run the job and Reply before returning (see above): the
  // caller holds no lock the job or its io takes.
  void OnRequest(std::unique_ptr<UnaryRequest> request, bool call_cancelled);

 private:
  void Run(std::shared_ptr<ComputeStage> stage);
  void SendReply(GatedCallIo* io) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropJob() override;

  const UnaryJobNames names_;
  bool small_ = false;  // BeginRead: a MultiplySmall call
  // Owned by the job's worker from admission on.
  std::unique_ptr<UnaryRequest> request_;
  int64_t matrix_bytes_ = 0;
  int64_t result_bytes_ = 0;  // C's bytes (more than A's for a promoted result)
  int64_t lines_ = 0;
  std::optional<HostBuffer> result_;
  std::shared_ptr<ComputeStage> stage_ ABSL_GUARDED_BY(mu_);  // its reservation, until Detach
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_JOB_UNARY_JOB_H_
