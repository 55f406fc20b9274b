// A MultiplyBatch call apart from gRPC: many small independent jobs in one
// request message, one result (with its own status) per job, in order.
//
//   Begin --gate has room--> StartRead --OnRequest--> served, decode, count
//     |  \-waits at the gate--/                           |
//     draining: UNAVAILABLE                 each job: intake (its own status)
//                                                         |
//                              session.StartBatch (the valid jobs, one reservation)
//                                                         |
//                      admitted: each job copied, Process, End, in order -- Reply
//
// The read side (the receive gate, the header timeout, the stuck-reply
// watchdog, cancel, Detach) is GatedCall's, as UnaryJob's: the batch is read only once the
// gate has room for a message of --max_unary_message_bytes, and holds what
// the message takes until its jobs are admitted.
//
// Each job is checked by the intake exactly as a Multiply request would be
// (JobKind::kUnary, its own MultiplyRequest's size), so a bad job gets the
// words and code a Multiply call of it would; the others run. The valid jobs
// are admitted together (Engine::StartBatch: one reservation of their summed
// footprints, held until the reply is sent), then run one after another,
// each its own ActiveJob (job id, stats, outcome counted once). A batch of
// small CPU jobs admitted at once runs inside OnRequest on gRPC's callback
// thread, like a small unary job; any other batch runs on one job worker:
// one hop for the batch, not one per job. GPU jobs go through a block buffer
// of their device and the ComputeStage, as unary jobs do.
//
// The RPC layer (service/rpc/batch_reactor.cc) implements BatchIo and
// forwards its reactions; io is used until Detach. gRPC-free.
#ifndef DGMM_SERVICE_JOB_BATCH_JOB_H_
#define DGMM_SERVICE_JOB_BATCH_JOB_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/time/time.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/core/host_buffers.h"
#include "service/job/gated_call.h"
#include "service/job/intake.h"

namespace dgmm {

// The MultiplyBatch request as it was read, in the RPC layer's wire format.
class BatchRequest {
 public:
  struct Job {
    // OK, or why this job's MultiplyRequest does not decode.
    absl::Status decoded;
    // Valid while the request lives.
    const v1::JobHeader* header = nullptr;
    int64_t message_bytes = 0;
    int64_t matrix_bytes = 0;
  };
  virtual ~BatchRequest() = default;
  virtual int64_t size() const = 0;
  // Decodes the jobs' headers without touching their matrices: at most
  // `max_jobs` into *jobs, and *total_jobs counts them all. An error: the
  // batch's own framing is broken (INVALID_ARGUMENT).
  virtual absl::Status Peek(int64_t max_jobs, std::vector<Job>* jobs, int64_t* total_jobs) = 0;
  // Copies job `i`'s matrix (`bytes` bytes) to `dst`; `i` increases from
  // call to call.
  virtual absl::Status CopyMatrix(size_t i, std::byte* dst, int64_t bytes) = 0;
};

// The reply: one outcome per request job, in order; an OK job's result is
// `bytes` bytes at `offset` in `results` (a block buffer of the CPU's pool,
// `results_bytes` long; empty when no job ran).
struct BatchReply {
  struct Job {
    absl::Status status;
    JobStats stats;
    int64_t offset = 0;
    int64_t bytes = 0;
  };
  std::vector<Job> jobs;
  HostBuffer results;
  int64_t results_bytes = 0;
};

// What the batch asks of its call, besides GatedCallIo's.
class BatchIo : public GatedCallIo {
 public:
  // The call ends OK with these results (encoded and sent by the RPC layer,
  // which takes the results' buffer).
  virtual void Reply(BatchReply reply) = 0;
};

class BatchJob final : public GatedCall {
 public:
  BatchJob(std::shared_ptr<JobSession> session, const Intake* intake, ReceiveGate* gate,
           StreamTimeouts timeouts, BatchIo* io)
      : GatedCall(std::move(session), intake, gate, timeouts, io, "MultiplyBatch") {}

  // Begin (GatedCall) waits at the gate, then asks io for the request. The
  // request arrived (null: the call ended without one). May run the batch
  // and Reply before returning: the caller holds no lock the job or its io
  // takes.
  void OnRequest(std::unique_ptr<BatchRequest> request, bool call_cancelled);

 private:
  void Run(std::unique_ptr<AdmittedBatch> batch);
  void SendReply(GatedCallIo* io) override ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropJob() override;

  // Owned by the thread that runs the batch from OnRequest on.
  std::unique_ptr<BatchRequest> request_;
  std::vector<BatchRequest::Job> jobs_;
  std::vector<std::unique_ptr<IntakenJob>> intaken_;
  std::vector<size_t> valid_;  // indexes of the jobs that passed the intake
  BatchReply reply_;
  // The batch's reservation, until Detach (its results are being sent).
  std::unique_ptr<AdmittedBatch> batch_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_JOB_BATCH_JOB_H_
