// Command-line conveniences shared by dgmm-server and dgmm-cli (the top-level
// util/ library, dgmm_util: neither service/ nor gRPC).
#ifndef DGMM_UTIL_FLAG_NAMES_H_
#define DGMM_UTIL_FLAG_NAMES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace dgmm {

// Abseil flag names are identifiers (`max_queue`); users type `--max-queue`.
// Returns argv with dashes inside flag names turned into underscores (the
// value after '=' is left alone). Arguments after a bare "--" are untouched.
std::vector<std::string> NormalizeFlagNames(int argc, char** argv);

// For every registered flag FOO that was not given on the command line, sets
// it from the environment variable `<prefix>FOO` (upper case) if present.
// Returns the names of flags set this way. Errors name the variable.
absl::StatusOr<std::vector<std::string>> ApplyFlagsFromEnv(
    absl::string_view prefix, const std::vector<std::string>& args);

// Parses the value of every argument in `args` (as NormalizeFlagNames returns
// them, argv[0] first) that gives a registered flag a value: `--name=value`,
// or `--name value` for a flag that is not a bool. The flags take those
// values, as absl::ParseCommandLine would set them. INVALID_ARGUMENT
// ("--name=value: why") for the first one that does not parse, so that a
// program can exit with its own status instead of absl's 1. Unknown flags,
// bare booleans and everything after a bare "--" are left for
// absl::ParseCommandLine.
absl::Status CheckFlagValues(const std::vector<std::string>& args);

// Parses a byte count: "1073741824", "512MiB", "1GiB", "64KiB", "2GB"
// (decimal units too). Errors say what was expected.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

// A budget: either an absolute byte count (ParseBytes) or a percentage
// "80%" of `base_bytes`.
absl::StatusOr<int64_t> ParseBudget(absl::string_view text, int64_t base_bytes);

}  // namespace dgmm

#endif  // DGMM_UTIL_FLAG_NAMES_H_
