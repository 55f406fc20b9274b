#include "service/engine/job_metrics.h"

#include "absl/strings/str_cat.h"
#include "service/core/outcome.h"
#include "service/core/log.h"

namespace dgmm {
namespace {

int LatencyIndex(JobMode m) {
  return m == JobMode::kWhole ? 0 : m == JobMode::kStreamed ? 1 : 2;
}

std::size_t StageBucket(int64_t ns) {
  const double seconds = static_cast<double>(ns) * 1e-9;
  std::size_t b = 0;
  while (b < std::size(kStageBuckets) && seconds > kStageBuckets[b]) ++b;
  return b;
}

}  // namespace

int64_t StageHistogram::count() const {
  int64_t n = 0;
  for (int64_t c : counts) n += c;
  return n;
}

JobMetrics::JobMetrics(Admission* admission)
    : admission_(admission),
      pool_count_(admission->pool_count()),
      pools_(std::make_unique<PoolCounters[]>(static_cast<std::size_t>(pool_count_))) {}

void JobMetrics::CountFailure(int p, const absl::Status& s) {
  PoolCounters* c = pool(p);
  if (c == nullptr || s.ok()) return;
  int code = static_cast<int>(s.code());
  if (code <= 0 || code >= kStatusCodes) code = static_cast<int>(absl::StatusCode::kUnknown);
  c->failed_by_code[static_cast<std::size_t>(code)].fetch_add(1, std::memory_order_relaxed);
}

void JobMetrics::Refused(int pool, const absl::Status& s, const JobGroup* group,
                         int64_t lines) {
  admission_->RecordOutcome(pool, OutcomeOf(s));
  CountFailure(pool, s);
  if (group != nullptr) GroupPartEnded(*group, lines, 0, s);
}

void JobMetrics::Ended(int pool, JobMode mode, const JobStats& stats, int64_t lines,
                       const absl::Status& s) {
  admission_->RecordOutcome(pool, OutcomeOf(s));
  CountFailure(pool, s);
  if (PoolCounters* c = this->pool(pool); c != nullptr) {
    const int64_t ns[kJobStages] = {stats.queue_wait_ns, stats.h2d_ns, stats.compute_ns,
                                    stats.d2h_ns};
    for (int i = 0; i < kJobStages; ++i) {
      AtomicStage& st = c->stages[static_cast<std::size_t>(i)];
      st.counts[StageBucket(ns[i])].fetch_add(1, std::memory_order_relaxed);
      st.sum_ns.fetch_add(ns[i], std::memory_order_relaxed);
    }
  }
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

DeviceJobCounters JobMetrics::Device(int p) const {
  DeviceJobCounters out;
  const PoolCounters* c = pool(p);
  if (c == nullptr) return out;
  for (std::size_t i = 0; i < out.failed_by_code.size(); ++i) {
    out.failed_by_code[i] = c->failed_by_code[i].load(std::memory_order_relaxed);
  }
  for (std::size_t st = 0; st < out.stages.size(); ++st) {
    for (std::size_t b = 0; b < out.stages[st].counts.size(); ++b) {
      out.stages[st].counts[b] = c->stages[st].counts[b].load(std::memory_order_relaxed);
    }
    out.stages[st].sum_ns = c->stages[st].sum_ns.load(std::memory_order_relaxed);
  }
  return out;
}

std::map<std::string, int64_t> JobMetrics::GroupParts() const {
  std::lock_guard lock(mu_);
  return group_parts_;
}

}  // namespace dgmm
