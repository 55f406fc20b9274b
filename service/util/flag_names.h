// Command-line conveniences shared by dgmm-server and dgmm-cli.
#ifndef DGMM_SERVICE_UTIL_FLAG_NAMES_H_
#define DGMM_SERVICE_UTIL_FLAG_NAMES_H_

#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"
#include <vector>

#include "absl/status/statusor.h"

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

// Parses a byte count: "1073741824", "512MiB", "1GiB", "64KiB", "2GB"
// (decimal units too). Errors say what was expected.
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);

// A budget: either an absolute byte count (ParseBytes) or a percentage
// "80%" of `base_bytes`.
absl::StatusOr<int64_t> ParseBudget(absl::string_view text, int64_t base_bytes);

}  // namespace dgmm

#endif  // DGMM_SERVICE_UTIL_FLAG_NAMES_H_
