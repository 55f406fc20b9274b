#include "service/metrics.h"

#include <exception>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "prometheus/collectable.h"
#include "prometheus/exposer.h"
#include "prometheus/gauge.h"
#include "prometheus/metric_family.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "service/core/outcome.h"

namespace dgmm {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

// Reads the engine when scraped: its snapshot (budgets, queues, devices,
// outcome counters) and its JobMetrics (failures by code, stage and latency
// histograms). Nothing is kept here, so a scrape costs the engine one
// Snapshot and the job path nothing.
class EngineCollector : public prometheus::Collectable {
 public:
  explicit EngineCollector(const Engine* engine) : engine_(engine) {}
  std::vector<MetricFamily> Collect() const override;

 private:
  const Engine* const engine_;
};

namespace {

using Labels = std::vector<ClientMetric::Label>;

Labels DeviceLabels(const Engine::DeviceState& d) {
  return {{"device", d.index < 0 ? std::string("cpu") : absl::StrCat("cuda:", d.index)},
          {"index", absl::StrCat(d.index)}};
}

Labels With(Labels labels, std::string name, std::string value) {
  labels.push_back({std::move(name), std::move(value)});
  return labels;
}

MetricFamily Family(std::string name, std::string help, MetricType type) {
  MetricFamily f;
  f.name = std::move(name);
  f.help = std::move(help);
  f.type = type;
  return f;
}

void AddValue(MetricFamily* f, Labels labels, double value) {
  ClientMetric m;
  m.label = std::move(labels);
  if (f->type == MetricType::Counter) {
    m.counter.value = value;
  } else {
    m.gauge.value = value;
  }
  f->metric.push_back(std::move(m));
}

// A histogram from per-bucket (not cumulative) counts, the last one over
// every bound.
template <typename Counts, typename Bounds>
void AddHistogram(MetricFamily* f, Labels labels, const Counts& counts, const Bounds& bounds,
                  double sum) {
  ClientMetric m;
  m.label = std::move(labels);
  uint64_t cumulative = 0;
  std::size_t b = 0;
  for (double bound : bounds) {
    cumulative += static_cast<uint64_t>(counts[b++]);
    m.histogram.bucket.push_back({cumulative, bound});
  }
  cumulative += static_cast<uint64_t>(counts[b]);
  m.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
  m.histogram.sample_count = cumulative;
  m.histogram.sample_sum = sum;
  f->metric.push_back(std::move(m));
}

const char* ModeName(JobMode mode) {
  return mode == JobMode::kWhole ? "unary" : mode == JobMode::kStreamed ? "stream" : "region";
}

}  // namespace

std::vector<MetricFamily> EngineCollector::Collect() const {
  const Engine::State state = engine_->Snapshot();
  const JobMetrics& jm = engine_->metrics();
  std::vector<MetricFamily> out;
  auto per_device = [&](std::string name, MetricType type, std::string help, auto value_of) {
    MetricFamily f = Family(std::move(name), std::move(help), type);
    for (const Engine::DeviceState& d : state.devices) {
      AddValue(&f, DeviceLabels(d), static_cast<double>(value_of(d)));
    }
    out.push_back(std::move(f));
  };
  using D = Engine::DeviceState;
  per_device("dgmm_budget_capacity_bytes", MetricType::Gauge,
             "Memory budget capacity of the device.",
             [](const D& d) { return d.budget.capacity; });
  per_device("dgmm_budget_reserved_bytes", MetricType::Gauge, "Bytes reserved by admitted jobs.",
             [](const D& d) { return d.budget.reserved; });
  per_device("dgmm_device_memory_bytes", MetricType::Gauge, "Total memory of the device.",
             [](const D& d) { return d.total_memory_bytes; });
  per_device("dgmm_jobs_queued", MetricType::Gauge, "Jobs waiting for admission.",
             [](const D& d) { return d.budget.queued; });
  per_device("dgmm_jobs_running", MetricType::Gauge, "Jobs admitted and running.",
             [](const D& d) { return d.budget.running; });
  per_device("dgmm_device_in_service", MetricType::Gauge, "1 while the device takes jobs.",
             [](const D& d) { return d.in_service ? 1 : 0; });
  per_device("dgmm_jobs_completed_total", MetricType::Counter, "Jobs finished with OK.",
             [](const D& d) { return d.budget.completed; });

  MetricFamily rejected = Family("dgmm_jobs_rejected_total",
                                 "Jobs that ended otherwise than OK, by reason.",
                                 MetricType::Counter);
  for (const D& d : state.devices) {
    for (const auto& [reason, n] : d.budget.rejected) {
      AddValue(&rejected, With(DeviceLabels(d), "reason", reason), static_cast<double>(n));
    }
  }
  out.push_back(std::move(rejected));

  // By status code, every code present from the start, so that a rate over
  // a code that has not happened yet is 0 rather than no data.
  MetricFamily failed = Family("dgmm_jobs_failed_total",
                               "Jobs refused or ended otherwise than OK, by gRPC status code.",
                               MetricType::Counter);
  MetricFamily queue = Family("dgmm_job_queue_seconds",
                              "Time admitted jobs waited for admission, per device.",
                              MetricType::Histogram);
  MetricFamily compute = Family("dgmm_job_compute_seconds",
                                "Time admitted jobs spent in the multiply, per device.",
                                MetricType::Histogram);
  MetricFamily transfer = Family(
      "dgmm_job_transfer_seconds",
      "Time admitted jobs spent copying to (h2d) and from (d2h) the device, per device; 0 on "
      "the CPU.",
      MetricType::Histogram);
  for (std::size_t pool = 0; pool < state.devices.size(); ++pool) {
    const D& d = state.devices[pool];
    const DeviceJobCounters c = jm.Device(static_cast<int>(pool));
    for (int code = 1; code < kStatusCodes; ++code) {
      AddValue(&failed,
               With(DeviceLabels(d), "code",
                    absl::StatusCodeToString(static_cast<absl::StatusCode>(code))),
               static_cast<double>(c.failed_by_code[static_cast<std::size_t>(code)]));
    }
    auto stage = [&](MetricFamily* f, JobStage s, Labels labels) {
      const StageHistogram& h = c.stages[static_cast<std::size_t>(s)];
      AddHistogram(f, std::move(labels), h.counts, kStageBuckets,
                   static_cast<double>(h.sum_ns) * 1e-9);
    };
    stage(&queue, JobStage::kQueue, DeviceLabels(d));
    stage(&compute, JobStage::kCompute, DeviceLabels(d));
    stage(&transfer, JobStage::kH2d, With(DeviceLabels(d), "direction", "h2d"));
    stage(&transfer, JobStage::kD2h, With(DeviceLabels(d), "direction", "d2h"));
  }
  out.push_back(std::move(failed));
  out.push_back(std::move(queue));
  out.push_back(std::move(compute));
  out.push_back(std::move(transfer));

  MetricFamily parts = Family(
      "dgmm_group_parts_total",
      "Parts of striped jobs (JobHeader.group) that ended, by outcome (completed or the reason).",
      MetricType::Counter);
  for (const auto& [outcome, n] : jm.GroupParts()) {
    AddValue(&parts, {{"outcome", outcome}}, static_cast<double>(n));
  }
  out.push_back(std::move(parts));

  MetricFamily latency = Family("dgmm_job_duration_seconds",
                                "Wall time of completed jobs from arrival to result, by mode.",
                                MetricType::Histogram);
  for (JobMode mode : {JobMode::kWhole, JobMode::kStreamed, JobMode::kHostRegion}) {
    const LatencyHistogram h = jm.Latency(mode);
    AddHistogram(&latency, {{"mode", ModeName(mode)}}, h.counts, kLatencyBuckets,
                 h.sum_seconds);
  }
  out.push_back(std::move(latency));
  return out;
}

std::string RenderMetrics(const Engine& engine) {
  return prometheus::TextSerializer().Serialize(EngineCollector(&engine).Collect());
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    const Engine* engine) {
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->collector_ = std::make_shared<EngineCollector>(engine);
  server->registry_ = std::make_shared<prometheus::Registry>();
  prometheus::BuildGauge()
      .Name("dgmm_build_info")
      .Help("1, labelled with the server's version.")
      .Register(*server->registry_)
      .Add({{"version", DGMM_VERSION}})
      .Set(1);
  try {
    // Two threads: a scrape never waits behind another (Prometheus and a
    // person with curl).
    server->exposer_ = std::make_unique<prometheus::Exposer>(address, 2);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("--metrics_listen=", address,
                                               ": cannot serve metrics there: ", e.what()));
  }
  server->exposer_->RegisterCollectable(server->collector_);
  server->exposer_->RegisterCollectable(server->registry_);
  const std::vector<int> ports = server->exposer_->GetListeningPorts();
  if (!ports.empty()) server->port_ = ports.front();
  return server;
}

MetricsServer::~MetricsServer() = default;

}  // namespace dgmm
