// One job's life from admission to its end, whatever RPC brought it: the
// race between a client's cancel and the admission ticket, the cancelled or
// deadline status, and the compute stage an admitted job runs in. gRPC-free
// (tests/layering): the RPC layer (service/rpc) tells it who called and when
// the call was cancelled.
//
//   intake (intake.h) --ok--> Start ---admitted---> ComputeStage ---> End
//        |                     |  \                 (stages.h: the job's
//        refused (counted)     |   queued: Cancel   outcome, metrics and
//                              refused (counted      group log, once)
//                              by the engine)
#ifndef DGMM_SERVICE_JOB_SESSION_H_
#define DGMM_SERVICE_JOB_SESSION_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/engine/engine.h"
#include "service/engine/admission.h"
#include "service/core/validator.h"
#include "service/pipeline/stages.h"

namespace dgmm {

// What the RPC layer knows of a call.
struct CallInfo {
  // Who asked: a token or the peer's address (the fair share's host) ...
  std::string client;
  // ... and over which connection (the unit that takes turns in the queue).
  // Empty: the client has one.
  std::string connection;
  // The bearer token's name ("token2") when the server has several tokens;
  // empty otherwise. With a session's uid, the owner of regions.
  std::string token;
  // The connection's key, or the client's when it has one connection.
  const std::string& connection_key() const { return connection.empty() ? client : connection; }
  ClientId id() const { return {connection_key(), client}; }
  absl::Time arrived;
  absl::Time deadline = absl::InfiniteFuture();
  // The trace context the call carried (traceparent or grpc-trace-bin) and
  // the span the server gave the call; nullopt: none.
  std::optional<JobTrace> trace{};
};

// How a job whose call was cancelled ends: DEADLINE_EXCEEDED when its
// deadline is what ended it, else CANCELLED. The client's own deadline timer
// fires a little before the server's copy of the deadline (the remaining
// time on arrival, transit included), and its cancellation can reach the
// server first: a cancel within 250 ms of the deadline counts as the
// deadline.
absl::Status CancelledStatus(absl::Time deadline);

class JobSession : public std::enable_shared_from_this<JobSession> {
 public:
  // Runs once, on a job worker: the admitted job's compute stage (destroying
  // it returns the reservation), or why it was not admitted. With Start's
  // `run_here`, a small job admitted at once runs it on Start's caller's
  // thread instead, before Start returns and with no lock of the session's
  // or the engine's held (Engine::Start's `admitted_here`).
  using Admitted = std::function<void(absl::StatusOr<std::shared_ptr<ComputeStage>>)>;

  // `engine` must outlive the session.
  JobSession(Engine* engine, CallInfo call) : engine_(engine), call_(std::move(call)) {}

  // Queues a job that passed intake. An error at once is a refusal the
  // engine has counted (too large, queue full, client limit, draining);
  // then `admitted` never runs.
  // `run_here`: the caller may have `admitted` run on its own thread (for
  // a unary job on gRPC's callback thread); it must then hold no
  // lock `admitted` takes.
  absl::Status Start(const JobRequest& job, JobMode mode, Admitted admitted,
                     bool run_here = false);

  // Start for a MultiplyBatch's valid jobs, admitted together
  // (Engine::StartBatch): the same cancel race and `run_here`. `admitted`
  // gets the batch (destroying it returns the batch's reservation) or why
  // it was not admitted.
  using AdmittedBatchFn = std::function<void(absl::StatusOr<std::unique_ptr<AdmittedBatch>>)>;
  absl::Status StartBatch(const std::vector<const JobRequest*>& jobs, AdmittedBatchFn admitted,
                          bool run_here = false);

  // The call was cancelled (or its deadline passed): a queued job ends with
  // cancelled_status() at once; an admitted one sees cancelled() between
  // tiles. Any thread, any time, before or after Start.
  void Cancel();
  bool cancelled() const { return cancelled_.load(); }
  absl::Status cancelled_status() const { return CancelledStatus(call_.deadline); }

  // Counts a refusal decided before Start (intake, a protocol error).
  void Refuse(const absl::Status& s, const JobRequest* job = nullptr);

  const CallInfo& call() const { return call_; }
  // The call as its jobs name it (JobRequest::call): `method`, a static
  // string, names the RPC.
  JobCall Call(const char* method) const { return {method, call_.client, call_.trace}; }
  Engine& engine() { return *engine_; }

 private:
  Engine* const engine_;
  const CallInfo call_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::optional<Admission::Ticket> ticket_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_JOB_SESSION_H_
