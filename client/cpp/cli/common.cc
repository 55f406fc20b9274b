#include <cmath>
#include <cstdio>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "service/util/flag_names.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051",
          "Server address HOST:PORT, or any gRPC target such as dns:///dgmm.example:50051.");
ABSL_FLAG(double, deadline, 0,
          "Deadline of each RPC in seconds; 0 means none. An expired job fails with "
          "DEADLINE_EXCEEDED.");
ABSL_FLAG(std::string, chunk_bytes, "4MiB",
          "Largest block sent over MultiplyStream (whole rows or columns per block); at most "
          "the server's --max_block_bytes. Accepts 4194304, 4MiB, 1GiB, ...");
ABSL_FLAG(std::string, max_unary_message_bytes, "64MiB",
          "The server's --max_unary_message_bytes: no job over 7/8 of it is sent in one "
          "message.");
ABSL_FLAG(std::string, load_balancing_policy, "",
          "gRPC load-balancing policy, e.g. round_robin over a DNS name with several "
          "replicas; empty for gRPC's default.");
ABSL_FLAG(bool, quiet, false, "Print only errors (and what a subcommand exists to print).");

namespace dgmm::cli {

int ReportError(const absl::Status& status, int exit_code) {
  std::fprintf(stderr, "error: %s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  return exit_code;
}

absl::StatusOr<std::unique_ptr<Client>> MakeClient() {
  ClientOptions options;
  const double deadline = absl::GetFlag(FLAGS_deadline);
  if (deadline < 0 || !std::isfinite(deadline)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--deadline=", deadline, " must be a positive number of seconds (or 0)"));
  }
  if (deadline > 0) options.deadline = absl::Seconds(deadline);
  absl::StatusOr<int64_t> chunk = ParseBytes(absl::GetFlag(FLAGS_chunk_bytes));
  if (!chunk.ok())
    return absl::InvalidArgumentError(absl::StrCat("--chunk_bytes: ", chunk.status().message()));
  if (*chunk < 1) return absl::InvalidArgumentError("--chunk_bytes must be at least 1");
  options.chunk_bytes = *chunk;
  absl::StatusOr<int64_t> unary = ParseBytes(absl::GetFlag(FLAGS_max_unary_message_bytes));
  if (!unary.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_unary_message_bytes: ", unary.status().message()));
  }
  options.max_unary_message_bytes = *unary;
  options.load_balancing_policy = absl::GetFlag(FLAGS_load_balancing_policy);
  return std::make_unique<Client>(absl::GetFlag(FLAGS_server), std::move(options));
}

namespace {

// "BACKEND_CUDA_KERNEL" -> "cuda_kernel".
std::string ShortName(const std::string& enum_name, absl::string_view prefix) {
  std::string name = absl::AsciiStrToLower(enum_name);
  if (absl::StartsWith(enum_name, prefix)) name.erase(0, prefix.size());
  return name;
}

}  // namespace

std::string BackendName(v1::Backend backend) {
  return ShortName(v1::Backend_Name(backend), "BACKEND_");
}

std::string DTypeName(v1::DType dtype) { return ShortName(v1::DType_Name(dtype), "DTYPE_"); }

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

}  // namespace dgmm::cli
