#include "service/handlers.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "proto/wire.h"
#include "service/host_buffers.h"
#include "service/pipeline/block_pipeline.h"
#include "service/pipeline/stages.h"
#include "service/receive_gate.h"
#include "service/region_service.h"
#include "service/status_map.h"
#include "service/validator.h"
#include "service/wire_buffers.h"

namespace dgmm {
namespace {

absl::Time DeadlineOf(const grpc::CallbackServerContext* context) {
  const auto d = context->deadline();
  if (d >= std::chrono::system_clock::time_point::max() - std::chrono::hours(24 * 365)) {
    return absl::InfiniteFuture();
  }
  return absl::FromChrono(d);
}

// A cancelled call ends with DEADLINE_EXCEEDED when its deadline is what
// ended it, else with CANCELLED. The client's own deadline timer fires a
// little before the server's copy of the deadline (which is the remaining
// time on arrival, so it includes the transit), and its cancellation can
// reach the server first: a cancel within this margin of the deadline counts
// as the deadline.
constexpr absl::Duration kDeadlineMargin = absl::Milliseconds(250);

// Who a call comes from, for the fair share of the queue: the peer's address
// without its port ("127.0.0.1", "::1"), so that one client's connections
// count as one, with the index of its bearer token when several are
// configured.
std::string ClientKey(const grpc::CallbackServerContext* context, int token_index) {
  std::string peer = context->peer();  // "ipv4:1.2.3.4:5", "ipv6:[::1]:5", "unix:..."
  absl::string_view host(peer);
  if (const size_t colon = host.find(':'); colon != absl::string_view::npos) {
    const absl::string_view scheme = host.substr(0, colon);
    if (scheme == "ipv4" || scheme == "ipv6") {
      host.remove_prefix(colon + 1);
      if (!host.empty() && host.front() == '[') {
        host = host.substr(1, host.find(']') - 1);
      } else if (const size_t port = host.rfind(':'); port != absl::string_view::npos) {
        host = host.substr(0, port);
      }
    }
  }
  return token_index > 0 ? absl::StrCat("token", token_index, "@", host) : std::string(host);
}

// Counts a call of the service from its start until gRPC is done with it
// (Server::Drain waits for the count to reach zero).
class CallCount {
 public:
  explicit CallCount(std::atomic<int64_t>* n) : n_(n) { n_->fetch_add(1); }
  ~CallCount() { n_->fetch_sub(1); }
  CallCount(const CallCount&) = delete;
  CallCount& operator=(const CallCount&) = delete;

 private:
  std::atomic<int64_t>* n_;
};

absl::Status CancelledStatus(absl::Time deadline) {
  if (absl::Now() + kDeadlineMargin >= deadline) {
    return absl::DeadlineExceededError("the client's deadline expired while the job ran");
  }
  return absl::CancelledError("the client cancelled the call");
}

// ---------------------------------------------------------------- Multiply

// Multiply is unary on the wire, but the server takes it as a stream of
// one message (handlers.h): its reactor starts before the message is read,
// so the message is read only once the ReceiveGate has room for it, and a
// draining server refuses it without reading it. The header is then read
// without touching the matrix; once the job is admitted the matrix is copied
// once out of gRPC's buffers into a block buffer of the job's device (pinned
// for a GPU), computed in place, and sent back as a slice that owns the
// buffer.
//
// State shared by the reactor, the gate's callback and the job's worker;
// outlives all three. Every field is guarded by mu, except that the reactor's
// read owns `request` until it completes and the job's worker owns it and
// `response` after admission.
struct UnaryCall : StreamWatchdog::Watched, std::enable_shared_from_this<UnaryCall> {
  Engine* engine = nullptr;
  ReceiveGate* gate = nullptr;
  grpc::CallbackServerContext* context = nullptr;
  StreamTimeouts timeouts;
  absl::Time arrived;
  absl::Time deadline;
  std::string client;
  std::atomic<bool> cancelled{false};

  // For the watchdog: when the request's read started (none: not reading),
  // and when the reply was handed to gRPC.
  std::optional<absl::Time> reading_since;
  std::optional<absl::Time> replied_at;
  // OnDone sets `done` under cancel_mu, so that the watchdog's TryCancel
  // never touches a finished context (TryCancel may run OnCancel inline,
  // which takes mu: cancel_mu is not mu).
  std::mutex cancel_mu;
  bool done = false;

