#include "service/handlers.h"

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "proto/wire.h"
#include "service/host_buffers.h"
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

absl::Status CancelledStatus(absl::Time deadline) {
  if (absl::Now() + kDeadlineMargin >= deadline) {
    return absl::DeadlineExceededError("the client's deadline expired while the job ran");
  }
  return absl::CancelledError("the client cancelled the call");
}

// ---------------------------------------------------------------- Multiply

// State shared by the reactor and the job's worker; outlives both. Multiply
// is served at the ByteBuffer level like MultiplyStream: the header is read
// first without touching the matrix, and once the job is admitted the matrix
// is copied once out of gRPC's buffers into a block buffer of the job's device
// (pinned for a GPU), computed in place, and sent back as a slice that owns
// the buffer.
struct UnaryCall {
  Engine* engine;
  grpc::CallbackServerContext* context;
  const grpc::ByteBuffer* request;
  grpc::ByteBuffer* response;
  absl::Time deadline;
  std::atomic<bool> cancelled{false};
  std::mutex mu;
  grpc::ServerUnaryReactor* reactor;  // null once finished
  std::optional<Admission::Ticket> ticket;
  std::unique_ptr<ActiveJob> job;  // released in OnDone, after the reply is sent
  int64_t lines = 0;
  size_t matrix_bytes = 0;

  void Finish(const absl::Status& s) {
    std::lock_guard lock(mu);
    if (reactor == nullptr) return;
    grpc::ServerUnaryReactor* r = reactor;
    reactor = nullptr;
    r->Finish(ToGrpcStatus(s, context));
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
      s = wire::CopyMultiplyMatrix(*request, buffer->data(), matrix_bytes);
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
      *response = wire::EncodeMultiplyResponse(ToSlice(std::move(*buffer), matrix_bytes),
                                               active->stats());
    }
    {
      std::lock_guard lock(mu);
      job = std::move(active);
    }
    Finish(s);
  }
};

class UnaryReactor final : public grpc::ServerUnaryReactor {
 public:
  UnaryReactor(Engine* engine, grpc::CallbackServerContext* context,
               const grpc::ByteBuffer* request, grpc::ByteBuffer* response)
      : call_(std::make_shared<UnaryCall>()) {
    const absl::Time arrived = absl::Now();
    call_->engine = engine;
    call_->context = context;
    call_->request = request;
    call_->response = response;
    call_->deadline = DeadlineOf(context);
    call_->reactor = this;
    // The transport admits messages up to the larger of this limit and a
    // stream block; hold unary requests to their own limit here.
    const int64_t size = static_cast<int64_t>(request->Length());
    if (size > engine->options().max_unary_message_bytes) {
      absl::Status too_big = absl::ResourceExhaustedError(absl::StrCat(
          "Multiply request of ", size, " bytes exceeds this server's max unary message of ",
          engine->options().max_unary_message_bytes,
          " bytes (--max_unary_message_bytes); send it with MultiplyStream"));
      engine->RecordRejected(too_big);
      call_->Finish(too_big);
      return;
    }
    absl::StatusOr<wire::MultiplyRequestView> view = wire::PeekMultiplyRequest(*request);
    absl::StatusOr<JobRequest> job =
        view.ok() ? ValidateHeader(view->header, engine->options().limits, /*streamed=*/false)
                  : view.status();
    absl::Status valid =
        job.ok() ? ValidateMatrixPayload(job->problem, view->matrix_bytes) : job.status();
    if (!valid.ok()) {
      engine->RecordRejected(valid);
      call_->Finish(valid);
      return;
    }
    call_->lines = job->problem.lines();
    call_->matrix_bytes = view->matrix_bytes;
    std::lock_guard lock(call_->mu);  // OnCancel must see the ticket
    auto ticket = engine->Start(
        *job, JobMode::kWhole, arrived, call_->deadline,
        [call = call_](absl::StatusOr<std::unique_ptr<ActiveJob>> admitted) {
          call->Run(std::move(admitted));
        });
    if (!ticket.ok()) {
      grpc::ServerUnaryReactor* r = call_->reactor;
      call_->reactor = nullptr;
      r->Finish(ToGrpcStatus(ticket.status(), context));
      return;
    }
    call_->ticket = *ticket;
  }

  void OnCancel() override {
    call_->cancelled = true;
    std::optional<Admission::Ticket> ticket;
    {
      std::lock_guard lock(call_->mu);
      ticket = call_->ticket;
    }
    if (ticket) call_->engine->Cancel(*ticket, CancelledStatus(call_->deadline));
  }

  void OnDone() override {
    {
      std::lock_guard lock(call_->mu);
      call_->job.reset();
    }
    delete this;
  }

 private:
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
             bool echo, StreamWatchdog* watchdog)
      : engine_(engine),
        watchdog_(watchdog),
        context_(context),
        reactor_(reactor),
        echo_(echo),
        arrived_(absl::Now()),
        deadline_(DeadlineOf(context)) {}

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
        });
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
      FailLocked(absl::InvalidArgumentError(absl::StrCat(
          "message of ", size, " bytes exceeds max_block_bytes ",
          engine_->options().limits.max_block_bytes, " plus ", kBlockFramingSlack,
          " bytes for its fields")));
      return;
    }
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
  std::atomic<bool> cancelled_{false};
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
                StreamWatchdog* watchdog)
      : call_(std::make_shared<StreamCall>(engine, context, this, echo, watchdog)) {
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
  std::shared_ptr<StreamCall> call_;
};

// Ends a stream at once with `status` (authentication failures).
class RefusedStream final : public StreamReactorBase {
 public:
  explicit RefusedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

grpc::ServerUnaryReactor* Refuse(grpc::CallbackServerContext* context, const absl::Status& s) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(s, context));
  return reactor;
}

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

absl::Status DgmmService::Authenticate(const grpc::CallbackServerContext* context) const {
  if (!auth_.has_value()) return absl::OkStatus();
  return auth_->Check(context->client_metadata());
}

grpc::ServerUnaryReactor* DgmmService::Multiply(grpc::CallbackServerContext* context,
                                                const grpc::ByteBuffer* request,
                                                grpc::ByteBuffer* response) {
  if (absl::Status s = Authenticate(context); !s.ok()) return Refuse(context, s);
  return new UnaryReactor(engine_, context, request, response);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* DgmmService::MultiplyStream(
    grpc::CallbackServerContext* context) {
  if (absl::Status s = Authenticate(context); !s.ok()) {
    return new RefusedStream(ToGrpcStatus(s, context));
  }
  return new StreamReactor(engine_, context, /*echo=*/false, &watchdog_);
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* NewEchoStreamReactor(Engine* engine, grpc::CallbackServerContext* context,
                     const std::optional<TokenAuth>& auth) {
  if (auth.has_value()) {
    if (absl::Status s = auth->Check(context->client_metadata()); !s.ok()) {
      return new RefusedStream(ToGrpcStatus(s, context));
    }
  }
  return new StreamReactor(engine, context, /*echo=*/true, /*watchdog=*/nullptr);
}

grpc::ServerUnaryReactor* DgmmService::GetServerInfo(grpc::CallbackServerContext* context,
                                                     const v1::GetServerInfoRequest* request,
                                                     v1::GetServerInfoResponse* response) {
  if (absl::Status s = Authenticate(context); !s.ok()) return Refuse(context, s);
  *response = engine_->Info();
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace dgmm
