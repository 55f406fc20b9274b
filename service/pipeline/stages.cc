#include "service/pipeline/stages.h"

namespace dgmm {

absl::Status ComputeStage::Process(std::byte* data, int64_t first_line, int64_t lines,
                                   const CancelFn& cancelled) {
  return ProcessTile(Tile{data, data, first_line, lines}, cancelled);
}

absl::Status ComputeStage::ProcessInto(const std::byte* in, std::byte* out, int64_t first_line,
                                       int64_t lines, const CancelFn& cancelled) {
  return ProcessTile(Tile{in, out, first_line, lines}, cancelled);
}

absl::Status ComputeStage::ProcessTile(const Tile& tile, const CancelFn& cancelled) {
  absl::Status s = job_->Process(tile, cancelled);
  if (s.code() == absl::StatusCode::kCancelled) s = cancelled_status_();
  return s;
}

void ComputeStage::End(const absl::Status& outcome, int64_t bytes_in, int64_t bytes_out) {
  job_->stats().bytes_in = bytes_in;
  job_->stats().bytes_out = bytes_out;
  job_->End(outcome);
}

void EchoStage::End(const absl::Status&, int64_t bytes_in, int64_t bytes_out) {
  stats_.device = "echo";
  stats_.device_index = -1;
  stats_.bytes_in = bytes_in;
  stats_.bytes_out = bytes_out;
  stats_.total_ns = absl::ToInt64Nanoseconds(absl::Now() - started_);
}

}  // namespace dgmm