  std::mutex mu;
  StreamReactorBase* reactor = nullptr;  // null once finished
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  std::optional<ReceiveGate::Ticket> gate_ticket;  // while waiting at the gate
  int64_t gate_hold = 0;                           // bytes held in the gate
  std::optional<Admission::Ticket> ticket;         // while waiting for admission
  std::unique_ptr<ComputeStage> job;  // released in OnDone, after the reply is sent
  int64_t lines = 0;
  size_t matrix_bytes = 0;

  // Ends the call with `s` (once); an OK status sends `response` first.
  void Finish(const absl::Status& s) {
    std::lock_guard lock(mu);
    if (reactor == nullptr) return;
    StreamReactorBase* r = reactor;
    reactor = nullptr;
    reading_since.reset();
    replied_at = absl::Now();
    if (s.ok()) {
      r->StartWriteAndFinish(&response, grpc::WriteOptions(), grpc::Status::OK);
    } else {
      r->Finish(ToGrpcStatus(s, context));
    }
  }

  // Counts a refusal and ends the call with it.
  void Refuse(const absl::Status& s) {
    engine->RecordRejected(s);
    ReleaseGate();
    Finish(s);
  }

  // Gives the gate back whatever this call holds there.
  void ReleaseGate() {
    int64_t hold = 0;
    {
      std::lock_guard lock(mu);
      std::swap(hold, gate_hold);
    }
    if (hold > 0) gate->Shrink(client, hold, 0);
  }

  // The gate let the call in (or cancelled its wait): read the message.
  void OnGate(const absl::Status& s) {
    if (!s.ok()) {
      Finish(s);
      return;
    }
    StreamReactorBase* r = nullptr;
    {
      std::lock_guard lock(mu);
      gate_ticket.reset();
      gate_hold = engine->options().limits.max_unary_message_bytes;
      if (!cancelled) r = reactor;
    }
    if (r == nullptr) {
      // Finished or cancelled meanwhile: end it (once) and give the room back.
      ReleaseGate();
      Finish(CancelledStatus(deadline));
      return;
    }
    {
      std::lock_guard lock(mu);
      reading_since = absl::Now();
    }
    // Outside mu: a reaction may run inline. Nothing else finishes the call
    // while its read is not started, so the reactor is still there.
    r->StartRead(&request);
  }

  // The watchdog: a request that has not arrived within timeouts.header of
  // its read's start ends the call (its room at the gate goes back); a reply
  // that gRPC has not delivered within timeouts.idle (the client stopped
  // reading: its flow-control window stays closed) cancels the call, which
  // returns the job's reservation.
  void CheckIdle(absl::Time now) override {
    bool stuck_reply = false;
    bool timed_out = false;
    {
      std::lock_guard lock(mu);
      if (reading_since.has_value() && now - *reading_since >= timeouts.header &&
          reactor != nullptr) {
        timed_out = true;
        reading_since.reset();
        StreamReactorBase* r = std::exchange(reactor, nullptr);
        replied_at = now;
        r->Finish(ToGrpcStatus(
            absl::DeadlineExceededError(absl::StrCat(
                "the Multiply request did not arrive within ",
                absl::FormatDuration(timeouts.header),
                " of the server starting to read it (--stream_header_timeout_s)")),
            context));
      } else {
        stuck_reply = replied_at.has_value() && now - *replied_at >= timeouts.idle;
      }
    }
    if (timed_out) ReleaseGate();
    if (stuck_reply) {
      std::lock_guard lock(cancel_mu);
      if (!done) context->TryCancel();
    }
  }

