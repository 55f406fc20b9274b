#include "service/engine/job_metrics.h"

#include "absl/strings/str_cat.h"
#include "service/core/outcome.h"
#include "service/core/log.h"

namespace dgmm {
namespace {

int LatencyIndex(JobMode m) {
  return m == JobMode::kWhole ? 0 : m == JobMode::kStreamed ? 1 : 2;
}

}  // namespace

void JobMetrics::Refused(int pool, const absl::Status& s, const JobGroup* group,
                         int64_t lines) {
  admission_->RecordOutcome(pool, OutcomeOf(s));
  if (group != nullptr) GroupPartEnded(*group, lines, 0, s);
}

void JobMetrics::Ended(int pool, JobMode mode, const JobStats& stats, int64_t lines,
                       const absl::Status& s) {
  admission_->RecordOutcome(pool, OutcomeOf(s));
  if (stats.group.has_value()) GroupPartEnded(*stats.group, lines, stats.job_id, s);
  if (!s.ok()) return;
  const double seconds = static_cast<double>(stats.total_ns) * 1e-9;
  std::lock_guard lock(mu_);
  LatencyHistogram& h = latency_[LatencyIndex(mode)];
  std::size_t b = 0;
  while (b < std::size(kLatencyBuckets) && seconds > kLatencyBuckets[b]) ++b;
  h.counts[b]++;
  h.sum_seconds += seconds;
  h.count++;
}

void JobMetrics::GroupPartEnded(const JobGroup& group, int64_t lines, uint64_t job_id,
                                const absl::Status& s) {
  const std::string outcome = s.ok() ? "completed" : std::string(OutcomeName(OutcomeOf(s)));
  {
    std::lock_guard lock(mu_);
    group_parts_[outcome]++;
  }
  // The part's log line is the engine's (job_log.h).
}

LatencyHistogram JobMetrics::Latency(JobMode mode) const {
  std::lock_guard lock(mu_);
  return latency_[LatencyIndex(mode)];
}

std::map<std::string, int64_t> JobMetrics::GroupParts() const {
  std::lock_guard lock(mu_);
  return group_parts_;
}

}  // namespace dgmm
