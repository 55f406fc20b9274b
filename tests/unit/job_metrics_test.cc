// JobMetrics' per-device counters (failures by status code, the stage
// histograms) and their exposition through prometheus-cpp (service/metrics.h).
#include "service/engine/job_metrics.h"

#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/backends/cpu/cpu_device.h"
#include "service/core/outcome.h"
#include "service/engine/engine.h"
#include "service/metrics.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kMs = 1000 * 1000;

std::size_t Bucket(double seconds) {
  std::size_t b = 0;
  while (b < std::size(kStageBuckets) && seconds > kStageBuckets[b]) ++b;
  return b;
}

TEST(JobMetrics, EndedJobsLandInTheirDevicesStageBucketsWhateverTheirOutcome) {
  Admission admission({{"cpu", 100}, {"cuda:0", 100}}, 4, absl::Seconds(1));
  JobMetrics m(&admission);
  ASSERT_EQ(m.pool_count(), 2);
  JobStats stats;
  stats.queue_wait_ns = 2 * kMs;
  stats.h2d_ns = 300 * 1000;
  stats.compute_ns = 50 * 1000;
  stats.d2h_ns = 90 * 1000 * kMs;  // over the last bound
  stats.total_ns = 100 * kMs;
  m.Ended(1, JobMode::kWhole, stats, 1, absl::OkStatus());
  m.Ended(1, JobMode::kWhole, stats, 1, absl::DeadlineExceededError("late"));

  const DeviceJobCounters gpu = m.Device(1);
  const auto& queue = gpu.stages[static_cast<int>(JobStage::kQueue)];
  EXPECT_EQ(queue.counts[Bucket(0.002)], 2);
  EXPECT_EQ(queue.count(), 2);
  EXPECT_EQ(queue.sum_ns, 4 * kMs);
  EXPECT_EQ(gpu.stages[static_cast<int>(JobStage::kH2d)].counts[Bucket(0.0003)], 2);
  EXPECT_EQ(gpu.stages[static_cast<int>(JobStage::kCompute)].counts[0], 2);  // 50 us <= 100 us
  EXPECT_EQ(gpu.stages[static_cast<int>(JobStage::kD2h)].counts[std::size(kStageBuckets)], 2);
  EXPECT_EQ(gpu.failed_by_code[static_cast<int>(absl::StatusCode::kDeadlineExceeded)], 1);
  EXPECT_EQ(gpu.failed_by_code[0], 0);
  // The other device saw nothing; the outcome counters moved as before.
  EXPECT_EQ(m.Device(0).stages[0].count(), 0);
  EXPECT_EQ(admission.Stats()[1].completed, 1);
  EXPECT_EQ(admission.Stats()[1].rejected.at("deadline"), 1);
}

TEST(JobMetrics, RefusalsCountByCodeAndOutOfRangePoolsAreIgnored) {
  Admission admission({{"cpu", 100}}, 4, absl::Seconds(1));
  JobMetrics m(&admission);
  m.Refused(0, WithOutcome(absl::ResourceExhaustedError("full"), Outcome::kQueueFull));
  m.Refused(0, absl::ResourceExhaustedError("too large"));
  m.Refused(0, absl::InvalidArgumentError("bad"));
  m.Refused(7, absl::InvalidArgumentError("no such pool"));
  m.Refused(-1, absl::InvalidArgumentError("no such pool"));
  const DeviceJobCounters cpu = m.Device(0);
  EXPECT_EQ(cpu.failed_by_code[static_cast<int>(absl::StatusCode::kResourceExhausted)], 2);
  EXPECT_EQ(cpu.failed_by_code[static_cast<int>(absl::StatusCode::kInvalidArgument)], 1);
  EXPECT_EQ(m.Device(7).failed_by_code[static_cast<int>(absl::StatusCode::kInvalidArgument)], 0);
  // No stage is timed for a job that was never admitted.
  EXPECT_EQ(cpu.stages[static_cast<int>(JobStage::kQueue)].count(), 0);
}

// {series with labels: value} of an exposition.
std::map<std::string, double> Parse(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    out[line.substr(0, space)] = std::stod(line.substr(space + 1));
  }
  return out;
}

