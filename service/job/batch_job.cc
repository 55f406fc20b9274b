#include "service/job/batch_job.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/outcome.h"

namespace dgmm {
namespace {

// Each result's place in the reply's buffer starts on a 64-byte boundary.
int64_t AlignUp(int64_t n) { return (n + 63) & ~int64_t{63}; }

}  // namespace

void BatchJob::Begin() {
  Engine& engine = session_->engine();
  if (engine.draining()) {
    Refuse(absl::UnavailableError("server is draining; retry on another replica"));
    return;
  }
  // Until the message is in, its size is unknown: the gate's charge for that.
  const int64_t max_message =
      gate_->UnsizedCharge(engine.options().limits.max_unary_message_bytes);
  absl::Status refused;
  {
    std::lock_guard lock(mu_);  // OnGate and OnCancel see the ticket
    auto acquired =
        gate_->Acquire(session_->call().connection_key(), max_message,
                       [self = shared_from_this()](absl::Status s) { self->OnGate(s); });
    if (!acquired.ok()) {
      refused = acquired.status();
    } else if (acquired->granted) {
      gate_hold_ = max_message;
      reading_since_ = absl::Now();
      if (io_ != nullptr) io_->StartRead();
    } else {
      gate_ticket_ = acquired->ticket;
    }
  }
  if (!refused.ok()) Refuse(refused);
}

void BatchJob::OnGate(const absl::Status& s) {
  if (!s.ok()) {
    Finish(s);
    return;
  }
  bool gone = false;
  {
    std::lock_guard lock(mu_);
    gate_ticket_.reset();
    gate_hold_ =
        gate_->UnsizedCharge(session_->engine().options().limits.max_unary_message_bytes);
    gone = io_ == nullptr || session_->cancelled();
    if (!gone) {
      reading_since_ = absl::Now();
      io_->StartRead();
    }
  }
  if (gone) {
    ReleaseGate();
    Finish(session_->cancelled_status());
  }
}

void BatchJob::OnRequest(std::unique_ptr<BatchRequest> request, bool call_cancelled) {
  bool finished = false;
  {
    std::lock_guard lock(mu_);
    reading_since_.reset();
    finished = io_ == nullptr;  // the watchdog ended it while it arrived
  }
  if (finished || request == nullptr) {
    ReleaseGate();
    if (!finished) {
      Finish(call_cancelled ? session_->cancelled_status()
                            : absl::InvalidArgumentError(
                                  "the MultiplyBatch call ended without its request message"));
    }
    return;
  }
  const int64_t size = request->size();
  {
    // Hold what the message really takes until the batch is admitted.
    std::lock_guard lock(mu_);
    const int64_t hold = std::min(gate_hold_, size);
    gate_->Shrink(session_->call().connection_key(), gate_hold_, hold);
    gate_hold_ = hold;
  }
  const RequestLimits& limits = session_->engine().options().limits;
  // The batch's own checks, before any job's: its size, its framing, its count.
  if (size > limits.max_unary_message_bytes) {
    Refuse(WithOutcome(
        absl::ResourceExhaustedError(absl::StrCat(
            "MultiplyBatch request of ", size, " bytes exceeds this server's max unary message of ",
            limits.max_unary_message_bytes,
            " bytes (--max_unary_message_bytes); send fewer jobs per batch")),
        Outcome::kMessageTooLarge));
    return;
  }
  int64_t total_jobs = 0;
  if (absl::Status s = request->Peek(limits.max_batch_jobs, &jobs_, &total_jobs); !s.ok()) {
    Refuse(s);
    return;
  }
  if (total_jobs > limits.max_batch_jobs) {
    Refuse(WithOutcome(
        absl::ResourceExhaustedError(absl::StrCat(
            "MultiplyBatch of ", total_jobs, " jobs exceeds this server's ", limits.max_batch_jobs,
            " jobs per batch (--max_batch_jobs); split the batch")),
        Outcome::kMessageTooLarge));
    return;
  }
  // Each job through the intake, as a Multiply request of its own.
  reply_.jobs.resize(jobs_.size());
  intaken_.resize(jobs_.size());
  std::vector<const JobRequest*> valid_jobs;
  int64_t results_bytes = 0;
  for (size_t i = 0; i < jobs_.size(); ++i) {
    const BatchRequest::Job& job = jobs_[i];
    JobDraft draft;
    draft.kind = JobKind::kUnary;
    draft.message_bytes = job.message_bytes;
    draft.decoded = job.decoded;
    draft.header = job.header;
    draft.matrix_bytes = job.matrix_bytes;
    intaken_[i] = std::make_unique<IntakenJob>();
    reply_.jobs[i].status = intake_->Check(draft, intaken_[i].get());
    if (!reply_.jobs[i].status.ok()) continue;
    valid_.push_back(i);
    valid_jobs.push_back(&intaken_[i]->job);
    reply_.jobs[i].offset = results_bytes;
    // The result is C's size (more than A's for a promoted result).
    reply_.jobs[i].bytes = intaken_[i]->job.problem.out_matrix_bytes();
    results_bytes += AlignUp(reply_.jobs[i].bytes);
  }
  if (valid_.empty()) {
    // Nothing to run (an empty batch, or every job refused): the statuses.
    ReleaseGate();
    Finish(absl::OkStatus());
    return;
  }
  request_ = std::move(request);
  absl::Status started = session_->StartBatch(
      valid_jobs,
      [self = shared_from_this()](absl::StatusOr<std::unique_ptr<AdmittedBatch>> admitted) {
        self->ReleaseGate();  // the batch's reservation covers the request now
        self->Run(std::move(admitted));
      },
      /*run_here=*/true);
  if (!started.ok()) {
    ReleaseGate();
    Finish(started);
  }
}

void BatchJob::Run(absl::StatusOr<std::unique_ptr<AdmittedBatch>> admitted) {
  if (!admitted.ok()) {
    Finish(admitted.status());
    return;
  }
  std::unique_ptr<AdmittedBatch> batch = std::move(*admitted);
  for (size_t i : valid_) reply_.results_bytes += AlignUp(reply_.jobs[i].bytes);
  // From the CPU's pool: memory already mapped and reused from call to call
  // (a fresh allocation per batch cost its page faults), and sent from in
  // place (large results as slices of it).
  absl::StatusOr<HostBuffer> results =
      session_->engine().host_block_buffers().Take(reply_.results_bytes);
  if (!results.ok()) {
    // Every job ends with the allocation's error, each counted once.
    for (size_t k = 0; k < valid_.size(); ++k) {
      session_->Refuse(results.status(), &intaken_[valid_[k]]->job);
    }
    {
      std::lock_guard lock(mu_);
      batch_ = std::move(batch);
    }
    request_.reset();
    Finish(results.status());
    return;
  }
  reply_.results = std::move(*results);
  const CancelFn cancelled = [session = session_] { return session->cancelled(); };
  absl::Status call_status;
  for (size_t k = 0; k < valid_.size(); ++k) {
    const size_t i = valid_[k];
    BatchReply::Job& out = reply_.jobs[i];
    if (session_->cancelled()) {
      // The call is over: the jobs not run yet end here, each counted once.
      call_status = session_->cancelled_status();
      for (size_t rest = k; rest < valid_.size(); ++rest) {
        session_->Refuse(call_status, &intaken_[valid_[rest]]->job);
      }
      break;
    }
    absl::StatusOr<std::unique_ptr<ActiveJob>> active = batch->Activate(k);
    if (!active.ok()) {
      out.status = active.status();  // counted by the engine
      continue;
    }
    ComputeStage stage(std::move(*active),
                       [session = session_] { return session->cancelled_status(); });
    const Problem& problem = intaken_[i]->job.problem;
    const int64_t bytes = problem.matrix_bytes();
    const int64_t out_bytes = out.bytes;  // C's
    const bool wider = out_bytes != bytes;
    const int64_t lines = problem.lines();
    std::byte* place = reply_.results.data() + out.offset;
    absl::Status s;
    if (stage.job().stats().device_index() < 0) {
      if (!wider) {
        // The CPU computes in place, in the reply's buffer.
        s = request_->CopyMatrix(i, place, bytes);
        if (s.ok()) s = stage.Process(place, 0, lines, cancelled);
      } else {
        // C wider than A: A in a block buffer, C computed into the reply's.
        absl::StatusOr<HostBuffer> buffer = stage.job().block_buffers().Take(bytes);
        s = buffer.ok() ? request_->CopyMatrix(i, buffer->data(), bytes) : buffer.status();
        if (s.ok()) {
          s = stage.ProcessTile(
              Tile{.in = buffer->data(), .out = place, .first_line = 0, .lines = lines}, cancelled);
        }
      }
    } else {
      // A GPU job as a unary one: through a block buffer of its device (and
      // one of C's size when C is wider).
      absl::StatusOr<HostBuffer> buffer = stage.job().block_buffers().Take(bytes);
      s = buffer.ok() ? request_->CopyMatrix(i, buffer->data(), bytes) : buffer.status();
      std::optional<HostBuffer> result;
      if (s.ok() && wider) {
        absl::StatusOr<HostBuffer> taken = stage.job().block_buffers().Take(out_bytes);
        if (taken.ok()) {
          result = std::move(*taken);
        } else {
          s = taken.status();
        }
      }
      std::byte* computed = result.has_value() ? result->data() : s.ok() ? buffer->data() : nullptr;
      if (s.ok()) {
        s = stage.ProcessTile(
            Tile{.in = buffer->data(), .out = computed, .first_line = 0, .lines = lines},
            cancelled);
      }
      if (s.ok()) std::memcpy(place, computed, static_cast<size_t>(out_bytes));
    }
    stage.End(s, bytes, s.ok() ? out_bytes : 0);
    out.status = s;
    out.stats = stage.job().stats();
  }
  request_.reset();  // the transport's buffers go back now
  {
    std::lock_guard lock(mu_);
    batch_ = std::move(batch);  // its reservation goes back once the reply is sent
  }
  Finish(call_status);
}

void BatchJob::Finish(const absl::Status& s) {
  std::lock_guard lock(mu_);
  if (io_ == nullptr) return;
  BatchIo* io = std::exchange(io_, nullptr);
  reading_since_.reset();
  replied_at_ = absl::Now();
  if (s.ok()) {
    io->Reply(std::move(reply_));
  } else {
    io->Fail(s);
  }
}

void BatchJob::OnCancel() {
  session_->Cancel();
  std::optional<ReceiveGate::Ticket> waiting;
  {
    std::lock_guard lock(mu_);
    waiting = gate_ticket_;
  }
  if (waiting) gate_->Cancel(*waiting, session_->cancelled_status());
}

void BatchJob::Detach() {
  {
    std::lock_guard lock(live_mu_);
    live_io_ = nullptr;
  }
  ReleaseGate();
  std::lock_guard lock(mu_);
  io_ = nullptr;
  reading_since_.reset();
  replied_at_.reset();
  batch_.reset();
}

void BatchJob::CheckIdle(absl::Time now) {
  bool stuck_reply = false;
  bool timed_out = false;
  {
    std::lock_guard lock(mu_);
    if (reading_since_.has_value() && now - *reading_since_ >= timeouts_.header && io_ != nullptr) {
      timed_out = true;
      reading_since_.reset();
      replied_at_ = now;
      std::exchange(io_, nullptr)
          ->Fail(absl::DeadlineExceededError(
              absl::StrCat("the MultiplyBatch request did not arrive within ",
                           absl::FormatDuration(timeouts_.header),
                           " of the server starting to read it (--stream_header_timeout_s)")));
    } else {
      stuck_reply = replied_at_.has_value() && now - *replied_at_ >= timeouts_.idle;
    }
  }
  if (timed_out) ReleaseGate();
  if (stuck_reply) {
    std::lock_guard lock(live_mu_);
    if (live_io_ != nullptr) live_io_->CancelCall();
  }
}

void BatchJob::ReleaseGate() {
  int64_t hold = 0;
  {
    std::lock_guard lock(mu_);
    std::swap(hold, gate_hold_);
  }
  if (hold > 0) gate_->Shrink(session_->call().connection_key(), hold, 0);
}

void BatchJob::Refuse(const absl::Status& s) {
  session_->Refuse(s);
  ReleaseGate();
  Finish(s);
}

}  // namespace dgmm