  // The message is in (or the call ended without one).
  void OnMessage(bool ok) {
    bool finished = false;
    {
      std::lock_guard lock(mu);
      reading_since.reset();
      finished = reactor == nullptr;  // the watchdog ended it while it arrived
    }
    if (finished) {
      ReleaseGate();
      return;
    }
    if (!ok) {
      ReleaseGate();
      Finish(context->IsCancelled()
                 ? CancelledStatus(deadline)
                 : absl::InvalidArgumentError(
                       "the Multiply call ended without its request message"));
      return;
    }
    const int64_t size = static_cast<int64_t>(request.Length());
    {
      // Hold what the message really takes until the job is admitted.
      std::lock_guard lock(mu);
      const int64_t hold = std::min(gate_hold, size);
      gate->Shrink(client, gate_hold, hold);
      gate_hold = hold;
    }
    const EngineOptions& o = engine->options();
    if (size > o.limits.max_unary_message_bytes) {
      Refuse(WithOutcome(
          absl::ResourceExhaustedError(absl::StrCat(
              "Multiply request of ", size, " bytes exceeds this server's max unary message of ",
              o.limits.max_unary_message_bytes,
              " bytes (--max_unary_message_bytes); send it with MultiplyStream")),
          Outcome::kMessageTooLarge));
      return;
    }
    // Checks in the order the proto states: the message's size, the header,
    // whether the job could ever fit (RESOURCE_EXHAUSTED, too_large), and
    // only then the matrix payload against the header.
    absl::StatusOr<wire::MultiplyRequestView> view = wire::PeekMultiplyRequest(request);
    absl::StatusOr<JobRequest> job_request =
        view.ok() ? ValidateHeader(view->header, o.limits, /*streamed=*/false) : view.status();
    absl::Status valid =
        job_request.ok() ? engine->CheckFits(*job_request, JobMode::kWhole) : job_request.status();
    if (valid.ok()) valid = ValidateMatrixPayload(job_request->problem, view->matrix_bytes);
    if (!valid.ok()) {
      Refuse(valid);
      return;
    }
    lines = job_request->problem.lines();
    matrix_bytes = view->matrix_bytes;
    std::unique_lock lock(mu);  // OnCancel must see the ticket
    reading_since.reset();
    auto started = engine->Start(
        *job_request, JobMode::kWhole, arrived, deadline,
        [call = shared_from_this()](absl::StatusOr<std::unique_ptr<ActiveJob>> admitted) {
          call->ReleaseGate();  // the job's reservation covers the request now
          call->Run(std::move(admitted));
        },
        client);
    if (!started.ok()) {
      const int64_t hold = std::exchange(gate_hold, 0);
      if (hold > 0) gate->Shrink(client, hold, 0);
      if (reactor != nullptr) {
        StreamReactorBase* r = std::exchange(reactor, nullptr);
        r->Finish(ToGrpcStatus(started.status(), context));
      }
      return;
    }
    ticket = *started;
    lock.unlock();
    // A cancel that came before the ticket existed found nothing to cancel:
    // both sides publish before they look, so one of them sees the other.
    if (cancelled) engine->Cancel(*started, CancelledStatus(deadline));
  }

  // Runs on a job worker once admitted: the compute stage on the job's one
  // block, the request's matrix copied into a block buffer first.
  void Run(absl::StatusOr<std::unique_ptr<ActiveJob>> admitted) {
    if (!admitted.ok()) {
      Finish(admitted.status());
      return;
    }
    auto stage = std::make_unique<ComputeStage>(
        std::move(*admitted), [d = deadline] { return CancelledStatus(d); });
    absl::Status s;
    absl::StatusOr<HostBuffer> buffer =
        cancelled ? absl::StatusOr<HostBuffer>(CancelledStatus(deadline))
                  : stage->job().block_buffers().Take(static_cast<int64_t>(matrix_bytes));
    if (!buffer.ok()) {
      s = buffer.status();
    } else {
      s = wire::CopyMultiplyMatrix(request, buffer->data(), matrix_bytes);
    }
    if (s.ok()) s = stage->Process(buffer->data(), 0, lines, [this] { return cancelled.load(); });
    const int64_t bytes = static_cast<int64_t>(matrix_bytes);
    stage->End(s, bytes, s.ok() ? bytes : 0);
    if (s.ok()) {
      response = wire::EncodeMultiplyResponse(ToSlice(std::move(*buffer), matrix_bytes),
                                              stage->job().stats());
    }
    {
      std::lock_guard lock(mu);
      job = std::move(stage);  // its reservation goes back once the reply is sent
    }
    Finish(s);
  }
};

class UnaryReactor final : public StreamReactorBase {
 public:
  UnaryReactor(Engine* engine, ReceiveGate* gate, grpc::CallbackServerContext* context,
               StreamWatchdog* watchdog, StreamTimeouts timeouts, std::atomic<int64_t>* calls,
               std::string client)
      : count_(calls), call_(std::make_shared<UnaryCall>()) {
    UnaryCall& c = *call_;
    c.engine = engine;
    c.gate = gate;
    c.context = context;
    c.timeouts = timeouts;
    watchdog->Watch(call_);
    c.arrived = absl::Now();
    c.deadline = DeadlineOf(context);
    c.client = std::move(client);
    c.reactor = this;
    if (engine->draining()) {
      engine->RecordRejected(absl::UnavailableError(""));
      c.Finish(absl::UnavailableError("server is draining; retry on another replica"));
      return;
    }
    bool read_now = false;
    {
      std::lock_guard lock(c.mu);  // OnGate and OnCancel see the ticket
      auto acquired = gate->Acquire(c.client, engine->options().limits.max_unary_message_bytes,
                                    [call = call_](absl::Status s) { call->OnGate(s); });
      if (!acquired.ok()) {
        engine->RecordRejected(acquired.status());
        StreamReactorBase* r = std::exchange(c.reactor, nullptr);
        r->Finish(ToGrpcStatus(acquired.status(), context));
        return;
      }
      if (acquired->granted) {
        c.gate_hold = engine->options().limits.max_unary_message_bytes;
        c.reading_since = absl::Now();
        read_now = true;
      } else {
        c.gate_ticket = acquired->ticket;
      }
    }
    if (read_now) StartRead(&c.request);
  }

