// `dgmm-cli info` and `dgmm-cli health`.
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cli/commands.h"

ABSL_FLAG(std::string, service, "",
          "health: the service name to check; empty for the server as a whole, "
          "dgmm.v1.Dgmm for the dgmm service.");

namespace dgmm::cli {
namespace {

void PrintDevice(const v1::DeviceInfo& d) {
  const std::string where = d.index() < 0 ? "cpu" : absl::StrCat("cuda:", d.index());
  std::vector<std::string> backends;
  for (int b : d.backends()) backends.push_back(BackendName(static_cast<v1::Backend>(b)));
  std::printf("  %s  %s%s\n", where.c_str(), d.name().c_str(),
              d.in_service() ? "" : "  (OUT OF SERVICE)");
  std::printf("    memory %s, budget %s, reserved %s, %s %d, backends %s\n",
              FormatBytes(d.total_memory_bytes()).c_str(), FormatBytes(d.budget_bytes()).c_str(),
              FormatBytes(d.reserved_bytes()).c_str(), d.index() < 0 ? "threads" : "streams",
              d.streams(), backends.empty() ? "-" : absl::StrJoin(backends, ", ").c_str());
  // Sorted for stable output (proto maps are unordered).
  std::vector<std::pair<std::string, int64_t>> rejected(d.rejected_jobs().begin(),
                                                        d.rejected_jobs().end());
  std::sort(rejected.begin(), rejected.end());
  int64_t rejected_total = 0;
  std::vector<std::string> reasons;
  for (const auto& [reason, count] : rejected) {
    rejected_total += count;
    reasons.push_back(absl::StrCat(reason, " ", count));
  }
  std::printf("    jobs: queued %lld, running %lld, completed %lld, rejected %lld%s\n",
              static_cast<long long>(d.queued_jobs()), static_cast<long long>(d.running_jobs()),
              static_cast<long long>(d.completed_jobs()), static_cast<long long>(rejected_total),
              reasons.empty() ? "" : absl::StrCat(" (", absl::StrJoin(reasons, ", "), ")").c_str());
}

}  // namespace

int RunInfo() {
  absl::StatusOr<std::unique_ptr<Client>> client = MakeClient();
  if (!client.ok()) return ReportError(client.status(), kExitUsage);
  absl::StatusOr<v1::GetServerInfoResponse> info = (*client)->GetServerInfo();
  if (!info.ok()) return ReportError(info.status(), kExitRpcError);

  std::vector<std::string> dtypes;
  for (int d : info->dtypes()) dtypes.push_back(DTypeName(static_cast<v1::DType>(d)));
  const v1::Limits& limits = info->limits();
  std::printf("dgmm server %s at %s\n", info->version().c_str(),
              ServerAddress().c_str());
  std::printf("default backend: %s\n", BackendName(info->default_backend()).c_str());
  std::printf("dtypes: %s\n", absl::StrJoin(dtypes, ", ").c_str());
  for (const v1::BackendCapabilities& c : info->capabilities()) {
    std::vector<std::string> types, sides;
    for (int d : c.dtypes()) types.push_back(DTypeName(static_cast<v1::DType>(d)));
    for (int s : c.sides()) {
      sides.push_back(s == v1::SIDE_LEFT    ? "left"
                      : s == v1::SIDE_RIGHT ? "right"
                      : s == v1::SIDE_BOTH  ? "both"
                                            : "other");
    }
    std::printf("backend %s: %s; sides %s\n", BackendName(c.backend()).c_str(),
                absl::StrJoin(types, ", ").c_str(), absl::StrJoin(sides, ", ").c_str());
  }
  std::printf("limits: unary message %s, stream block %s, max dim %lld, max queue %lld\n",
              FormatBytes(limits.max_unary_message_bytes()).c_str(),
              FormatBytes(limits.max_block_bytes()).c_str(),
              static_cast<long long>(limits.max_dim()), static_cast<long long>(limits.max_queue()));
  if (limits.auto_cpu_max_bytes() > 0) {
    std::printf("small jobs: backend auto runs jobs of up to %s on the CPU\n",
                FormatBytes(limits.auto_cpu_max_bytes()).c_str());
  }
  if (limits.regions_enabled()) {
    std::printf("regions: on, local socket %s, budget %s, %lld per owner, idle timeout %lld s\n",
                limits.local_socket().c_str(),
                FormatBytes(limits.region_budget_bytes()).c_str(),
                static_cast<long long>(limits.max_regions_per_client()),
                static_cast<long long>(limits.region_idle_timeout_s()));
  } else {
    std::printf("regions: off (the server runs without --allow_regions)\n");
  }
  std::printf("instance: %s\n", info->instance_id().c_str());
  std::printf("devices:\n");
  for (const v1::DeviceInfo& d : info->devices()) PrintDevice(d);
  return kExitOk;
}

int RunHealth() {
  absl::StatusOr<std::unique_ptr<Client>> client = MakeClient();
  if (!client.ok()) return ReportError(client.status(), kExitUsage);
  absl::StatusOr<HealthState> state = (*client)->Health(absl::GetFlag(FLAGS_service));
  if (!state.ok()) return ReportError(state.status(), kExitRpcError);
  std::printf("%s\n", grpc::health::v1::HealthCheckResponse::ServingStatus_Name(*state).c_str());
  return *state == grpc::health::v1::HealthCheckResponse::SERVING ? kExitOk : kExitRpcError;
}

}  // namespace dgmm::cli
