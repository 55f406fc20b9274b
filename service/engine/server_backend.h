// Flag types of dgmm-server that only the server has (sizes and budgets are
// util/flag_types.h). Parsed and checked when the command line is read.
#ifndef DGMM_SERVICE_ENGINE_SERVER_BACKEND_H_
#define DGMM_SERVICE_ENGINE_SERVER_BACKEND_H_

#include <string>

#include "absl/strings/string_view.h"

namespace dgmm {

// --backend: where jobs that leave the choice to the server run.
enum class ServerBackend { kAuto, kCpu, kCuda, kCudaKernel, kCublas };

// Parse accepts auto, cpu, cuda, cuda-kernel and cublas; anything else is an
// error listing them.
// Unparse writes those names back.
bool AbslParseFlag(absl::string_view text, ServerBackend* backend, std::string* error);
std::string AbslUnparseFlag(ServerBackend backend);

}  // namespace dgmm

#endif  // DGMM_SERVICE_ENGINE_SERVER_BACKEND_H_
