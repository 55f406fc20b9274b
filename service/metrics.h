// Prometheus text exposition of the engine's counters, served over HTTP by
// civetweb when --metrics_listen is set.
#ifndef DGMM_SERVICE_METRICS_H_
#define DGMM_SERVICE_METRICS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "service/engine/engine.h"

namespace dgmm {

// The exposition text (format 0.0.4): per-device budget, reserved bytes,
// queued/running jobs, completed and rejected totals by reason, parts of
// striped jobs by outcome, and job latency histograms by mode.
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
  void* context_ = nullptr;  // struct mg_context*
  const Engine* engine_ = nullptr;
  int port_ = 0;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_METRICS_H_