  void OnReadDone(bool ok) override { call_->OnMessage(ok); }

  void OnCancel() override {
    call_->cancelled = true;
    std::optional<ReceiveGate::Ticket> waiting;
    std::optional<Admission::Ticket> ticket;
    {
      std::lock_guard lock(call_->mu);
      waiting = call_->gate_ticket;
      ticket = call_->ticket;
    }
    if (waiting) call_->gate->Cancel(*waiting, CancelledStatus(call_->deadline));
    if (ticket) call_->engine->Cancel(*ticket, CancelledStatus(call_->deadline));
  }

  void OnDone() override {
    {
      std::lock_guard lock(call_->cancel_mu);
      call_->done = true;
    }
    call_->ReleaseGate();
    {
      std::lock_guard lock(call_->mu);
      call_->reactor = nullptr;
      call_->reading_since.reset();
      call_->replied_at.reset();
      call_->job.reset();
    }
    delete this;
  }

 private:
  CallCount count_;
  std::shared_ptr<UnaryCall> call_;
};

// ---------------------------------------------------------- MultiplyStream

// A MultiplyStream message as it arrived, for the block pipeline: decoded on
// the job's worker, its payload copied once out of gRPC's slices.
class StreamMessage final : public BlockMessage {
 public:
  explicit StreamMessage(grpc::ByteBuffer* message) { message_.Swap(message); }
  size_t size() const override { return message_.Length(); }
  absl::StatusOr<Decoded> Decode(const Place& place) override {
    absl::StatusOr<wire::StreamRequest> request = wire::DecodeStreamRequest(
        &message_, [&](int64_t first_line, size_t size) { return place(first_line, size); });
    message_.Clear();  // gRPC's buffers go back now
    if (!request.ok()) return request.status();
    if (request->kind == wire::StreamRequest::Kind::kHeader) {
      return absl::InvalidArgumentError(
          "a second header arrived; MultiplyStream takes exactly one header, then blocks");
    }
    return Decoded{request->first_line, request->size};
  }

