#include "service/job/stream_job.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dgmm {
namespace {

class ComputeStages final : public StreamStages {
 public:
  ComputeStages(std::shared_ptr<JobSession> session, const Intake* intake)
      : session_(std::move(session)), intake_(intake) {}

  absl::StatusOr<std::optional<Started>> Begin(const JobDraft& header_draft, Problem* problem,
                                               Done done) override {
    JobDraft draft = header_draft;
    draft.call = session_->Call("MultiplyStream");
    IntakenJob intaken;
    if (absl::Status s = intake_->Check(draft, &intaken); !s.ok()) return s;
    *problem = intaken.job.problem;
    absl::Status s = session_->Start(
        intaken.job, JobMode::kStreamed,
        [this, done = std::move(done)](absl::StatusOr<std::shared_ptr<ComputeStage>> admitted) {
          if (!admitted.ok()) {
            done(admitted.status());
            return;
          }
          std::shared_ptr<ComputeStage> stage = *admitted;
          stage_ = stage;
          done(Started{.stage = stage,
                       .pool = &stage->job().block_buffers(),
                       .job_id = stage->job().stats().job_id});
        });
    if (!s.ok()) return s;
    return std::nullopt;
  }
  void Cancel() override { session_->Cancel(); }
  absl::Status cancelled_status() const override { return session_->cancelled_status(); }
  // Asked only once the pipeline ended OK; the pipeline holds the stage.
  JobStats stats() const override {
    std::shared_ptr<ComputeStage> stage = stage_.lock();
    return stage != nullptr ? stage->job().stats() : JobStats();
  }

 private:
  const std::shared_ptr<JobSession> session_;
  const Intake* const intake_;
  // Set once admitted, before `done` runs; weak, so that a job admitted
  // after its call ended gives its reservation back at once.
  std::weak_ptr<ComputeStage> stage_;
};

class EchoStages final : public StreamStages {
 public:
  EchoStages(Engine* engine, absl::Time deadline) : engine_(engine), deadline_(deadline) {}

  absl::StatusOr<std::optional<Started>> Begin(const JobDraft& draft, Problem* problem,
                                               Done) override {
    if (!draft.decoded.ok()) return draft.decoded;
    auto job = ValidateHeader(*draft.header, engine_->options().limits, /*streamed=*/true);
    if (!job.ok()) return job.status();
    *problem = job->problem;
    // The echo returns A's bytes as they came: C in A's dtype, whatever
    // the diagonal (a promoted header would otherwise ask for C's size).
    problem->result_dtype = problem->dtype;
    stage_ = std::make_shared<EchoStage>();
    return Started{.stage = stage_, .pool = &engine_->host_block_buffers(), .job_id = 0};
  }
  void Cancel() override {}
  absl::Status cancelled_status() const override { return CancelledStatus(deadline_); }
  JobStats stats() const override { return stage_->stats(); }

 private:
  Engine* const engine_;
  const absl::Time deadline_;
  std::shared_ptr<EchoStage> stage_;
};

}  // namespace

std::unique_ptr<StreamStages> ComputeStreamStages(std::shared_ptr<JobSession> session,
                                                  const Intake* intake) {
  return std::make_unique<ComputeStages>(std::move(session), intake);
}

std::unique_ptr<StreamStages> EchoStreamStages(Engine* engine, absl::Time deadline) {
  return std::make_unique<EchoStages>(engine, deadline);
}

void StreamJob::Begin() {
  std::lock_guard lock(mu_);
  io_->StartRead();
}

void StreamJob::OnMessage(std::unique_ptr<StreamMessage> message, bool call_cancelled) {
  std::shared_ptr<BlockPipeline> pipeline;
  {
    std::lock_guard lock(mu_);
    if (phase_ == Phase::kHeader) {
      if (!finished_ && !done_) OnHeaderLocked(std::move(message), call_cancelled);
      return;
    }
    pipeline = pipeline_;
  }
  if (pipeline == nullptr) return;
  if (message != nullptr) {
    pipeline->OnMessage(std::move(message));
  } else if (call_cancelled) {
    pipeline->Fail(stages_->cancelled_status());
  } else {
    pipeline->OnHalfClose();
  }
}

void StreamJob::OnHeaderLocked(std::unique_ptr<StreamMessage> message, bool call_cancelled) {
  if (message == nullptr) {
    FailLocked(call_cancelled ? stages_->cancelled_status()
                              : absl::InvalidArgumentError(
                                    "stream closed before its header; send a JobHeader first"));
    return;
  }
  absl::StatusOr<v1::JobHeader> header = message->DecodeHeader();
  message.reset();
  JobDraft draft;
  draft.kind = JobKind::kStream;
  draft.decoded = header.status();
  if (header.ok()) draft.header = &*header;
  phase_ = Phase::kAdmission;
  auto started = stages_->Begin(
      draft, &problem_, [self = shared_from_this()](absl::StatusOr<StreamStages::Started> s) {
        self->OnStarted(std::move(s));
      });
  if (!started.ok()) {
    FailLocked(started.status());
  } else if (started->has_value()) {
    AcceptLocked(**started);
  }
}

void StreamJob::OnStarted(absl::StatusOr<StreamStages::Started> started) {
  std::lock_guard lock(mu_);
  if (!started.ok()) {
    FailLocked(started.status());
    return;
  }
  if (finished_ || done_) {
    // The call ended while the job was admitted: its reservation goes back.
    started->stage->End(stages_->cancelled_status(), 0, 0);
    return;
  }
  AcceptLocked(*started);
}

