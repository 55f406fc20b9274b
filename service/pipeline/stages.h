// The two stages a block goes through (block_pipeline.h): compute on a job's
// device, or nothing (the streaming benchmark's echo). ComputeStage is where
// every admitted job runs, whatever brought its bytes: a unary request's one
// block, a stream's blocks, or a region job's one tile (service/job).
#ifndef DGMM_SERVICE_PIPELINE_STAGES_H_
#define DGMM_SERVICE_PIPELINE_STAGES_H_

#include <functional>
#include <memory>

#include "absl/time/time.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/engine/engine.h"
#include "service/pipeline/block_pipeline.h"

namespace dgmm {

// Each block (or a unary job's one block) computed in place on the job's
// device. Owns the job: destroying the stage returns its reservation.
class ComputeStage final : public BlockStage {
 public:
  // `cancelled_status` words a cancellation seen by Process (CANCELLED, or
  // DEADLINE_EXCEEDED when the caller's deadline is what ended it).
  ComputeStage(std::unique_ptr<ActiveJob> job, std::function<absl::Status()> cancelled_status)
      : job_(std::move(job)), cancelled_status_(std::move(cancelled_status)) {}
  absl::Status Process(std::byte* data, int64_t first_line, int64_t lines,
                       const CancelFn& cancelled) override;
  absl::Status ProcessInto(const std::byte* in, std::byte* out, int64_t first_line, int64_t lines,
                           const CancelFn& cancelled) override;
  // A tile whose input and output differ (a region job's spans).
  absl::Status ProcessTile(const Tile& tile, const CancelFn& cancelled);
  // Records the bytes in the job's stats and ends the job with `outcome`:
  // its outcome, metrics and group log line, once (ActiveJob::End).
  void End(const absl::Status& outcome, int64_t bytes_in, int64_t bytes_out) override;
  ActiveJob& job() { return *job_; }

 private:
  std::unique_ptr<ActiveJob> job_;
  const std::function<absl::Status()> cancelled_status_;
};

// Each block goes back as it came; the stats say "echo".
class EchoStage final : public BlockStage {
 public:
  absl::Status Process(std::byte*, int64_t, int64_t, const CancelFn&) override {
    return absl::OkStatus();
  }
  void End(const absl::Status& outcome, int64_t bytes_in, int64_t bytes_out) override;
  const JobStats& stats() const { return stats_; }

 private:
  const absl::Time started_ = absl::Now();
  JobStats stats_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_PIPELINE_STAGES_H_
