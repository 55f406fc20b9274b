#include "service/engine/server_backend.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dgmm {
namespace {

constexpr std::pair<ServerBackend, absl::string_view> kBackendNames[] = {
    {ServerBackend::kAuto, "auto"},     {ServerBackend::kCpu, "cpu"},
    {ServerBackend::kCuda, "cuda"},     {ServerBackend::kCudaKernel, "cuda-kernel"},
    {ServerBackend::kCublas, "cublas"},
};

}  // namespace

bool AbslParseFlag(absl::string_view text, ServerBackend* backend, std::string* error) {
  for (const auto& [value, name] : kBackendNames) {
    if (text == name) {
      *backend = value;
      return true;
    }
  }
  *error = absl::StrCat("'", text,
                        "' is not a backend; expected auto, cpu, cuda, cuda-kernel or cublas");
  return false;
}

std::string AbslUnparseFlag(ServerBackend backend) {
  for (const auto& [value, name] : kBackendNames) {
    if (value == backend) return std::string(name);
  }
  return "auto";
}

}  // namespace dgmm
