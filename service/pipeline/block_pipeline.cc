#include "service/pipeline/block_pipeline.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/core/outcome.h"
#include "service/core/read_locked.h"

namespace dgmm {

BlockPipeline::BlockPipeline(const Problem& problem, Options options, HostBufferPool* pool,
                             Post post, std::shared_ptr<BlockStage> stage, PipelineIo* io)
    : problem_(problem),
      options_(options),
      pool_(pool),
      post_(std::move(post)),
      stage_(std::move(stage)),
      assembler_(problem, options.max_block_bytes),
      io_(io),
      last_progress_(absl::Now()) {}

void BlockPipeline::Start() {
  std::lock_guard lock(mu_);
  started_ = true;
  last_progress_ = absl::Now();
  PumpLocked();
}

void BlockPipeline::OnMessage(std::unique_ptr<BlockMessage> message) {
  std::lock_guard lock(mu_);
  reading_ = false;
  if (finished_ || error_.has_value()) return;  // dropped: gRPC's buffers go back now
  // Held to the block limit as it arrives, before it is queued, so that the
  // window holds at most block-sized messages.
  const size_t limit = static_cast<size_t>(options_.max_block_bytes) + options_.framing_slack;
  if (message->size() > limit) {
    FailLocked(WithOutcome(absl::InvalidArgumentError(absl::StrCat(
                               "message of ", message->size(), " bytes exceeds max_block_bytes ",
                               options_.max_block_bytes, " plus ", options_.framing_slack,
                               " bytes for its fields")),
                           Outcome::kMessageTooLarge));
    return;
  }
  blocks_received_++;
  last_progress_ = absl::Now();
  auto block = std::make_shared<Pending>();
  block->message_bytes = static_cast<int64_t>(message->size());
  block->message = std::move(message);
  held_bytes_ += block->message_bytes;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
  window_++;
  peak_window_ = std::max(peak_window_, window_);
  compute_queue_.push_back(std::move(block));
  PumpLocked();
}

void BlockPipeline::OnHalfClose() {
  std::lock_guard lock(mu_);
  reading_ = false;
  input_done_ = true;
  PumpLocked();
}

void BlockPipeline::OnWriteDone(const absl::Status& status) {
  std::lock_guard lock(mu_);
  writing_ = false;
  window_--;
  held_bytes_ -= written_held_.front();
  written_held_.pop_front();
  last_progress_ = absl::Now();
  if (!status.ok()) FailLocked(status);  // no effect after a first error
  PumpLocked();
}

void BlockPipeline::Fail(const absl::Status& status) {
  std::lock_guard lock(mu_);
  FailLocked(status);
}

void BlockPipeline::DetachIo() {
  std::lock_guard lock(mu_);
  io_ = nullptr;
  if (!finished_ && !error_.has_value()) {
    error_ = absl::CancelledError("the call ended");
    failed_at_ = absl::Now();
    cancelled_->store(true);
  }
  compute_queue_.clear();
  write_queue_.clear();
  writing_ = false;  // a write in flight will not be reported
  PumpLocked();  // ends the stage now, or once its block returns
}

absl::Time BlockPipeline::last_progress() const { return ReadLocked(mu_, last_progress_); }

int64_t BlockPipeline::blocks_received() const { return ReadLocked(mu_, blocks_received_); }

bool BlockPipeline::ended() const { return ReadLocked(mu_, stage_ended_); }

std::optional<absl::Time> BlockPipeline::failed_at() const {
  std::lock_guard lock(mu_);
  if (!error_.has_value()) return std::nullopt;
  return failed_at_;
}

int BlockPipeline::peak_window() const { return ReadLocked(mu_, peak_window_); }

int64_t BlockPipeline::peak_held_bytes() const { return ReadLocked(mu_, peak_held_bytes_); }

void BlockPipeline::FailLocked(const absl::Status& status) {
  if (finished_ || error_.has_value()) return;
  error_ = status;
  failed_at_ = absl::Now();
  cancelled_->store(true);
  compute_queue_.clear();  // their messages go back to gRPC now
  write_queue_.clear();    // their buffers go back to the pool now
  while (written_held_.size() > (writing_ ? 1u : 0u)) written_held_.pop_back();
  PumpLocked();
}

void BlockPipeline::FinishLocked(const absl::Status& status) {
  if (finished_) return;
  finished_ = true;
  cancelled_->store(true);
  if (io_ != nullptr) io_->Finish(status);
}

void BlockPipeline::PumpLocked() {
  if (finished_ || !started_) return;
  if (error_.has_value()) {
    // The stage ends once its block has returned; the call finishes once
    // the write in flight is done.
    if (!computing_ && !stage_ended_) {
      stage_ended_ = true;
      stage_->End(*error_, bytes_in_, bytes_out_);
    }
    if (stage_ended_ && !writing_) FinishLocked(*error_);
    return;
  }
  if (io_ == nullptr) return;
  if (!reading_ && !input_done_ && window_ < options_.window_blocks) {
    reading_ = true;
    io_->StartRead();
  }
  if (!computing_ && !compute_queue_.empty()) StartComputeLocked();
  if (!writing_ && !write_queue_.empty()) {
    writing_ = true;
    OutBlock out = std::move(write_queue_.front());
    write_queue_.pop_front();
    io_->StartWrite(std::move(out));
  }
  if (input_done_ && !computing_ && compute_queue_.empty() && !writing_ &&
      write_queue_.empty()) {
    if (absl::Status s = assembler_.Finish(); !s.ok()) {
      FailLocked(s);
      return;
    }
    stage_ended_ = true;
    stage_->End(absl::OkStatus(), bytes_in_, bytes_out_);
    FinishLocked(absl::OkStatus());
  }
}

void BlockPipeline::StartComputeLocked() {
  computing_ = true;
  std::shared_ptr<Pending> block = std::move(compute_queue_.front());
  compute_queue_.pop_front();
  post_([self = shared_from_this(), block] { self->Compute(block); });
}

absl::Status BlockPipeline::Receive(Pending* block) {
  absl::StatusOr<BlockMessage::Decoded> decoded =
      block->message->Decode([&](int64_t, size_t size) -> absl::StatusOr<void*> {
        if (absl::Status s = assembler_.CheckSize(size); !s.ok()) return s;
        if (size == 0) return nullptr;  // Accept turns it down below
        absl::StatusOr<HostBuffer> buffer = pool_->Take(static_cast<int64_t>(size));
        if (!buffer.ok()) return buffer.status();
        block->buffer = std::move(*buffer);
        return block->buffer.data();
      });
  block->message.reset();  // gRPC's buffers go back now
  if (!decoded.ok()) return decoded.status();
  absl::StatusOr<int64_t> lines = assembler_.Accept(decoded->first_line, decoded->size);
  if (!lines.ok()) return lines.status();
  block->first_line = decoded->first_line;
  block->lines = *lines;
  block->bytes = decoded->size;
  return absl::OkStatus();
}

// On a job worker, for one block at a time, in order: only this function
// uses the assembler between PumpLocked's final check.
void BlockPipeline::Compute(std::shared_ptr<Pending> block) {
  absl::Status s = Receive(block.get());
  const CancelFn cancelled = [c = cancelled_] { return c->load(); };
  // The block's result: in place, or (C wider than A) a buffer of its own.
  size_t out_bytes = block->bytes;
  if (s.ok() && wider()) {
    out_bytes = static_cast<size_t>(block->lines * problem_.out_line_bytes());
    absl::StatusOr<HostBuffer> out = pool_->Take(static_cast<int64_t>(out_bytes));
    if (out.ok()) {
      s = stage_->ProcessInto(block->buffer.data(), out->data(), block->first_line, block->lines,
                              cancelled);
      block->buffer = std::move(*out);  // A's buffer goes back now
    } else {
      s = out.status();
    }
  } else if (s.ok()) {
    s = stage_->Process(block->buffer.data(), block->first_line, block->lines, cancelled);
  }
  std::lock_guard lock(mu_);
  computing_ = false;
  // The message was held with the buffer while it was copied: count that
  // moment, then only the buffer (C's, once computed).
  const int64_t payload = static_cast<int64_t>(block->bytes);
  held_bytes_ += payload;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
  held_bytes_ -= block->message_bytes;
  if (!s.ok()) {
    held_bytes_ -= payload;
    FailLocked(s);
    PumpLocked();  // FailLocked did nothing if an error came first
    return;
  }
  const int64_t result = static_cast<int64_t>(out_bytes);
  // A wider C was computed from A's buffer into its own (ProcessInto): both
  // were held for that moment.
  if (result != payload) peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_ + result);
  held_bytes_ += result - payload;
  peak_held_bytes_ = std::max(peak_held_bytes_, held_bytes_);
  bytes_in_ += payload;
  bytes_out_ += result;
  if (error_.has_value() || finished_) {
    held_bytes_ -= result;
    PumpLocked();
    return;
  }
  written_held_.push_back(result);
  write_queue_.push_back(OutBlock{block->first_line, out_bytes, std::move(block->buffer)});
  PumpLocked();
}

}  // namespace dgmm