 private:
  grpc::ByteBuffer message_;
};

// One streamed job (or echo) at the transport level: the header, admission
// and the acceptance, then the blocks through a BlockPipeline, then the
// stats. The header and admission phases are guarded by mu_; once the
// pipeline runs, its events go straight to it and mu_ is never held while
// calling into it (the pipeline calls this object's PipelineIo methods under
// its own lock; those use only reactor_, which stays valid until OnDone
// detaches the pipeline).
class StreamCall : public StreamWatchdog::Watched,
                   public PipelineIo,
                   public std::enable_shared_from_this<StreamCall> {
 public:
  // With `echo`, admission and compute are left out (the streaming
  // benchmark's Echo service); the protocol checks and the pipeline are the
  // same.
  StreamCall(Engine* engine, grpc::CallbackServerContext* context, StreamReactorBase* reactor,
             bool echo, StreamWatchdog* watchdog, StreamTimeouts timeouts, std::string client)
      : engine_(engine),
        timeouts_(timeouts),
        watchdog_(watchdog),
        context_(context),
        echo_(echo),
        arrived_(absl::Now()),
        deadline_(DeadlineOf(context)),
        client_(std::move(client)),
        reactor_(reactor) {}

  void Begin() {
    {
      std::lock_guard lock(mu_);
      reactor_->StartRead(&request_);
    }
    if (watchdog_ != nullptr) watchdog_->Watch(weak_from_this());
  }

  // ---- gRPC's reactions, forwarded by StreamReactor.

  void OnReadDone(bool ok) {
    std::shared_ptr<BlockPipeline> pipeline;
    {
      std::lock_guard lock(mu_);
      if (phase_ == Phase::kHeader) {
        if (!finished_ && !done_) OnHeaderLocked(ok);
        return;
      }
      pipeline = pipeline_;
    }
    if (pipeline == nullptr) return;
    if (ok) {
      pipeline->OnMessage(std::make_unique<StreamMessage>(&request_));
    } else if (context_->IsCancelled()) {
      pipeline->Fail(CancelledStatus(deadline_));
    } else {
      pipeline->OnHalfClose();
    }
  }

  void OnWriteDone(bool ok) {
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
        if (!ok && !pending_error_.has_value()) pending_error_ = CancelledStatus(deadline_);
        failed = pending_error_;
      } else {
        block_write_.Clear();
      }
    }
    if (pipeline == nullptr) return;
    if (accepted) {
      pipeline->Start();
      if (failed.has_value()) pipeline->Fail(*failed);
      return;
    }
    pipeline->OnWriteDone(ok ? absl::OkStatus() : CancelledStatus(deadline_));
  }

  void OnCancel() { Fail(CancelledStatus(deadline_)); }

  void OnDone() {
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
    reactor_ = nullptr;
  }

