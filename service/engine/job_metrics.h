// The counters and logs of jobs' ends: every refusal and every end of an
// admitted job goes through here once, so that the outcome counters of
// GetServerInfo and /metrics, the latency histograms and the log line of a
// job group's part never disagree about one job.
#ifndef DGMM_SERVICE_ENGINE_JOB_METRICS_H_
#define DGMM_SERVICE_ENGINE_JOB_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <iterator>
#include <memory>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "service/core/device.h"
#include "service/engine/admission.h"
#include "service/core/validator.h"

namespace dgmm {

// Job latency histogram buckets, in seconds (Prometheus convention).
inline constexpr double kLatencyBuckets[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5,
                                             1, 5, 10, 60, 300};

struct LatencyHistogram {
  std::vector<int64_t> counts = std::vector<int64_t>(std::size(kLatencyBuckets) + 1);
  double sum_seconds = 0;
  int64_t count = 0;
};

// The stages of an admitted job that are timed per device (JobStats): the
// wait for admission, the copy to the device, the multiply, the copy back.
enum class JobStage { kQueue, kH2d, kCompute, kD2h };
inline constexpr int kJobStages = 4;
// Their histograms' buckets, in seconds: 100 us to a minute, finer than the
// whole job's, since a small job's stages take microseconds.
inline constexpr double kStageBuckets[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
                                           0.01,   0.025,   0.05,   0.1,   0.25,   0.5,
                                           1,      2.5,     5,      10,    30,     60};
// absl::StatusCode values 0 (OK) to 16 (UNAUTHENTICATED), as gRPC's codes.
inline constexpr int kStatusCodes = 17;

// One device's per-stage histogram, as plain values: `counts[b]` jobs took
// at most kStageBuckets[b] (not cumulative; the last: more than the last
// bucket), `sum_ns` their total.
struct StageHistogram {
  std::array<int64_t, std::size(kStageBuckets) + 1> counts{};
  int64_t sum_ns = 0;
  int64_t count() const;
};

// What one device (pool) counted, as plain values.
struct DeviceJobCounters {
  // Jobs refused or ended otherwise than OK, by status code (index: the
  // absl::StatusCode; 0 stays 0).
  std::array<int64_t, kStatusCodes> failed_by_code{};
  // Admitted jobs that ended, whatever their outcome, by stage.
  std::array<StageHistogram, kJobStages> stages{};
};

class JobMetrics {
 public:
  // The outcome counters live with the budgets (Admission::RecordOutcome,
  // per pool); `admission` must outlive this.
  explicit JobMetrics(Admission* admission);

  // A job refused before it ran (a bad request, too large, the queue full,
  // draining, its wait cancelled or timed out), counted against `pool` (0:
  // the host, or not routed yet) under the outcome `s` carries. `group`:
  // the job's JobHeader.group when it is a part of a striped job (null: none
  // or not known yet), with its `lines`.
  void Refused(int pool, const absl::Status& s, const JobGroup* group = nullptr,
               int64_t lines = 0);
  // The same for a job whose header was valid: its group part, if any.
  void Refused(int pool, const absl::Status& s, const JobRequest& job) {
    Refused(pool, s, job.group.has_value() ? &*job.group : nullptr, job.problem.lines());
  }
  // An admitted job ended with `s`: its outcome, its group part and, when
  // OK, its latency (stats.total_ns) in `mode`'s histogram.
  void Ended(int pool, JobMode mode, const JobStats& stats, int64_t lines,
             const absl::Status& s);

  // Latency histogram of completed jobs, per mode ("unary", "stream",
  // "region": both region modes).
  LatencyHistogram Latency(JobMode mode) const;
  // Parts of job groups that ended, by outcome ("completed" or an Outcome
  // name); no per-group label (unbounded).
  std::map<std::string, int64_t> GroupParts() const;
  // Failures by code and stage histograms of `pool` (as Admission's pools:
  // 0 the host, i + 1 GPU i); zeros for a pool out of range.
  DeviceJobCounters Device(int pool) const;
  int pool_count() const { return pool_count_; }

 private:
  // Per pool, relaxed atomics only: a job's end adds to one code or to its
  // stages' buckets and sums, and takes no lock for it.
  struct AtomicStage {
    std::array<std::atomic<int64_t>, std::size(kStageBuckets) + 1> counts{};
    std::atomic<int64_t> sum_ns{0};
  };
  struct PoolCounters {
    std::array<std::atomic<int64_t>, kStatusCodes> failed_by_code{};
    std::array<AtomicStage, kJobStages> stages{};
  };
  void CountFailure(int pool, const absl::Status& s);
  PoolCounters* pool(int p) const {
    return p >= 0 && p < pool_count_ ? &pools_[static_cast<std::size_t>(p)] : nullptr;
  }

  void GroupPartEnded(const JobGroup& group, int64_t lines, uint64_t job_id,
                      const absl::Status& s);

  Admission* const admission_;
  const int pool_count_;
  const std::unique_ptr<PoolCounters[]> pools_;
  mutable std::mutex mu_;
  LatencyHistogram latency_[3] ABSL_GUARDED_BY(mu_);
  std::map<std::string, int64_t> group_parts_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_ENGINE_JOB_METRICS_H_
