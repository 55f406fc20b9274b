// dgmm-cli's subcommands and what they share: exit codes, error printing and
// a Client built from the common flags (--server, --deadline, --chunk_bytes,
// --max_unary_message_bytes, --load_balancing_policy, --max_attempts, --tls*,
// --auth_token_file).
#ifndef DGMM_CLIENT_CPP_CLI_COMMANDS_H_
#define DGMM_CLIENT_CPP_CLI_COMMANDS_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/flags/declare.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dgmm/client.h"

ABSL_DECLARE_FLAG(bool, quiet);
ABSL_DECLARE_FLAG(std::string, server);

namespace dgmm::cli {

// Process exit codes.
enum ExitCode : int {
  kExitOk = 0,
  // An RPC failed (or the server is not SERVING, or the output could not be written).
  kExitRpcError = 1,
  // Bad flags or arguments, or an input file that cannot be used.
  kExitUsage = 2,
  // --check found an error above the tolerance.
  kExitCheckFailed = 3,
};

// Prints "error: <CODE>: <message>" to stderr and returns `exit_code`.
int ReportError(const absl::Status& status, int exit_code);

// The address dgmm-cli talks to when --server is not given.
inline constexpr char kDefaultServer[] = "127.0.0.1:50051";

// The client's address for a server listening on `listen` (its --listen or
// DGMM_LISTEN): a wildcard host (0.0.0.0, [::], empty) becomes the loopback
// address of the same family, with the same port ("0.0.0.0:50061" ->
// "127.0.0.1:50061"); any other address is used as it is; empty gives
// kDefaultServer.
std::string ServerFromListen(absl::string_view listen);

// --server if given, else ServerFromListen($DGMM_LISTEN). So a health probe
// inside the server's container follows the port it was configured with.
std::string ServerAddress();

// A client for ServerAddress() with the common flags applied; INVALID_ARGUMENT for
// a flag value that does not parse or a file (--tls_*, --auth_token_file)
// that cannot be read. `stripes`: ClientOptions.stripes (multiply --stripes).
// `same_host`: ClientOptions.same_host (the same-host path of Multiply).
absl::StatusOr<std::unique_ptr<Client>> MakeClient(int stripes = 0, bool same_host = false,
                                                   bool process_memory = true);

// Lower-case names without the enum prefix: "cuda_kernel", "float32".
std::string BackendName(v1::Backend backend);
std::string DTypeName(v1::DType dtype);

// "1.5 GiB", "512 B", ...
std::string FormatBytes(int64_t bytes);

// Subcommands; each returns the process exit code.
int RunMultiply();
int RunInfo();
int RunHealth();

}  // namespace dgmm::cli

#endif  // DGMM_CLIENT_CPP_CLI_COMMANDS_H_
