// dgmm's one logging approach: timestamped lines on stderr. (This Abseil
// predates absl/log; gRPC's own logging stays gRPC's.)
#ifndef DGMM_SERVICE_UTIL_LOG_H_
#define DGMM_SERVICE_UTIL_LOG_H_

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dgmm {

template <typename... Args>
void LogInfo(const Args&... args) {
  const std::string line = absl::StrCat(
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ ", absl::Now(), absl::UTCTimeZone()),
      "dgmm: ", args..., "\n");
  std::fputs(line.c_str(), stderr);
}

}  // namespace dgmm

#endif  // DGMM_SERVICE_UTIL_LOG_H_