// Tells the client the job is admitted; the pipeline starts once that
// message is out (OnWriteDone), so that it never has two writes in flight.
void StreamJob::AcceptLocked(const StreamStages::Started& started) {
  BlockPipeline::Options options;
  options.max_block_bytes = engine_->options().limits.max_block_bytes;
  options.framing_slack = kBlockFramingSlack;
  Engine* engine = engine_;
  pipeline_ = std::make_shared<BlockPipeline>(
      problem_, options, started.pool,
      [engine](std::function<void()> fn) { engine->Post(std::move(fn)); }, started.stage, this);
  phase_ = Phase::kAccepting;
  accepted_at_ = absl::Now();
  v1::StreamAccepted accepted;
  accepted.set_job_id(started.job_id);
  accepted.set_max_block_bytes(options.max_block_bytes);
  accepted.set_queue_wait_ns(absl::ToInt64Nanoseconds(accepted_at_ - arrived_));
  io_->WriteAccepted(accepted);
}

void StreamJob::OnWriteDone(bool ok) {
  std::shared_ptr<BlockPipeline> pipeline;
  bool accepted = false;
  std::optional<absl::Status> failed;
  {
    std::lock_guard lock(mu_);
    pipeline = pipeline_;
    if (phase_ == Phase::kAccepting) {
      // The acceptance is out: the blocks may come.
      phase_ = Phase::kBlocks;
      accepted = true;
      if (!ok && !pending_error_.has_value()) pending_error_ = stages_->cancelled_status();
      failed = pending_error_;
    }
  }
  if (pipeline == nullptr) return;
  if (accepted) {
    pipeline->Start();
    if (failed.has_value()) pipeline->Fail(*failed);
    return;
  }
  pipeline->OnWriteDone(ok ? absl::OkStatus() : stages_->cancelled_status());
}

void StreamJob::OnCancel() { Fail(stages_->cancelled_status()); }

void StreamJob::Detach() {
  {
    std::lock_guard lock(cancel_mu_);
    cancel_done_ = true;
  }
  std::shared_ptr<BlockPipeline> pipeline;
  {
    std::lock_guard lock(mu_);
    done_ = true;
    pipeline = pipeline_;
  }
  if (pipeline != nullptr) pipeline->DetachIo();
  std::lock_guard lock(mu_);
  io_ = nullptr;
}

void StreamJob::Finish(const absl::Status& status) {
  finished_at_ns_ = absl::ToUnixNanos(absl::Now());
  finished_ = true;
  io_->Finish(status, status.ok() ? stages_->stats() : JobStats());
}

void StreamJob::CheckIdle(absl::Time now) {
  const StreamTimeouts& o = timeouts_;
  if (finished_) {
    // Finish was handed to the call; if its closing message (the stats) is
    // not delivered within the idle timeout, the client stopped reading.
    if (now - absl::FromUnixNanos(finished_at_ns_.load()) >= o.idle) CancelCall();
    return;
  }
  std::shared_ptr<BlockPipeline> pipeline;
  absl::Time accepted_at;
  {
    std::lock_guard lock(mu_);
    if (done_ || finished_) return;
    if (phase_ == Phase::kHeader) {
      if (now - arrived_ >= o.header) {
        FailLocked(absl::DeadlineExceededError(
            absl::StrCat("no header within ", absl::FormatDuration(o.header),
                         " of the stream's start (--stream_header_timeout_s)")));
      }
      return;
    }
    if (phase_ != Phase::kBlocks) return;
    pipeline = pipeline_;
    accepted_at = accepted_at_;
  }
  if (const std::optional<absl::Time> failed = pipeline->failed_at(); failed.has_value()) {
    // The pipeline waits for the write in flight before it finishes; a
    // client that stopped reading never lets that write complete.
    if (now - *failed >= kStuckWriteGrace) CancelCall();
    return;
  }
  if (pipeline->ended()) return;
  if (pipeline->blocks_received() == 0 && now - accepted_at >= o.first_block) {
    pipeline->Fail(absl::DeadlineExceededError(absl::StrCat(
        "no block within ", absl::FormatDuration(o.first_block),
        " of the job's acceptance (--stream_first_block_timeout_s); the job's memory is "
        "given back")));
  } else if (now - pipeline->last_progress() >= o.idle) {
    pipeline->Fail(absl::DeadlineExceededError(
        absl::StrCat("no block received and no result taken for ", absl::FormatDuration(o.idle),
                     " (--stream_idle_timeout_s); the job's memory is given back")));
  }
}

// Cancels the call at the transport: a write that the client never takes
// then fails, and the call ends. Callers hold no lock: OnCancel takes mu_
// and the pipeline's lock (gRPC 1.51 runs a bidi reactor's OnCancel on its
// executor, but nothing here relies on that). cancel_mu_ is
// taken by Detach too, so io is never used after the call is done.
void StreamJob::CancelCall() {
  std::lock_guard lock(cancel_mu_);
  if (!cancel_done_ && io_ != nullptr) io_->CancelCall();
}

void StreamJob::Fail(const absl::Status& s) {
  std::shared_ptr<BlockPipeline> pipeline;
  {
    std::lock_guard lock(mu_);
    if (phase_ != Phase::kBlocks) {
      FailLocked(s);
      return;
    }
    pipeline = pipeline_;
  }
  pipeline->Fail(s);
}

// Before the blocks: cancels a queued admission, and finishes unless the
// acceptance is being written (then it is passed to the pipeline when that
// write is done). Refusals were counted where they were decided.
void StreamJob::FailLocked(const absl::Status& s) {
  if (finished_ || done_) return;
  if (phase_ == Phase::kAccepting) {
    if (!pending_error_.has_value()) pending_error_ = s;
    return;
  }
  if (phase_ == Phase::kAdmission) stages_->Cancel();
  finished_at_ns_ = absl::ToUnixNanos(absl::Now());
  finished_ = true;
  io_->Finish(s, JobStats());
}

}  // namespace dgmm