  void CheckIdle(absl::Time now) override {
    const StreamTimeouts& o = timeouts_;
    std::shared_ptr<BlockPipeline> pipeline;
    absl::Time accepted_at;
    if (finished_) {
      // Finish was handed to gRPC; if its closing message (the stats) is not
      // delivered within the idle timeout, the client stopped reading:
      // cancel the call so that it ends.
      if (now - absl::FromUnixNanos(finished_at_ns_.load()) >= o.idle) CancelCall();
      return;
    }
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
      pipeline->Fail(absl::DeadlineExceededError(absl::StrCat(
          "no block received and no result taken for ",
          absl::FormatDuration(o.idle),
          " (--stream_idle_timeout_s); the job's memory is given back")));
    }
  }

  // ---- PipelineIo: called by the pipeline under its lock.

  void StartRead() override { reactor_->StartRead(&request_); }

  void StartWrite(OutBlock block) override {
    // The result goes out from the buffer it was computed in; the buffer
    // returns to its pool when gRPC has sent it.
    block_write_ = wire::EncodeStreamBlock(block.first_line,
                                           ToSlice(std::move(block.buffer), block.bytes));
    reactor_->StartWrite(&block_write_);
  }

  void Finish(const absl::Status& status) override {
    finished_at_ns_ = absl::ToUnixNanos(absl::Now());
    finished_ = true;
    if (!status.ok()) {
      reactor_->Finish(ToGrpcStatus(status, context_));
      return;
    }
    v1::MultiplyStreamResponse stats;
    *stats.mutable_stats() = compute_ != nullptr ? compute_->job().stats() : echo_stage_->stats();
    control_write_ = wire::EncodeMessage(stats);
    reactor_->StartWriteAndFinish(&control_write_, grpc::WriteOptions(), grpc::Status::OK);
  }

 private:
  enum class Phase { kHeader, kAdmission, kAccepting, kBlocks };

  // How long a failed pipeline may wait for its write in flight before the
  // call is cancelled (the client is not reading).
  static constexpr absl::Duration kStuckWriteGrace = absl::Seconds(2);

  // Cancels the call at the transport (RST_STREAM): a write that the client
  // never takes then fails, and the call ends. Callers hold no lock:
  // TryCancel may run OnCancel inline, which takes mu_ and the pipeline's
  // lock. cancel_mu_ is taken by OnDone too, so the context is never used
  // after gRPC is done with it.
  void CancelCall() {
    std::lock_guard lock(cancel_mu_);
    if (!cancel_done_) context_->TryCancel();
  }

  // Ends the call with `s` before the pipeline runs, or hands `s` to it.
  void Fail(const absl::Status& s) {
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

  // Before the blocks: counts nothing (the engine counts), cancels a queued
  // admission, and finishes unless the acceptance is being written (then it
  // is passed to the pipeline when that write is done).
  void FailLocked(const absl::Status& s) {
    if (finished_ || done_) return;
    if (phase_ == Phase::kAccepting) {
      if (!pending_error_.has_value()) pending_error_ = s;
      return;
    }
    if (phase_ == Phase::kAdmission && ticket_.has_value()) engine_->Cancel(*ticket_, s);
    finished_at_ns_ = absl::ToUnixNanos(absl::Now());
    finished_ = true;
    reactor_->Finish(ToGrpcStatus(s, context_));
  }

  void OnHeaderLocked(bool ok) {
    if (!ok) {
      FailLocked(context_->IsCancelled()
                     ? CancelledStatus(deadline_)
                     : absl::InvalidArgumentError(
                           "stream closed before its header; send a JobHeader first"));
      return;
    }
    absl::StatusOr<wire::StreamRequest> request = wire::DecodeStreamRequest(
        &request_, [](int64_t, size_t) -> absl::StatusOr<void*> {
          return absl::InvalidArgumentError(
              "the first message of MultiplyStream must be a header, got a block");
        });
    request_.Clear();
    if (!request.ok()) {
      FailLocked(request.status());
      return;
    }
    auto job = ValidateHeader(request->header, engine_->options().limits, /*streamed=*/true);
    if (!job.ok()) {
      if (!echo_) engine_->RecordRejected(job.status());
      FailLocked(job.status());
      return;
    }
    problem_ = job->problem;
    if (echo_) {
      echo_stage_ = std::make_shared<EchoStage>();
      AcceptLocked(echo_stage_, &engine_->host_block_buffers(), 0);
      return;
    }
    phase_ = Phase::kAdmission;
    auto ticket = engine_->Start(
        *job, JobMode::kStreamed, arrived_, deadline_,
        [self = shared_from_this()](absl::StatusOr<std::unique_ptr<ActiveJob>> admitted) {
          self->OnAdmitted(std::move(admitted));
        },
        client_);
    if (!ticket.ok()) {
      FailLocked(ticket.status());
      return;
    }
    ticket_ = *ticket;
  }

  void OnAdmitted(absl::StatusOr<std::unique_ptr<ActiveJob>> admitted) {
    std::lock_guard lock(mu_);
    if (!admitted.ok()) {
      FailLocked(admitted.status());
      return;
    }
    auto stage = std::make_shared<ComputeStage>(
        std::move(*admitted), [d = deadline_] { return CancelledStatus(d); });
    if (finished_ || done_) {
      stage->End(CancelledStatus(deadline_), 0, 0);  // its reservation goes back with it
      return;
    }
    compute_ = stage;
    AcceptLocked(stage, &compute_->job().block_buffers(), compute_->job().stats().job_id());
  }

  // Tells the client the job is admitted; the pipeline starts once that
  // message is out (OnWriteDone), so that it never has two writes in flight.
  void AcceptLocked(std::shared_ptr<BlockStage> stage, HostBufferPool* pool, uint64_t job_id) {
    BlockPipeline::Options options;
    options.max_block_bytes = engine_->options().limits.max_block_bytes;
    options.framing_slack = kBlockFramingSlack;
    Engine* engine = engine_;
    pipeline_ = std::make_shared<BlockPipeline>(
        problem_, options, pool, [engine](std::function<void()> fn) { engine->Post(std::move(fn)); },
        std::move(stage), this);
    phase_ = Phase::kAccepting;
    accepted_at_ = absl::Now();
    v1::MultiplyStreamResponse accepted;
    accepted.mutable_accepted()->set_job_id(job_id);
    accepted.mutable_accepted()->set_max_block_bytes(engine_->options().limits.max_block_bytes);
    accepted.mutable_accepted()->set_queue_wait_ns(
        absl::ToInt64Nanoseconds(accepted_at_ - arrived_));
    control_write_ = wire::EncodeMessage(accepted);
    reactor_->StartWrite(&control_write_);
  }

  Engine* const engine_;
  const StreamTimeouts timeouts_;
  StreamWatchdog* const watchdog_;  // null for echo
  grpc::CallbackServerContext* const context_;
  const bool echo_;
  const absl::Time arrived_;
  const absl::Time deadline_;
  const std::string client_;

  std::mutex mu_;
  StreamReactorBase* reactor_;  // null after OnDone
  Phase phase_ = Phase::kHeader;
  grpc::ByteBuffer request_;        // owned by the one read in flight
  grpc::ByteBuffer control_write_;  // the acceptance, then the stats
  grpc::ByteBuffer block_write_;    // owned by the one block write in flight
  Problem problem_;
  std::optional<Admission::Ticket> ticket_;
  std::shared_ptr<ComputeStage> compute_;  // null for echo
  std::shared_ptr<EchoStage> echo_stage_;  // echo only
  std::shared_ptr<BlockPipeline> pipeline_;
  absl::Time accepted_at_;
  std::optional<absl::Status> pending_error_;  // a failure while the acceptance was written
  std::atomic<bool> finished_{false};
  std::atomic<int64_t> finished_at_ns_{0};  // when Finish was handed to gRPC
  bool done_ = false;
  std::mutex cancel_mu_;  // guards cancel_done_ (see CancelCall)
  bool cancel_done_ = false;
};

