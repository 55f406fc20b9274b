// A MultiplyStream (or the benchmark's Echo) apart from gRPC: its header,
// its admission and acceptance, then its blocks through a BlockPipeline, then
// its stats. What the blocks go through comes from StreamStages: a compute
// job admitted through a JobSession, or the echo stage.
//
//   kHeader --header ok--> kAdmission --admitted--> kAccepting --written--> kBlocks
//      |                       |                        |                    (BlockPipeline)
//      +-- refused / cancelled / timed out: Finish -----+-- failure passed to the pipeline
//
// The RPC layer (service/rpc/stream_reactor.cc) implements StreamIo and
// forwards its reactions; io is used until Detach. gRPC-free.
//
// Locking: mu_ guards the phases before the blocks. Once the pipeline runs,
// events go straight to it and mu_ is never held while calling into it (the
// pipeline calls this object's PipelineIo methods under its own lock; those
// use only io_, which stays valid until Detach detaches the pipeline).
#ifndef DGMM_SERVICE_JOB_STREAM_JOB_H_
#define DGMM_SERVICE_JOB_STREAM_JOB_H_

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/job/intake.h"
#include "service/job/session.h"
#include "service/job/watchdog.h"
#include "service/pipeline/block_pipeline.h"
#include "service/pipeline/stages.h"

namespace dgmm {

// What a MultiplyStream message may carry beyond max_block_bytes of payload:
// its first_line and the fields' tags and lengths (a few dozen bytes), and
// room for fields a newer client may add. The pipeline's check of each
// message and the --max_block_bytes flag's range use it.
inline constexpr size_t kBlockFramingSlack = size_t{64} << 10;

// A stream message as it arrived: the header first, blocks after.
class StreamMessage : public BlockMessage {
 public:
  // Decodes the first message: INVALID_ARGUMENT for a block or garbage.
  virtual absl::StatusOr<v1::JobHeader> DecodeHeader() = 0;
};

// What the job asks of its call.
class StreamIo {
 public:
  virtual ~StreamIo() = default;
  virtual void StartRead() = 0;
  // The acceptance (a control message); then the result blocks.
  virtual void WriteAccepted(const v1::StreamAccepted& accepted) = 0;
  virtual void WriteBlock(OutBlock block) = 0;
  // Ends the call; OK sends `stats` as the last message.
  virtual void Finish(const absl::Status& status, const JobStats& stats) = 0;
  // Cancels the call at the transport (a client that stopped reading).
  virtual void CancelCall() = 0;
};

// Where a stream's blocks go once its header is valid.
class StreamStages {
 public:
  struct Started {
    std::shared_ptr<BlockStage> stage;
    HostBufferPool* pool = nullptr;  // the job's device's block buffers
    uint64_t job_id = 0;
  };
  using Done = std::function<void(absl::StatusOr<Started>)>;
  virtual ~StreamStages() = default;
  // Checks the header and starts its job: a value when started at once,
  // nullopt when `done` will run later on a worker, an error when refused.
  virtual absl::StatusOr<std::optional<Started>> Begin(const JobDraft& draft, Problem* problem,
                                                       Done done) = 0;
  virtual void Cancel() = 0;
  virtual absl::Status cancelled_status() const = 0;
  // The stats sent when the stream ends OK.
  virtual JobStats stats() const = 0;
};

// A dgmm job: intake, then a JobSession; blocks computed on its device.
std::unique_ptr<StreamStages> ComputeStreamStages(std::shared_ptr<JobSession> session,
                                                  const Intake* intake);
// The streaming benchmark's Echo: the header validated (no admission), each
// block sent back as it came.
std::unique_ptr<StreamStages> EchoStreamStages(Engine* engine, absl::Time deadline);

class StreamJob final : public StreamWatchdog::Watched,
                        public PipelineIo,
                        public std::enable_shared_from_this<StreamJob> {
 public:
  StreamJob(Engine* engine, std::unique_ptr<StreamStages> stages, StreamTimeouts timeouts,
            StreamIo* io)
      : engine_(engine), stages_(std::move(stages)), timeouts_(timeouts), io_(io) {}

  // Asks for the header.
  void Begin();
  // The call's reactions: a message arrived (null: the input ended), a
  // write is done, the call was cancelled.
  void OnMessage(std::unique_ptr<StreamMessage> message, bool call_cancelled);
  void OnWriteDone(bool ok);
  void OnCancel();
  // gRPC is done with the call: io is not used again.
  void Detach();
  void CheckIdle(absl::Time now) override;

  // PipelineIo, called by the pipeline under its lock.
  void StartRead() override { io_->StartRead(); }
  void StartWrite(OutBlock block) override { io_->WriteBlock(std::move(block)); }
  void Finish(const absl::Status& status) override;

 private:
  enum class Phase { kHeader, kAdmission, kAccepting, kBlocks };
  // How long a failed pipeline may wait for its write in flight before the
  // call is cancelled (the client is not reading).
  static constexpr absl::Duration kStuckWriteGrace = absl::Seconds(2);

  void OnHeaderLocked(std::unique_ptr<StreamMessage> message, bool call_cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void OnStarted(absl::StatusOr<StreamStages::Started> started);
  void AcceptLocked(const StreamStages::Started& started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Fail(const absl::Status& s);
  void FailLocked(const absl::Status& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CancelCall();

  Engine* const engine_;
  const std::unique_ptr<StreamStages> stages_;
  const StreamTimeouts timeouts_;
  const absl::Time arrived_ = absl::Now();

  std::mutex mu_;
  StreamIo* io_;  // null after Detach; see the locking note above
  Phase phase_ ABSL_GUARDED_BY(mu_) = Phase::kHeader;
  Problem problem_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<BlockPipeline> pipeline_ ABSL_GUARDED_BY(mu_);
  absl::Time accepted_at_ ABSL_GUARDED_BY(mu_);
  // A failure while the acceptance was written.
  std::optional<absl::Status> pending_error_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  std::atomic<bool> finished_{false};
  std::atomic<int64_t> finished_at_ns_{0};  // when Finish was handed to the call
  std::mutex cancel_mu_;  // see CancelCall
  bool cancel_done_ ABSL_GUARDED_BY(cancel_mu_) = false;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_JOB_STREAM_JOB_H_
