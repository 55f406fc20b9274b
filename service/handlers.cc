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
#include "service/receive_gate.h"
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
struct UnaryCall : std::enable_shared_from_this<UnaryCall> {
  Engine* engine = nullptr;
  ReceiveGate* gate = nullptr;
  grpc::CallbackServerContext* context = nullptr;
  absl::Time arrived;
  absl::Time deadline;
  std::string client;
  std::atomic<bool> cancelled{false};

  std::mutex mu;
  StreamReactorBase* reactor = nullptr;  // null once finished
  grpc::ByteBuffer request;
  grpc::ByteBuffer response;
  std::optional<ReceiveGate::Ticket> gate_ticket;  // while waiting at the gate
  int64_t gate_hold = 0;                           // bytes held in the gate
  std::optional<Admission::Ticket> ticket;         // while waiting for admission
  std::unique_ptr<ActiveJob> job;  // released in OnDone, after the reply is sent
  int64_t lines = 0;
  size_t matrix_bytes = 0;

  // Ends the call with `s` (once); an OK status sends `response` first.
  void Finish(const absl::Status& s) {
    std::lock_guard lock(mu);
    if (reactor == nullptr) return;
    StreamReactorBase* r = reactor;
    reactor = nullptr;
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
      gate_hold = engine->options().max_unary_message_bytes;
      if (!cancelled) r = reactor;
    }
    if (r == nullptr) {
      // Finished or cancelled meanwhile: end it (once) and give the room back.
      ReleaseGate();
      Finish(CancelledStatus(deadline));
      return;
    }
    // Outside mu: a reaction may run inline. Nothing else finishes the call
    // while its read is not started, so the reactor is still there.
    r->StartRead(&request);
  }

  // The message is in (or the call ended without one).
  void OnMessage(bool ok) {
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
    if (size > o.max_unary_message_bytes) {
      Refuse(WithOutcome(
          absl::ResourceExhaustedError(absl::StrCat(
              "Multiply request of ", size, " bytes exceeds this server's max unary message of ",
              o.max_unary_message_bytes,
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
    std::lock_guard lock(mu);  // OnCancel must see the ticket
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
  }

  // Runs on a job worker once admitted.
  void Run(absl::StatusOr<std::unique_ptr<ActiveJob>> admitted) {
    if (!admitted.ok()) {
      Finish(admitted.status());
      return;
    }
    std::unique_ptr<ActiveJob> active = std::move(*admitted);
    absl::Status s;
    absl::StatusOr<HostBuffer> buffer =
        active->block_buffers().Take(static_cast<int64_t>(matrix_bytes));
    if (!buffer.ok()) {
      s = buffer.status();
    } else {
      s = wire::CopyMultiplyMatrix(request, buffer->data(), matrix_bytes);
    }
    if (s.ok()) {
      const Tile tile{buffer->data(), buffer->data(), 0, lines};
      s = active->Process(tile, [this] { return cancelled.load(); });
      if (s.code() == absl::StatusCode::kCancelled) s = CancelledStatus(deadline);
    }
    active->stats().set_bytes_in(static_cast<int64_t>(matrix_bytes));
    active->stats().set_bytes_out(s.ok() ? static_cast<int64_t>(matrix_bytes) : 0);
    active->End(s);
    if (s.ok()) {
      response = wire::EncodeMultiplyResponse(ToSlice(std::move(*buffer), matrix_bytes),
                                              active->stats());
    }
    {
      std::lock_guard lock(mu);
      job = std::move(active);
    }
    Finish(s);
  }
};

class UnaryReactor final : public StreamReactorBase {
 public:
  UnaryReactor(Engine* engine, ReceiveGate* gate, grpc::CallbackServerContext* context,
               std::atomic<int64_t>* calls, std::string client)
      : count_(calls), call_(std::make_shared<UnaryCall>()) {
    UnaryCall& c = *call_;
    c.engine = engine;
    c.gate = gate;
    c.context = context;
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
      auto acquired = gate->Acquire(c.client, engine->options().max_unary_message_bytes,
                                    [call = call_](absl::Status s) { call->OnGate(s); });
      if (!acquired.ok()) {
        engine->RecordRejected(acquired.status());
        StreamReactorBase* r = std::exchange(c.reactor, nullptr);
        r->Finish(ToGrpcStatus(acquired.status(), context));
        return;
      }
      if (acquired->granted) {
        c.gate_hold = engine->options().max_unary_message_bytes;
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
    call_->ReleaseGate();
    {
      std::lock_guard lock(call_->mu);
      call_->reactor = nullptr;
      call_->job.reset();
    }
    delete this;
  }

 private:
  CallCount count_;
  std::shared_ptr<UnaryCall> call_;
};

// ---------------------------------------------------------- MultiplyStream

// One block of lines on its way through the job: its message as received,
// then its payload in a block buffer, computed in place there and sent back
// from it.
struct PendingBlock {
  grpc::ByteBuffer message;
  int64_t first_line = 0;
  int64_t lines = 0;
  size_t bytes = 0;
  HostBuffer buffer;
};

// The state of one streamed job, shared by the reactor and the workers that
// compute its blocks. MultiplyStream is served at the ByteBuffer level
// (proto/wire.h): each block's payload is copied once, out of gRPC's receive
// slices into a block buffer of the job's device (pinned for a GPU), computed
// there in place and sent back as a slice that owns the buffer, so protobuf
// never copies a payload. Every field is guarded by mu, except that the one
// read in flight owns request_ and the one block being computed owns the
// assembler. At most
// kStreamWindowBlocks blocks are between read and written at any time, one
// read and one write are in flight, and blocks are computed one at a time in
// order: receive of block k+1, compute of block k and send of block k-1
// overlap.
class StreamCall : public StreamWatchdog::Watched,
                   public std::enable_shared_from_this<StreamCall> {
 public:
  // With `echo`, admission and compute are left out and each block goes back
  // as it came (the streaming benchmark's Echo service); everything else, the
  // protocol checks and the pipeline, is the same.
  StreamCall(Engine* engine, grpc::CallbackServerContext* context, StreamReactorBase* reactor,
             bool echo, StreamWatchdog* watchdog, std::string client)
      : engine_(engine),
        watchdog_(watchdog),
        context_(context),
        reactor_(reactor),
        echo_(echo),
        arrived_(absl::Now()),
        deadline_(DeadlineOf(context)),
        client_(std::move(client)) {}

  void Begin() {
    {
      std::lock_guard lock(mu_);
      reading_ = true;
      reactor_->StartRead(&request_);
    }
    if (watchdog_ != nullptr) watchdog_->Watch(weak_from_this());
  }

  void CheckIdle(absl::Time now) override {
    std::lock_guard lock(mu_);
    if (finished_ || pending_error_.has_value()) return;
    const EngineOptions& o = engine_->options();
    if (phase_ == Phase::kHeader && now - arrived_ >= o.stream_header_timeout) {
      FailLocked(absl::DeadlineExceededError(
          absl::StrCat("no header within ", absl::FormatDuration(o.stream_header_timeout),
                       " of the stream's start (--stream_header_timeout_s)")));
    } else if (phase_ == Phase::kBlocks && blocks_received_ == 0 && !input_done_ &&
               now - accepted_at_ >= o.stream_first_block_timeout) {
      FailLocked(absl::DeadlineExceededError(absl::StrCat(
          "no block within ", absl::FormatDuration(o.stream_first_block_timeout),
          " of the job's acceptance (--stream_first_block_timeout_s); the job's memory is "
          "given back")));
    } else if (phase_ == Phase::kBlocks && !stats_sent_ &&
               now - last_progress_ >= o.stream_idle_timeout) {
      FailLocked(absl::DeadlineExceededError(absl::StrCat(
          "no block received and no result taken for ",
          absl::FormatDuration(o.stream_idle_timeout),
          " (--stream_idle_timeout_s); the job's memory is given back")));
    }
  }

  void OnReadDone(bool ok) {
    std::lock_guard lock(mu_);
    reading_ = false;
    if (finished_) return;
    switch (phase_) {
      case Phase::kHeader:
        OnHeaderLocked(ok);
        break;
      case Phase::kBlocks:
        if (!ok) {
          OnHalfCloseLocked();
          break;
        }
        OnBlockLocked();
        break;
      case Phase::kAdmission:
        break;  // no read is started while waiting for admission
    }
  }

  void OnWriteDone(bool ok) {
    std::lock_guard lock(mu_);
    writing_ = false;
    last_progress_ = absl::Now();
    if (writing_block_) window_--;
    in_flight_write_.Clear();
    if (pending_error_.has_value()) {
      FinishLocked(*pending_error_);
      return;
    }
    if (!ok) {
      FailLocked(CancelledStatus(deadline_));
      return;
    }
    if (stats_sent_ && write_queue_.empty()) {
      FinishLocked(absl::OkStatus());
      return;
    }
    PumpLocked();
  }

  void OnCancel() {
    std::lock_guard lock(mu_);
    FailLocked(CancelledStatus(deadline_));
  }

  void OnDone() {
    std::lock_guard lock(mu_);
    reactor_ = nullptr;
    finished_ = true;
  }

 private:
  enum class Phase { kHeader, kAdmission, kBlocks };

  void OnHeaderLocked(bool ok) {
    if (!ok && context_->IsCancelled()) {
      FailLocked(CancelledStatus(deadline_));
      return;
    }
    if (!ok) {
      FailLocked(absl::InvalidArgumentError(
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
    assembler_.emplace(problem_, engine_->options().limits.max_block_bytes);
    if (echo_) {
      AcceptLocked(0);
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
    job_ = std::move(*admitted);
    if (finished_) return;  // destroying job_ later returns its reservation
    AcceptLocked(job_->stats().job_id());
  }

  // Tells the client the job is admitted and starts reading blocks.
  void AcceptLocked(uint64_t job_id) {
    phase_ = Phase::kBlocks;
    last_progress_ = absl::Now();
    accepted_at_ = last_progress_;
    v1::MultiplyStreamResponse accepted;
    accepted.mutable_accepted()->set_job_id(job_id);
    accepted.mutable_accepted()->set_max_block_bytes(engine_->options().limits.max_block_bytes);
    accepted.mutable_accepted()->set_queue_wait_ns(
        absl::ToInt64Nanoseconds(absl::Now() - arrived_));
    write_queue_.push_back({wire::EncodeMessage(accepted), false});
    PumpLocked();
  }

  // The client half-closed (or the call was cancelled under the read). That
  // every line came is checked once the blocks read so far are decoded.
  void OnHalfCloseLocked() {
    if (context_->IsCancelled()) {
      FailLocked(CancelledStatus(deadline_));
      return;
    }
    input_done_ = true;
    PumpLocked();
  }

  // A message arrived: it is queued as it came, in gRPC's buffers, and this
  // gRPC thread goes straight back to the transport. The job's worker decodes
  // it and copies the payload out (ReceiveBlock), blocks in order.
  void OnBlockLocked() {
    // The transport admits messages up to the unary limit; a block message
    // is held to its own limit here, before it is queued, so a stream holds
    // at most its window of block-sized messages.
    const size_t limit = static_cast<size_t>(engine_->options().limits.max_block_bytes) +
                         kBlockFramingSlack;
    if (request_.Length() > limit) {
      const size_t size = request_.Length();
      request_.Clear();
      absl::Status too_big = WithOutcome(
          absl::InvalidArgumentError(absl::StrCat(
              "message of ", size, " bytes exceeds max_block_bytes ",
              engine_->options().limits.max_block_bytes, " plus ", kBlockFramingSlack,
              " bytes for its fields")),
          Outcome::kMessageTooLarge);
      FailLocked(too_big);
      return;
    }
    blocks_received_++;
    PendingBlock block;
    block.message.Swap(&request_);
    last_progress_ = absl::Now();
    compute_queue_.push_back(std::move(block));
    window_++;
    PumpLocked();
  }

  // Decodes a block's message on the job's worker: the payload goes into a
  // new block buffer (sized and checked before a byte is copied); anything
  // other than the next block is an error. Runs for one block at a time, in
  // order, so it alone uses the assembler.
  absl::Status ReceiveBlock(PendingBlock* block) {
    HostBufferPool& pool =
        job_ != nullptr ? job_->block_buffers() : engine_->host_block_buffers();
    absl::StatusOr<wire::StreamRequest> request = wire::DecodeStreamRequest(
        &block->message, [&](int64_t, size_t size) -> absl::StatusOr<void*> {
          if (absl::Status s = assembler_->CheckSize(size); !s.ok()) return s;
          if (size == 0) return nullptr;  // Accept turns it down below
          absl::StatusOr<HostBuffer> buffer = pool.Take(static_cast<int64_t>(size));
          if (!buffer.ok()) return buffer.status();
          block->buffer = std::move(*buffer);
          return block->buffer.data();
        });
    block->message.Clear();  // gRPC's buffers go back now
    if (!request.ok()) return request.status();
    if (request->kind == wire::StreamRequest::Kind::kHeader) {
      return absl::InvalidArgumentError(
          "a second header arrived; MultiplyStream takes exactly one header, then blocks");
    }
    absl::StatusOr<int64_t> lines = assembler_->Accept(request->first_line, request->size);
    if (!lines.ok()) return lines.status();
    block->first_line = request->first_line;
    block->lines = *lines;
    block->bytes = request->size;
    return absl::OkStatus();
  }

  // Starts whatever can start: the next read, the next compute, the next
  // write, or the final stats.
  void PumpLocked() {
    if (finished_ || pending_error_.has_value() || phase_ != Phase::kBlocks) return;
    if (!reading_ && !input_done_ && window_ < kStreamWindowBlocks) {
      reading_ = true;
      reactor_->StartRead(&request_);
    }
    if (!computing_ && !compute_queue_.empty()) StartComputeLocked();
    if (!writing_ && !write_queue_.empty()) StartWriteLocked();
    if (input_done_ && !computing_ && compute_queue_.empty() && !writing_ &&
        write_queue_.empty() && !stats_sent_) {
      if (absl::Status s = assembler_->Finish(); !s.ok()) {
        FailLocked(s);
        return;
      }
      v1::MultiplyStreamResponse stats;
      v1::JobStats* out = stats.mutable_stats();
      if (job_ != nullptr) {
        job_->stats().set_bytes_in(bytes_in_);
        job_->stats().set_bytes_out(bytes_out_);
        job_->End(absl::OkStatus());
        *out = job_->stats();
      } else {  // echo
        out->set_device("echo");
        out->set_device_index(-1);
        out->set_bytes_in(bytes_in_);
        out->set_bytes_out(bytes_out_);
        out->set_total_ns(absl::ToInt64Nanoseconds(absl::Now() - arrived_));
      }
      stats_sent_ = true;
      write_queue_.push_back({wire::EncodeMessage(stats), false});
      StartWriteLocked();
    }
  }

  void StartComputeLocked() {
    computing_ = true;
    auto block = std::make_shared<PendingBlock>(std::move(compute_queue_.front()));
    compute_queue_.pop_front();
    ActiveJob* job = job_.get();  // lives as long as this StreamCall; null for echo
    engine_->Post([self = shared_from_this(), job, block] {
      absl::Status s = self->ReceiveBlock(block.get());
      if (s.ok() && job != nullptr) {
        std::byte* data = block->buffer.data();
        s = job->Process(Tile{data, data, block->first_line, block->lines},
                         [self] { return self->cancelled_.load(); });
        if (s.code() == absl::StatusCode::kCancelled) s = CancelledStatus(self->deadline_);
      }
      std::lock_guard lock(self->mu_);
      self->computing_ = false;
      if (!s.ok()) {
        self->FailLocked(s);
        return;
      }
      self->bytes_in_ += static_cast<int64_t>(block->bytes);
      self->bytes_out_ += static_cast<int64_t>(block->bytes);
      // The result goes out from the buffer it was computed in; the buffer
      // returns to its pool when gRPC has sent it.
      self->write_queue_.push_back(
          {wire::EncodeStreamBlock(block->first_line,
                                   ToSlice(std::move(block->buffer), block->bytes)),
           true});
      self->PumpLocked();
    });
  }

  void StartWriteLocked() {
    writing_ = true;
    in_flight_write_ = std::move(write_queue_.front().first);
    writing_block_ = write_queue_.front().second;
    write_queue_.pop_front();
    reactor_->StartWrite(&in_flight_write_);
  }

  // Ends the call with `s` (once): counts the outcome, wakes a queued
  // admission, and finishes now or after the write in flight.
  void FailLocked(const absl::Status& s) {
    if (finished_ || pending_error_.has_value()) return;
    cancelled_ = true;
    if (phase_ == Phase::kAdmission && ticket_.has_value()) engine_->Cancel(*ticket_, s);
    if (job_ != nullptr) job_->End(s);
    compute_queue_.clear();
    write_queue_.clear();
    if (writing_) {
      pending_error_ = s;
    } else {
      FinishLocked(s);
    }
  }

  void FinishLocked(const absl::Status& s) {
    if (finished_) return;
    finished_ = true;
    cancelled_ = true;
    if (reactor_ != nullptr) reactor_->Finish(ToGrpcStatus(s, context_));
  }

  Engine* const engine_;
  StreamWatchdog* const watchdog_;  // null for echo
  grpc::CallbackServerContext* const context_;
  std::mutex mu_;
  StreamReactorBase* reactor_;
  const bool echo_;
  const absl::Time arrived_;
  const absl::Time deadline_;
  const std::string client_;
  std::atomic<bool> cancelled_{false};
  absl::Time accepted_at_;
  int64_t blocks_received_ = 0;
  absl::Time last_progress_;  // last block received or result written

  Phase phase_ = Phase::kHeader;
  grpc::ByteBuffer request_;
  Problem problem_;
  std::optional<StreamAssembler> assembler_;
  std::optional<Admission::Ticket> ticket_;
  std::unique_ptr<ActiveJob> job_;

  std::deque<PendingBlock> compute_queue_;
  std::deque<std::pair<grpc::ByteBuffer, bool>> write_queue_;  // (message, is a block)
  grpc::ByteBuffer in_flight_write_;
  bool writing_block_ = false;
  bool reading_ = false;
  bool computing_ = false;
  bool writing_ = false;
  bool input_done_ = false;
  bool stats_sent_ = false;
  bool finished_ = false;
  std::optional<absl::Status> pending_error_;
  int window_ = 0;  // blocks read and not yet written back
  int64_t bytes_in_ = 0;
  int64_t bytes_out_ = 0;
};

class StreamReactor final : public StreamReactorBase {
 public:
  StreamReactor(Engine* engine, grpc::CallbackServerContext* context, bool echo,
                StreamWatchdog* watchdog, std::atomic<int64_t>* calls, std::string client)
      : count_(calls),
        call_(std::make_shared<StreamCall>(engine, context, this, echo, watchdog,
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
  return new UnaryReactor(engine_, &gate_, context, &calls_, ClientKey(context, *token));
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
  return new StreamReactor(engine_, context, /*echo=*/false, &watchdog_, &calls_,
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
  return new StreamReactor(engine, context, /*echo=*/true, /*watchdog=*/nullptr, calls, "");
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
  *response = wire::EncodeMessage(engine_->Info());
  return new RefusedUnary(grpc::Status::OK, &calls_);
}

}  // namespace dgmm