class StreamReactor final : public StreamReactorBase {
 public:
  StreamReactor(Engine* engine, grpc::CallbackServerContext* context, bool echo,
                StreamWatchdog* watchdog, StreamTimeouts timeouts, std::atomic<int64_t>* calls,
                std::string client)
      : count_(calls),
        call_(std::make_shared<StreamCall>(engine, context, this, echo, watchdog, timeouts,
                                           std::move(client))) {
    call_->Begin();
  }
  void OnReadDone(bool ok) override { call_->OnReadDone(ok); }
  void OnWriteDone(bool ok) override { call_->OnWriteDone(ok); }
  void OnCancel() override { call_->OnCancel(); }
  void OnDone() override {
    call_->OnDone();
    delete this;
  }

 private:
  CallCount count_;
  std::shared_ptr<StreamCall> call_;
};

// Ends a stream at once with `status` (authentication failures).
class RefusedStream final : public StreamReactorBase {
 public:
  RefusedStream(const grpc::Status& status, std::atomic<int64_t>* calls) : count_(calls) {
    Finish(status);
  }
  void OnDone() override { delete this; }

 private:
  CallCount count_;
};

// Ends a unary call at once with `status`.
class RefusedUnary final : public grpc::ServerUnaryReactor {
 public:
  RefusedUnary(const grpc::Status& status, std::atomic<int64_t>* calls) : count_(calls) {
    Finish(status);
  }
  void OnDone() override { delete this; }

 private:
  CallCount count_;
};

}  // namespace

StreamWatchdog::StreamWatchdog() : thread_([this] { Loop(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StreamWatchdog::Watch(std::weak_ptr<Watched> stream) {
  std::lock_guard lock(mu_);
  streams_.push_back(std::move(stream));
}

void StreamWatchdog::Loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(250));
    std::vector<std::shared_ptr<Watched>> live;
    std::erase_if(streams_, [&](const std::weak_ptr<Watched>& w) {
      auto s = w.lock();
      if (s == nullptr) return true;
      live.push_back(std::move(s));
      return false;
    });
    lock.unlock();
    const absl::Time now = absl::Now();
    for (auto& s : live) s->CheckIdle(now);
    live.clear();  // drop the last references outside the lock
    lock.lock();
  }
}

absl::StatusOr<int> DgmmService::Authenticate(const grpc::CallbackServerContext* context) const {
  if (!auth_.has_value()) return 0;
  return auth_->Match(context->client_metadata());
}

StreamReactorBase* DgmmService::NewMultiply(grpc::CallbackServerContext* context) {
  absl::StatusOr<int> token = Authenticate(context);
  if (!token.ok()) return new RefusedStream(ToGrpcStatus(token.status(), context), &calls_);
  return new UnaryReactor(engine_, &gate_, context, &watchdog_, timeouts_, &calls_,
                          ClientKey(context, *token));
}

