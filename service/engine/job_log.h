// The job lines of the server's log: one line on stderr when a job ends,
// admitted or refused once its header was valid, naming the call that asked
// for it (RPC, client, trace context) and, for a part of a striped job, its
// group. Text (--log_format=text):
//
//   job 12: completed; method=Multiply client=127.0.0.1 trace=4bf9...36 parent=00f0...b7 span=5d1e...03
//   job 13 group 3f9c0a7e21d4b6c8 lines [0,2500) of 10000 (4 parts): completed; method=...
//   job 0: queue_full (RESOURCE_EXHAUSTED: ...); method=... trace=- parent=- span=-
//
// ("-": the call carried no trace context; job 0: refused before
// admission), or one JSON object per line (--log_format=json) with the
// same and the job's device, bytes and stage times (docs/operations.md,
// "Logs"). Parts of striped jobs are always logged; other jobs when
// EngineOptions::log_jobs (--log_jobs) is on.
#ifndef DGMM_SERVICE_ENGINE_JOB_LOG_H_
#define DGMM_SERVICE_ENGINE_JOB_LOG_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "service/core/job_stats.h"

namespace dgmm {

struct JobLogEntry {
  const JobCall* call = nullptr;           // null: not known (in-process callers)
  const std::optional<JobGroup>* group = nullptr;  // null or nullopt: not a part
  int64_t lines = 0;                       // the job's lines, for a part's range
  const JobStats* stats = nullptr;         // null: refused before admission
  absl::Status status{};
};

// The entry's line, without the newline, in `format`.
std::string JobLogText(const JobLogEntry& e);
std::string JobLogJson(const JobLogEntry& e);

// Writes the entry's line when `all_jobs` or the job is a part of a group.
void LogJob(const JobLogEntry& e, bool all_jobs);

}  // namespace dgmm

#endif  // DGMM_SERVICE_ENGINE_JOB_LOG_H_