TEST(Metrics, ExpositionHasEveryCodeAndCumulativeStageHistogramsPerDevice) {
  auto engine = Engine::Create(EngineOptions{}, std::make_unique<CpuDevice>(1), {});
  ASSERT_TRUE(engine.ok()) << engine.status();
  JobStats stats;
  stats.queue_wait_ns = 3 * kMs;
  stats.compute_ns = 20 * kMs;
  (*engine)->metrics().Ended(0, JobMode::kWhole, stats, 1, absl::OkStatus());
  (*engine)->metrics().Refused(
      0, WithOutcome(absl::ResourceExhaustedError("too large"), Outcome::kTooLarge));

  const std::string text = RenderMetrics(**engine);
  EXPECT_THAT(text, HasSubstr("# TYPE dgmm_jobs_failed_total counter"));
  EXPECT_THAT(text, HasSubstr("# TYPE dgmm_job_queue_seconds histogram"));
  EXPECT_THAT(text, HasSubstr("# TYPE dgmm_job_duration_seconds histogram"));
  auto m = Parse(text);
  const std::string cpu = "device=\"cpu\",index=\"-1\"";
  EXPECT_EQ(m["dgmm_jobs_failed_total{" + cpu + ",code=\"RESOURCE_EXHAUSTED\"}"], 1);
  EXPECT_EQ(m["dgmm_jobs_failed_total{" + cpu + ",code=\"UNAVAILABLE\"}"], 0);
  EXPECT_EQ(m.count("dgmm_jobs_failed_total{" + cpu + ",code=\"OK\"}"), 0u);
  EXPECT_EQ(m["dgmm_jobs_completed_total{" + cpu + "}"], 1);
  EXPECT_EQ(m["dgmm_jobs_rejected_total{" + cpu + ",reason=\"too_large\"}"], 1);
  // Cumulative buckets: 3 ms is over 0.0025 and within 0.005.
  EXPECT_EQ(m["dgmm_job_queue_seconds_bucket{" + cpu + ",le=\"0.0025\"}"], 0);
  EXPECT_EQ(m["dgmm_job_queue_seconds_bucket{" + cpu + ",le=\"0.005\"}"], 1);
  EXPECT_EQ(m["dgmm_job_queue_seconds_bucket{" + cpu + ",le=\"60\"}"], 1);
  EXPECT_EQ(m["dgmm_job_queue_seconds_bucket{" + cpu + ",le=\"+Inf\"}"], 1);
  EXPECT_EQ(m["dgmm_job_queue_seconds_count{" + cpu + "}"], 1);
  EXPECT_DOUBLE_EQ(m["dgmm_job_queue_seconds_sum{" + cpu + "}"], 0.003);
  EXPECT_DOUBLE_EQ(m["dgmm_job_compute_seconds_sum{" + cpu + "}"], 0.02);
  EXPECT_EQ(m["dgmm_job_transfer_seconds_count{" + cpu + ",direction=\"h2d\"}"], 1);
  EXPECT_EQ(m["dgmm_job_transfer_seconds_bucket{" + cpu + ",direction=\"d2h\",le=\"0.0001\"}"], 1);
  EXPECT_EQ(m["dgmm_job_duration_seconds_count{mode=\"unary\"}"], 1);  // the OK job
  EXPECT_EQ(m["dgmm_job_duration_seconds_bucket{mode=\"region\",le=\"+Inf\"}"], 0);
  EXPECT_EQ(m["dgmm_budget_reserved_bytes{" + cpu + "}"], 0);
}

TEST(Metrics, ServerRefusesAnAddressItCannotBind) {
  auto engine = Engine::Create(EngineOptions{}, std::make_unique<CpuDevice>(1), {});
  ASSERT_TRUE(engine.ok());
  auto first = MetricsServer::Start("127.0.0.1:0", engine->get());
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_GT((*first)->port(), 0);
  auto second = MetricsServer::Start(absl::StrCat("127.0.0.1:", (*first)->port()), engine->get());
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(second.status().message(), HasSubstr("--metrics_listen=127.0.0.1:"));
}

}  // namespace
}  // namespace dgmm