StreamReactorBase* DgmmGenericService::CreateReactor(grpc::GenericCallbackServerContext* context) {
  if (context->method() == kMultiplyMethod) return service_->NewMultiply(context);
  return new RefusedStream(
      grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                   absl::StrCat("unknown method ", context->method())),
      &unknown_calls_);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DgmmService::MultiplyStream(
    grpc::CallbackServerContext* context) {
  absl::StatusOr<int> token = Authenticate(context);
  if (!token.ok()) return new RefusedStream(ToGrpcStatus(token.status(), context), &calls_);
  return new StreamReactor(engine_, context, /*echo=*/false, &watchdog_, timeouts_, &calls_,
                           ClientKey(context, *token));
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewEchoStreamReactor(
    Engine* engine, grpc::CallbackServerContext* context, const std::optional<TokenAuth>& auth,
    std::atomic<int64_t>* calls) {
  if (auth.has_value()) {
    if (absl::Status s = auth->Check(context->client_metadata()); !s.ok()) {
      return new RefusedStream(ToGrpcStatus(s, context), calls);
    }
  }
  // No watchdog: the benchmark's streams are not timed out.
  return new StreamReactor(engine, context, /*echo=*/true, /*watchdog=*/nullptr, StreamTimeouts{},
                           calls, "");
}

// Served at the ByteBuffer level so that a request that does not parse gets
// INVALID_ARGUMENT like the other RPCs (gRPC's generated parsing would answer
// UNIMPLEMENTED with an empty message).
grpc::ServerUnaryReactor* DgmmService::GetServerInfo(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  absl::StatusOr<int> token = Authenticate(context);
  if (!token.ok()) return new RefusedUnary(ToGrpcStatus(token.status(), context), &calls_);
  v1::GetServerInfoRequest parsed;
  if (!wire::ParseMessage(*request, &parsed)) {
    return new RefusedUnary(
        ToGrpcStatus(absl::InvalidArgumentError(
                         "GetServerInfo request does not parse as a dgmm.v1.GetServerInfoRequest"),
                     context),
        &calls_);
  }
  v1::GetServerInfoResponse info = engine_->Info();
  if (regions_ != nullptr && regions_->enabled()) {
    v1::Limits* l = info.mutable_limits();
    l->set_regions_enabled(true);
    l->set_region_budget_bytes(regions_->options().budget_bytes);
    l->set_max_regions_per_client(regions_->options().max_per_client);
    l->set_region_idle_timeout_s(absl::ToInt64Seconds(regions_->options().idle_timeout));
  }
  *response = wire::EncodeMessage(info);
  return new RefusedUnary(grpc::Status::OK, &calls_);
}

grpc::ServerUnaryReactor* DgmmService::RegisterRegion(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  absl::StatusOr<int> token = Authenticate(context);
  if (!token.ok()) return new RefusedUnary(ToGrpcStatus(token.status(), context), &calls_);
  const absl::Status served = ServeRegionCall(RegionMethod::kRegister, regions_,
                                              ClientKey(context, *token), request, response);
  return new RefusedUnary(ToGrpcStatus(served, context), &calls_);
}

grpc::ServerUnaryReactor* DgmmService::UnregisterRegion(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  absl::StatusOr<int> token = Authenticate(context);
  if (!token.ok()) return new RefusedUnary(ToGrpcStatus(token.status(), context), &calls_);
  const absl::Status served = ServeRegionCall(RegionMethod::kUnregister, regions_,
                                              ClientKey(context, *token), request, response);
  return new RefusedUnary(ToGrpcStatus(served, context), &calls_);
}

grpc::ServerUnaryReactor* DgmmService::GetRegionStatus(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  absl::StatusOr<int> token = Authenticate(context);
  if (!token.ok()) return new RefusedUnary(ToGrpcStatus(token.status(), context), &calls_);
  const absl::Status served = ServeRegionCall(RegionMethod::kStatus, regions_,
                                              ClientKey(context, *token), request, response);
  return new RefusedUnary(ToGrpcStatus(served, context), &calls_);
}

grpc::ServerUnaryReactor* DgmmService::MultiplyRegion(grpc::CallbackServerContext* context,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  absl::StatusOr<int> token = Authenticate(context);
  if (!token.ok()) return new RefusedUnary(ToGrpcStatus(token.status(), context), &calls_);
  return ServeMultiplyRegion(engine_, regions_, context, ClientKey(context, *token),
                             DeadlineOf(context), request, response, &calls_);
}

}  // namespace dgmm
