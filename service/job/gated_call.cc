#include "service/job/gated_call.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dgmm {

void GatedCall::Begin() {
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

void GatedCall::OnGate(const absl::Status& s) {
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

bool GatedCall::Arrived(bool arrived, bool call_cancelled, int64_t size) {
  bool finished = false;
  {
    std::lock_guard lock(mu_);
    reading_since_.reset();
    finished = io_ == nullptr;  // the watchdog ended it while it arrived
  }
  if (finished || !arrived) {
    ReleaseGate();
    if (!finished) {
      Finish(call_cancelled ? session_->cancelled_status()
                            : absl::InvalidArgumentError(absl::StrCat(
                                  "the ", method_, " call ended without its request message")));
    }
    return false;
  }
  // Hold what the message really takes until the job is admitted.
  std::lock_guard lock(mu_);
  if (gate_hold_ > 0) {
    const int64_t hold = std::min(gate_hold_, size);
    gate_->Shrink(session_->call().connection_key(), gate_hold_, hold);
    gate_hold_ = hold;
  }
  return true;
}

void GatedCall::Finish(const absl::Status& s) {
  std::lock_guard lock(mu_);
  if (io_ == nullptr) return;
  GatedCallIo* io = std::exchange(io_, nullptr);
  reading_since_.reset();
  replied_at_ = absl::Now();
  if (s.ok()) {
    SendReply(io);
  } else {
    io->Fail(s);
  }
}

void GatedCall::OnCancel() {
  session_->Cancel();
  std::optional<ReceiveGate::Ticket> waiting;
  {
    std::lock_guard lock(mu_);
    waiting = gate_ticket_;
  }
  if (waiting) gate_->Cancel(*waiting, session_->cancelled_status());
}

void GatedCall::Detach() {
  {
    std::lock_guard lock(live_mu_);
    live_io_ = nullptr;
  }
  ReleaseGate();
  {
    std::lock_guard lock(mu_);
    io_ = nullptr;
    reading_since_.reset();
    replied_at_.reset();
  }
  // Its reservation goes back (and a GPU job's context is freed) outside mu_.
  DropJob();
}

void GatedCall::CheckIdle(absl::Time now) {
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
              "the ", method_, " request did not arrive within ",
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

void GatedCall::ReleaseGate() {
  int64_t hold = 0;
  {
    std::lock_guard lock(mu_);
    std::swap(hold, gate_hold_);
  }
  if (hold > 0) gate_->Shrink(session_->call().connection_key(), hold, 0);
}

void GatedCall::End(const absl::Status& s) {
  ReleaseGate();
  Finish(s);
}

void GatedCall::Refuse(const absl::Status& s) {
  session_->Refuse(s);
  ReleaseGate();
  Finish(s);
}

absl::StatusOr<HostBuffer> ComputeWhole(ComputeStage& stage, int64_t a_bytes, int64_t c_bytes,
                                        int64_t lines,
                                        absl::FunctionRef<absl::Status(std::byte*)> copy_a,
                                        const CancelFn& cancelled) {
  absl::StatusOr<HostBuffer> a = stage.job().block_buffers().Take(a_bytes);
  if (!a.ok()) return a.status();
  if (absl::Status s = copy_a(a->data()); !s.ok()) return s;
  std::optional<HostBuffer> wider;
  if (c_bytes != a_bytes) {
    absl::StatusOr<HostBuffer> c = stage.job().block_buffers().Take(c_bytes);
    if (!c.ok()) return c.status();
    wider = std::move(*c);
  }
  std::byte* out = wider.has_value() ? wider->data() : a->data();
  absl::Status s = stage.ProcessTile(
      Tile{.in = a->data(), .out = out, .first_line = 0, .lines = lines}, cancelled);
  if (!s.ok()) return s;
  return wider.has_value() ? std::move(*wider) : std::move(*a);
}

}  // namespace dgmm
