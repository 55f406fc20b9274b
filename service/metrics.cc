#include "service/metrics.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#ifdef DGMM_HAVE_CIVETWEB
#include <civetweb.h>
#endif

namespace dgmm {
namespace {

std::string Labels(const Engine::DeviceState& d) {
  return absl::StrFormat("device=\"%s\",index=\"%d\"",
                         d.index < 0 ? "cpu" : absl::StrCat("cuda:", d.index), d.index);
}

void Family(std::string* out, absl::string_view name, absl::string_view type,
            absl::string_view help) {
  absl::StrAppend(out, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
}

}  // namespace

std::string RenderMetrics(const Engine& engine) {
  const Engine::State state = engine.Snapshot();
  std::string out;
  auto gauge = [&](absl::string_view name, absl::string_view type, absl::string_view help,
                   auto value_of) {
    Family(&out, name, type, help);
    for (const Engine::DeviceState& d : state.devices) {
      absl::StrAppend(&out, name, "{", Labels(d), "} ", value_of(d), "\n");
    }
  };
  gauge("dgmm_budget_capacity_bytes", "gauge", "Memory budget capacity of the device.",
        [](const Engine::DeviceState& d) { return d.budget.capacity; });
  gauge("dgmm_budget_reserved_bytes", "gauge", "Bytes reserved by admitted jobs.",
        [](const Engine::DeviceState& d) { return d.budget.reserved; });
  gauge("dgmm_device_memory_bytes", "gauge", "Total memory of the device.",
        [](const Engine::DeviceState& d) { return d.total_memory_bytes; });
  gauge("dgmm_jobs_queued", "gauge", "Jobs waiting for admission.",
        [](const Engine::DeviceState& d) { return d.budget.queued; });
  gauge("dgmm_jobs_running", "gauge", "Jobs admitted and running.",
        [](const Engine::DeviceState& d) { return d.budget.running; });
  gauge("dgmm_device_in_service", "gauge", "1 while the device takes jobs.",
        [](const Engine::DeviceState& d) { return d.in_service ? 1 : 0; });
  gauge("dgmm_jobs_completed_total", "counter", "Jobs finished with OK.",
        [](const Engine::DeviceState& d) { return d.budget.completed; });
  Family(&out, "dgmm_jobs_rejected_total", "counter",
         "Jobs that ended otherwise than OK, by reason.");
  for (const Engine::DeviceState& d : state.devices) {
    for (const auto& [reason, n] : d.budget.rejected) {
      absl::StrAppend(&out, "dgmm_jobs_rejected_total{", Labels(d), ",reason=\"", reason,
                      "\"} ", n, "\n");
    }
  }
  Family(&out, "dgmm_group_parts_total", "counter",
         "Parts of striped jobs (JobHeader.group) that ended, by outcome (completed or the "
         "reason).");
  for (const auto& [outcome, n] : engine.metrics().GroupParts()) {
    absl::StrAppend(&out, "dgmm_group_parts_total{outcome=\"", outcome, "\"} ", n, "\n");
  }
  Family(&out, "dgmm_job_duration_seconds", "histogram",
         "Wall time of completed jobs from arrival to result, by mode.");
  for (JobMode mode : {JobMode::kWhole, JobMode::kStreamed, JobMode::kHostRegion}) {
    const std::string m = mode == JobMode::kWhole      ? "unary"
                          : mode == JobMode::kStreamed ? "stream"
                                                       : "region";
    const LatencyHistogram h = engine.metrics().Latency(mode);
    int64_t cumulative = 0;
    for (std::size_t b = 0; b < std::size(kLatencyBuckets); ++b) {
      cumulative += h.counts[b];
      absl::StrAppend(&out, "dgmm_job_duration_seconds_bucket{mode=\"", m, "\",le=\"",
                      kLatencyBuckets[b], "\"} ", cumulative, "\n");
    }
    absl::StrAppend(&out, "dgmm_job_duration_seconds_bucket{mode=\"", m, "\",le=\"+Inf\"} ",
                    h.count, "\n");
    absl::StrAppend(&out, "dgmm_job_duration_seconds_sum{mode=\"", m, "\"} ", h.sum_seconds,
                    "\n");
    absl::StrAppend(&out, "dgmm_job_duration_seconds_count{mode=\"", m, "\"} ", h.count, "\n");
  }
  return out;
}

#ifdef DGMM_HAVE_CIVETWEB
namespace {
int HandleMetrics(struct mg_connection* conn, void* engine) {
  const std::string body = RenderMetrics(*static_cast<const Engine*>(engine));
  mg_printf(conn,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
            "Content-Length: %zu\r\nConnection: close\r\n\r\n",
            body.size());
  mg_write(conn, body.data(), body.size());
  return 200;
}
}  // namespace

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    const Engine* engine) {
  mg_init_library(0);
  const char* options[] = {"listening_ports", address.c_str(), "num_threads", "2", nullptr};
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->engine_ = engine;
  char error[256] = "";
  mg_init_data init{};
  init.configuration_options = options;
  mg_error_data err{};
  err.text = error;
  err.text_buffer_size = sizeof error;
  mg_context* ctx = mg_start2(&init, &err);
  if (ctx == nullptr) {
    return absl::UnavailableError(absl::StrCat("--metrics_listen=", address,
                                               ": cannot serve metrics there: ", error));
  }
  server->context_ = ctx;
  mg_set_request_handler(ctx, "/metrics", HandleMetrics, const_cast<Engine*>(engine));
  mg_server_port ports[4];
  const int n = mg_get_server_ports(ctx, 4, ports);
  if (n > 0) server->port_ = ports[0].port;
  return server;
}

MetricsServer::~MetricsServer() {
  if (context_ != nullptr) mg_stop(static_cast<mg_context*>(context_));
}
#else
absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    const Engine* engine) {
  return absl::UnimplementedError(
      "this dgmm-server was built without civetweb (libcivetweb-dev); --metrics_listen is "
      "unavailable");
}
MetricsServer::~MetricsServer() = default;
#endif

}  // namespace dgmm
