#include "service/echo_service.h"

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "service/device.h"
#include "service/status_map.h"

namespace dgmm {
namespace {

using EchoReactorBase =
    grpc::ServerBidiReactor<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>;

// One Echo call: the MultiplyStream reactor's flow (service/handlers.cc)
// minus admission and compute. A block read is queued, handed to an engine
// worker in order, one at a time (where a job computes it; here nothing is
// done to it), and its bytes are moved into a response and written from the
// worker, as a computed block is. Reading stops while kStreamWindowBlocks
// blocks are held. Shared by the reactor and the worker tasks; every field
// is guarded by mu_.
class EchoCall : public std::enable_shared_from_this<EchoCall> {
 public:
  EchoCall(Engine* engine, grpc::CallbackServerContext* context, EchoReactorBase* reactor)
      : engine_(engine), context_(context), reactor_(reactor), arrived_(absl::Now()) {}

  void Begin() {
    std::lock_guard lock(mu_);
    reading_ = true;
    reactor_->StartRead(&request_);
  }

  void OnReadDone(bool ok) {
    std::lock_guard lock(mu_);
    reading_ = false;
    if (finished_ || pending_error_.has_value()) return;
    if (!assembler_.has_value()) {
      OnHeaderLocked(ok);
    } else {
      OnBlockLocked(ok);
    }
  }

  void OnWriteDone(bool ok) {
    std::lock_guard lock(mu_);
    writing_ = false;
    if (writing_block_) window_--;
    in_flight_.reset();
    if (pending_error_.has_value()) {
      FinishLocked(*pending_error_);
      return;
    }
    if (!ok) {
      FailLocked(absl::CancelledError("the client went away during a write"));
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
    FailLocked(absl::CancelledError("the client cancelled the call"));
  }

  void OnDone() {
    std::lock_guard lock(mu_);
    reactor_ = nullptr;
    finished_ = true;
  }

 private:
  struct Block {
    int64_t first_line = 0;
    std::string data;
  };

  void OnHeaderLocked(bool ok) {
    if (!ok) {
      FailLocked(
          absl::InvalidArgumentError("stream closed before its header; send a JobHeader first"));
      return;
    }
    if (!request_.has_header()) {
      FailLocked(
          absl::InvalidArgumentError("the first message of Echo must be a header, got a block"));
      return;
    }
    const RequestLimits& limits = engine_->options().limits;
    auto job = ValidateHeader(request_.header(), limits, /*streamed=*/true);
    if (!job.ok()) {
      FailLocked(job.status());
      return;
    }
    assembler_.emplace(job->problem, limits.max_block_bytes);
    request_.Clear();
    auto accepted = std::make_unique<v1::MultiplyStreamResponse>();
    accepted->mutable_accepted()->set_max_block_bytes(limits.max_block_bytes);
    write_queue_.push_back({std::move(accepted), false});
    PumpLocked();
  }

  void OnBlockLocked(bool ok) {
    if (!ok) {  // half-close, or a cancelled call
      input_done_ = true;
      absl::Status s = assembler_->Finish();
      if (!s.ok()) {
        FailLocked(s);
        return;
      }
      PumpLocked();
      return;
    }
    if (!request_.has_block()) {
      FailLocked(absl::InvalidArgumentError(
          "after the header Echo takes only blocks, got another header or an empty message"));
      return;
    }
    v1::Block* block = request_.mutable_block();
    auto lines = assembler_->Accept(block->first_line(), block->data().size());
    if (!lines.ok()) {
      FailLocked(lines.status());
      return;
    }
    bytes_ += static_cast<int64_t>(block->data().size());
    forward_queue_.push_back(Block{block->first_line(), std::move(*block->mutable_data())});
    request_.Clear();
    window_++;
    PumpLocked();
  }

  // Starts whatever can start: the next read, the next hand-off to a
  // worker, the next write, or the final stats.
  void PumpLocked() {
    if (finished_ || pending_error_.has_value()) return;
    if (!reading_ && !input_done_ && window_ < kStreamWindowBlocks) {
      reading_ = true;
      reactor_->StartRead(&request_);
    }
    if (!forwarding_ && !forward_queue_.empty()) StartForwardLocked();
    if (input_done_ && !stats_sent_ && window_ == 0) {
      auto stats = std::make_unique<v1::MultiplyStreamResponse>();
      stats->mutable_stats()->set_device("echo");
      stats->mutable_stats()->set_device_index(-1);
      stats->mutable_stats()->set_bytes_in(bytes_);
      stats->mutable_stats()->set_bytes_out(bytes_);
      stats->mutable_stats()->set_total_ns(absl::ToInt64Nanoseconds(absl::Now() - arrived_));
      write_queue_.push_back({std::move(stats), false});
      stats_sent_ = true;
    }
    if (!writing_ && !write_queue_.empty()) {
      writing_ = true;
      in_flight_ = std::move(write_queue_.front().first);
      writing_block_ = write_queue_.front().second;
      write_queue_.pop_front();
      reactor_->StartWrite(in_flight_.get());
    }
  }

  void StartForwardLocked() {
    forwarding_ = true;
    auto block = std::make_shared<Block>(std::move(forward_queue_.front()));
    forward_queue_.pop_front();
    engine_->Post([self = shared_from_this(), block] {
      auto out = std::make_unique<v1::MultiplyStreamResponse>();
      out->mutable_block()->set_first_line(block->first_line);
      out->mutable_block()->set_data(std::move(block->data));
      std::lock_guard lock(self->mu_);
      self->forwarding_ = false;
      if (self->finished_ || self->pending_error_.has_value()) return;
      self->write_queue_.push_back({std::move(out), true});
      self->PumpLocked();
    });
  }

  // Ends the call with `s` once, after the write in flight if there is one.
  void FailLocked(const absl::Status& s) {
    if (finished_ || pending_error_.has_value()) return;
    forward_queue_.clear();
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
    if (reactor_ != nullptr) reactor_->Finish(ToGrpcStatus(s, context_));
  }

  Engine* const engine_;
  grpc::CallbackServerContext* const context_;
  std::mutex mu_;
  EchoReactorBase* reactor_;  // null once the call is done
  const absl::Time arrived_;
  v1::MultiplyStreamRequest request_;
  std::optional<StreamAssembler> assembler_;
  std::deque<Block> forward_queue_;
  std::deque<std::pair<std::unique_ptr<v1::MultiplyStreamResponse>, bool>> write_queue_;
  std::unique_ptr<v1::MultiplyStreamResponse> in_flight_;
  bool writing_block_ = false;
  bool reading_ = false;
  bool forwarding_ = false;
  bool writing_ = false;
  bool input_done_ = false;
  bool stats_sent_ = false;
  bool finished_ = false;
  std::optional<absl::Status> pending_error_;
  int window_ = 0;  // blocks read and not yet written back
  int64_t bytes_ = 0;
};

class EchoReactor final : public EchoReactorBase {
 public:
  EchoReactor(Engine* engine, grpc::CallbackServerContext* context)
      : call_(std::make_shared<EchoCall>(engine, context, this)) {
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
  std::shared_ptr<EchoCall> call_;
};

}  // namespace

grpc::ServerBidiReactor<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>* EchoService::Echo(
    grpc::CallbackServerContext* context) {
  return new EchoReactor(engine_, context);
}

}  // namespace dgmm
