// Command-line parsing for dgmm-cli with exit codes under its control.
//
// absl::ParseCommandLine exits with status 1 on a bad flag; dgmm-cli reserves
// 1 for RPC errors and uses 2 for usage errors, so it parses argv itself
// against the registered Abseil flags. `--max-queue` and `--max_queue` are
// the same flag (dgmm::NormalizeFlagNames in util/flag_names.h, shared with
// dgmm-server).
#ifndef DGMM_CLIENT_CPP_CLI_COMMAND_LINE_H_
#define DGMM_CLIENT_CPP_CLI_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dgmm::cli {

struct CommandLine {
  // Arguments that are not flags, in order (argv[0] excluded).
  std::vector<std::string> positional;
  // True when --help, -h or `help` was given.
  bool help = false;
};

// Sets every flag given in argv (forms: --name=value, --name value, --name
// and --noname for booleans; one or two leading dashes; everything after a
// bare "--" is positional). INVALID_ARGUMENT naming the flag for an unknown
// flag, a missing value or a value that does not parse.
absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv);

}  // namespace dgmm::cli

#endif  // DGMM_CLIENT_CPP_CLI_COMMAND_LINE_H_
