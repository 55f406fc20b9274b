#include "service/echo_service.h"

#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/time/clock.h"
#include "service/device.h"
#include "service/status_map.h"

namespace dgmm {
namespace {

using EchoReactorBase =
    grpc::ServerBidiReactor<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>;

// One Echo call. Mirrors the MultiplyStream reactor's flow (service/handlers.cc)
// minus admission and compute: a block read is moved into a response and
// queued for writing; reading stops while kStreamWindowBlocks blocks are
// held. Every field is guarded by mu_.
class EchoReactor final : public EchoReactorBase {
 public:
  EchoReactor(grpc::CallbackServerContext* context, const RequestLimits& limits)
      : context_(context), limits_(limits), arrived_(absl::Now()) {
    std::lock_guard lock(mu_);
    reading_ = true;
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    std::lock_guard lock(mu_);
    reading_ = false;
    if (finished_ || pending_error_.has_value()) return;
    if (!assembler_.has_value()) {
      OnHeaderLocked(ok);
    } else {
      OnBlockLocked(ok);
    }
  }

  void OnWriteDone(bool ok) override {
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

  void OnCancel() override {
    std::lock_guard lock(mu_);
    FailLocked(absl::CancelledError("the client cancelled the call"));
  }

  void OnDone() override { delete this; }

 private:
  void OnHeaderLocked(bool ok) {
    if (!ok) {
      FailLocked(absl::InvalidArgumentError(
          "stream closed before its header; send a JobHeader first"));
      return;
    }
    if (!request_.has_header()) {
      FailLocked(absl::InvalidArgumentError(
          "the first message of Echo must be a header, got a block"));
      return;
    }
    auto job = ValidateHeader(request_.header(), limits_, /*streamed=*/true);
    if (!job.ok()) {
      FailLocked(job.status());
      return;
    }
    assembler_.emplace(job->problem, limits_.max_block_bytes);
    request_.Clear();
    auto accepted = std::make_unique<v1::MultiplyStreamResponse>();
    accepted->mutable_accepted()->set_max_block_bytes(limits_.max_block_bytes);
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
    auto out = std::make_unique<v1::MultiplyStreamResponse>();
    out->mutable_block()->set_first_line(block->first_line());
    out->mutable_block()->set_data(std::move(*block->mutable_data()));
    request_.Clear();
    write_queue_.push_back({std::move(out), true});
    window_++;
    PumpLocked();
  }

  // Starts the next read and the next write if they may start, and queues
  // the stats once every block has gone out.
  void PumpLocked() {
    if (finished_ || pending_error_.has_value()) return;
    if (!reading_ && !input_done_ && window_ < kStreamWindowBlocks) {
      reading_ = true;
      StartRead(&request_);
    }
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
      StartWrite(in_flight_.get());
    }
  }

  // Ends the call with `s` once, after the write in flight if there is one.
  void FailLocked(const absl::Status& s) {
    if (finished_ || pending_error_.has_value()) return;
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
    Finish(ToGrpcStatus(s, context_));
  }

  grpc::CallbackServerContext* const context_;
  const RequestLimits limits_;
  const absl::Time arrived_;
  std::mutex mu_;
  v1::MultiplyStreamRequest request_;
  std::optional<StreamAssembler> assembler_;
  std::deque<std::pair<std::unique_ptr<v1::MultiplyStreamResponse>, bool>> write_queue_;
  std::unique_ptr<v1::MultiplyStreamResponse> in_flight_;
  bool writing_block_ = false;
  bool reading_ = false;
  bool writing_ = false;
  bool input_done_ = false;
  bool stats_sent_ = false;
  bool finished_ = false;
  std::optional<absl::Status> pending_error_;
  int window_ = 0;  // blocks read and not yet written back
  int64_t bytes_ = 0;
};

}  // namespace

grpc::ServerBidiReactor<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>*
EchoService::Echo(grpc::CallbackServerContext* context) {
  return new EchoReactor(context, limits_);
}

}  // namespace dgmm
