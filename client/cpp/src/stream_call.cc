#include "src/stream_call.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "dgmm/grpc_status.h"

namespace dgmm {
namespace {

constexpr char kMultiplyStreamMethod[] = "/dgmm.v1.Dgmm/MultiplyStream";

absl::Status ProtocolError(absl::string_view what) {
  return absl::InternalError(absl::StrCat("the server broke the MultiplyStream protocol: ", what));
}

}  // namespace

StreamPlan PlanStream(const MatrixView& matrix, size_t matrix_bytes, int64_t chunk_bytes) {
  StreamPlan plan;
  plan.lines = matrix.layout == v1::LAYOUT_COL_MAJOR ? matrix.cols : matrix.rows;
  plan.line_bytes = matrix_bytes / static_cast<size_t>(plan.lines);
  const int64_t fit = chunk_bytes / static_cast<int64_t>(plan.line_bytes);
  plan.lines_per_block = std::clamp<int64_t>(fit, 1, plan.lines);
  return plan;
}

StreamCall::StreamCall(const v1::JobHeader& header, const char* matrix, char* out, StreamPlan plan,
                       ProgressCallback progress, wire::SliceLoans* loans)
    : header_(header),
      matrix_(matrix),
      out_(out),
      plan_(plan),
      progress_(std::move(progress)),
      loans_(loans) {}

absl::StatusOr<v1::JobStats> StreamCall::Run(grpc::GenericStub* stub,
                                             grpc::ClientContext* context) {
  context_ = context;
  stub->PrepareBidiStreamingCall(context, kMultiplyStreamMethod, grpc::StubOptions(), this);
  write_buffer_ = wire::EncodeStreamHeader(header_);
  pending_write_bytes_ = 0;
  StartWrite(&write_buffer_);
  StartRead(&read_buffer_);
  StartCall();
  {
    std::unique_lock lock(done_mu_);
    done_cv_.wait(lock, [this] { return done_; });
  }
  // Drop this object's references to lent slices before the caller waits for them.
  write_buffer_.Clear();
  read_buffer_.Clear();
  return Outcome();
}

void StreamCall::OnWriteDone(bool ok) {
  // Not ok: the call is ending (the server's status arrives in OnDone).
  if (!ok) return;
  bytes_sent_.fetch_add(static_cast<int64_t>(pending_write_bytes_), std::memory_order_relaxed);
  if (pending_write_bytes_ > 0) ReportProgress();
  WriteNextBlock();
}

void StreamCall::WriteNextBlock() {
  if (next_line_to_send_ == plan_.lines) {
    StartWritesDone();
    return;
  }
  const int64_t lines = std::min(plan_.lines_per_block, plan_.lines - next_line_to_send_);
  const size_t offset = static_cast<size_t>(next_line_to_send_) * plan_.line_bytes;
  pending_write_bytes_ = static_cast<size_t>(lines) * plan_.line_bytes;
  write_buffer_ =
      wire::EncodeStreamBlock(next_line_to_send_, matrix_ + offset, pending_write_bytes_, loans_);
  next_line_to_send_ += lines;
  StartWrite(&write_buffer_);
}

void StreamCall::OnReadDone(bool ok) {
  // Not ok: the server has ended the stream; OnDone follows.
  if (!ok) return;
  absl::Status handled = HandleResponse();
  read_buffer_.Clear();
  if (!handled.ok()) {
    protocol_error_ = std::move(handled);
    context_->TryCancel();
    return;
  }
  StartRead(&read_buffer_);
}

absl::Status StreamCall::HandleResponse() {
  absl::StatusOr<wire::StreamResponse> response = wire::DecodeStreamResponse(
      &read_buffer_,
      [this](int64_t first_line, size_t size) { return PlaceBlock(first_line, size); });
  if (!response.ok()) return response.status();
  switch (response->kind) {
    case wire::StreamResponse::Kind::kAccepted:
      if (accepted_) return ProtocolError("a second StreamAccepted");
      accepted_ = true;
      return absl::OkStatus();
    case wire::StreamResponse::Kind::kBlock:
      next_line_to_receive_ += static_cast<int64_t>(response->size / plan_.result_line_bytes());
      bytes_received_.fetch_add(static_cast<int64_t>(response->size), std::memory_order_relaxed);
      ReportProgress();
      return absl::OkStatus();
    case wire::StreamResponse::Kind::kStats:
      if (next_line_to_receive_ != plan_.lines) {
        return ProtocolError(absl::StrCat("stats after ", next_line_to_receive_, " of ",
                                          plan_.lines, " result lines"));
      }
      stats_ = std::move(response->stats);
      return absl::OkStatus();
  }
  return ProtocolError("unknown response kind");
}

absl::StatusOr<void*> StreamCall::PlaceBlock(int64_t first_line, size_t size) {
  if (!accepted_) return ProtocolError("a result block before StreamAccepted");
  if (first_line != next_line_to_receive_) {
    return ProtocolError(absl::StrCat("result block at line ", first_line, "; expected line ",
                                      next_line_to_receive_));
  }
  const int64_t lines_left = plan_.lines - first_line;
  const size_t line = plan_.result_line_bytes();
  if (size == 0 || size % line != 0 || static_cast<int64_t>(size / line) > lines_left) {
    return ProtocolError(absl::StrCat("result block of ", size, " bytes at line ", first_line,
                                      "; result lines are ", line, " bytes and ", lines_left,
                                      " remain"));
  }
  return out_ + static_cast<size_t>(first_line) * line;
}

void StreamCall::ReportProgress() {
  if (!progress_) return;
  std::lock_guard lock(progress_mu_);
  // Received lines counted in A's bytes, so that both counts end at the
  // total whatever C's dtype.
  progress_(bytes_sent_.load(std::memory_order_relaxed),
            bytes_received_.load(std::memory_order_relaxed) /
                static_cast<int64_t>(plan_.result_line_bytes()) *
                static_cast<int64_t>(plan_.line_bytes),
            static_cast<int64_t>(plan_.line_bytes) * plan_.lines);
}

void StreamCall::OnDone(const grpc::Status& status) {
  // Notified under the lock: Run's caller may destroy this object as soon
  // as it sees done_.
  std::lock_guard lock(done_mu_);
  status_ = status;
  done_ = true;
  done_cv_.notify_all();
}

absl::StatusOr<v1::JobStats> StreamCall::Outcome() {
  if (!protocol_error_.ok()) {
    broke_protocol_ = true;
    return protocol_error_;
  }
  grpc::Status status;
  {
    std::lock_guard lock(done_mu_);
    status = status_;
  }
  if (!status.ok()) return FromGrpcStatus(status);
  if (!stats_.has_value()) {
    broke_protocol_ = true;
    return ProtocolError(absl::StrCat("the call ended OK after ", next_line_to_receive_, " of ",
                                      plan_.lines, " result lines and no stats"));
  }
  return *std::move(stats_);
}

}  // namespace dgmm
