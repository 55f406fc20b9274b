#include "service/job/unary_job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dgmm {

void UnaryJob::Begin() {
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
    auto acquired = gate_->Acquire(session_->call().connection_key(), max_message,
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

void UnaryJob::BeginRead(std::unique_ptr<UnaryRequest> request) {
  if (session_->engine().draining()) {
    Refuse(absl::UnavailableError("server is draining; retry on another replica"));
    return;
  }
  small_ = true;
  OnRequest(std::move(request), /*call_cancelled=*/false);
}

void UnaryJob::OnGate(const absl::Status& s) {
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
    // Finished or cancelled meanwhile: give the room back and end it (once).
    ReleaseGate();
    Finish(session_->cancelled_status());
  }
}

void UnaryJob::OnRequest(std::unique_ptr<UnaryRequest> request, bool call_cancelled) {
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
                                  "the Multiply call ended without its request message"));
    }
    return;
  }
  const int64_t size = request->size();
  {
    // Hold what the message really takes until the job is admitted.
    std::lock_guard lock(mu_);
    if (gate_hold_ > 0) {
      const int64_t hold = std::min(gate_hold_, size);
      gate_->Shrink(session_->call().connection_key(), gate_hold_, hold);
      gate_hold_ = hold;
    }
  }
  JobDraft draft;
  draft.kind = JobKind::kUnary;
  draft.message_bytes = size;
  draft.small = small_;
  draft.decoded = request->Peek(&draft.header, &draft.matrix_bytes);
  IntakenJob intaken;
  if (absl::Status s = intake_->Check(draft, &intaken); !s.ok()) {
    ReleaseGate();
    Finish(s);
    return;
  }
  matrix_bytes_ = draft.matrix_bytes;
  result_bytes_ = intaken.job.problem.out_matrix_bytes();
  lines_ = intaken.job.problem.lines();
  request_ = std::move(request);
  absl::Status started = session_->Start(
      intaken.job, JobMode::kWhole,
      [self = shared_from_this()](absl::StatusOr<std::shared_ptr<ComputeStage>> admitted) {
        self->ReleaseGate();  // the job's reservation covers the request now
        self->Run(std::move(admitted));
      },
      /*run_here=*/true);
  if (!started.ok()) {
    ReleaseGate();
    Finish(started);
  }
}

void UnaryJob::Run(absl::StatusOr<std::shared_ptr<ComputeStage>> admitted) {
  if (!admitted.ok()) {
    Finish(admitted.status());
    return;
  }
  std::shared_ptr<ComputeStage> stage = std::move(*admitted);
  absl::StatusOr<HostBuffer> buffer =
      session_->cancelled() ? absl::StatusOr<HostBuffer>(session_->cancelled_status())
                            : stage->job().block_buffers().Take(matrix_bytes_);
  absl::Status s = buffer.ok() ? request_->CopyMatrix(buffer->data(), matrix_bytes_)
                               : buffer.status();
  request_.reset();  // the transport's buffers go back now
  // C wider than A (a promoted result): computed into a buffer of its own.
  std::optional<HostBuffer> wider;
  if (s.ok() && result_bytes_ != matrix_bytes_) {
    absl::StatusOr<HostBuffer> out = stage->job().block_buffers().Take(result_bytes_);
    if (out.ok()) {
      wider = std::move(*out);
    } else {
      s = out.status();
    }
  }
  if (s.ok()) {
    std::byte* in = buffer->data();
    std::byte* out = wider.has_value() ? wider->data() : in;
    s = stage->ProcessTile(Tile{.in = in, .out = out, .first_line = 0, .lines = lines_},
                           [session = session_] { return session->cancelled(); });
  }
  stage->End(s, matrix_bytes_, s.ok() ? result_bytes_ : 0);
  if (s.ok()) result_ = wider.has_value() ? std::move(*wider) : std::move(*buffer);
  {
    std::lock_guard lock(mu_);
    stage_ = std::move(stage);  // its reservation goes back once the reply is sent
  }
  Finish(s);
}

void UnaryJob::Finish(const absl::Status& s) {
  std::lock_guard lock(mu_);
  if (io_ == nullptr) return;
  UnaryIo* io = std::exchange(io_, nullptr);
  reading_since_.reset();
  replied_at_ = absl::Now();
  if (s.ok()) {
    io->Reply(std::move(*result_), static_cast<size_t>(result_bytes_), stage_->job().stats());
  } else {
    io->Fail(s);
  }
}

void UnaryJob::OnCancel() {
  session_->Cancel();
  std::optional<ReceiveGate::Ticket> waiting;
  {
    std::lock_guard lock(mu_);
    waiting = gate_ticket_;
  }
  if (waiting) gate_->Cancel(*waiting, session_->cancelled_status());
}

void UnaryJob::Detach() {
  {
    std::lock_guard lock(live_mu_);
    live_io_ = nullptr;
  }
  ReleaseGate();
  std::shared_ptr<ComputeStage> stage;
  {
    std::lock_guard lock(mu_);
    io_ = nullptr;
    reading_since_.reset();
    replied_at_.reset();
    stage = std::move(stage_);
  }
  // Its reservation goes back (and a GPU job's context is freed) outside mu_.
  stage.reset();
}

void UnaryJob::CheckIdle(absl::Time now) {
  bool stuck_reply = false;
  bool timed_out = false;
  {
    std::lock_guard lock(mu_);
    if (reading_since_.has_value() && now - *reading_since_ >= timeouts_.header &&
        io_ != nullptr) {
      timed_out = true;
      reading_since_.reset();
      replied_at_ = now;
      std::exchange(io_, nullptr)
          ->Fail(absl::DeadlineExceededError(absl::StrCat(
              "the Multiply request did not arrive within ",
              absl::FormatDuration(timeouts_.header),
              " of the server starting to read it (--stream_header_timeout_s)")));
    } else {
      stuck_reply = replied_at_.has_value() && now - *replied_at_ >= timeouts_.idle;
    }
  }
  if (timed_out) ReleaseGate();
  if (stuck_reply) {
    // The client stopped reading: its flow-control window stays closed.
    std::lock_guard lock(live_mu_);
    if (live_io_ != nullptr) live_io_->CancelCall();
  }
}

void UnaryJob::ReleaseGate() {
  int64_t hold = 0;
  {
    std::lock_guard lock(mu_);
    std::swap(hold, gate_hold_);
  }
  if (hold > 0) gate_->Shrink(session_->call().connection_key(), hold, 0);
}

void UnaryJob::Refuse(const absl::Status& s) {
  session_->Refuse(s);
  ReleaseGate();
  Finish(s);
}

}  // namespace dgmm
