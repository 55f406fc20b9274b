// dgmm's one logging approach: timestamped lines on stderr. (This Abseil
// predates absl/log; gRPC's own logging stays gRPC's.)
#ifndef DGMM_SERVICE_CORE_LOG_H_
#define DGMM_SERVICE_CORE_LOG_H_

#include <cstdio>
#include <cstdlib>
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

// DGMM_TRACE_JOBS=1 in the server's environment: a "trace:" line per job
// with its host-side phases (the CUDA job context's; a region job's from the
// call's arrival to its reply), read by bench/pinned_region_timeline.py and
// bench/small_region_job_bench.py.
inline bool TraceJobs() {
  static const bool on = [] {
    const char* v = std::getenv("DGMM_TRACE_JOBS");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_LOG_H_
