// Prometheus metrics of the engine, through prometheus-cpp: a collector that
// reads the engine's snapshot and counters when scraped, serialized by
// prometheus-cpp and served by its exposer when --metrics_listen is set.
#ifndef DGMM_SERVICE_METRICS_H_
#define DGMM_SERVICE_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "service/engine/engine.h"

namespace prometheus {
class Exposer;
class Registry;
}  // namespace prometheus

namespace dgmm {

class EngineCollector;

// The exposition text (format 0.0.4) of what MetricsServer serves at
// /metrics: per-device budget, reserved bytes, queued/running jobs,
// completed and rejected totals by reason, failures by status code, the
// stage histograms (queue, compute, transfer), parts of striped jobs by
// outcome, job latency histograms by mode, and the build's version.
std::string RenderMetrics(const Engine& engine);

class MetricsServer {
 public:
  // Listens on `address` ("HOST:PORT"; port 0 picks a free one) and serves
  // GET /metrics. `engine` must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              const Engine* engine);
  ~MetricsServer();
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  std::shared_ptr<EngineCollector> collector_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<prometheus::Exposer> exposer_;
  int port_ = 0;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_METRICS_H_
