// What a job reports of itself, as plain values: where it ran, how long each
// stage took, its bytes, and the striped job it is a part of. The RPC layer
// writes it into the wire's JobStats (service/rpc/wire_stats.h).
#ifndef DGMM_SERVICE_CORE_JOB_STATS_H_
#define DGMM_SERVICE_CORE_JOB_STATS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "proto/trace_context.h"
#include "service/core/problem.h"

namespace dgmm {

// One part of a striped job (JobHeader.group), validated.
struct JobGroup {
  std::string id;
  int64_t first_line = 0;
  int64_t total_lines = 0;
  int parts = 0;
};

// The trace context a job's call carried (docs/protocol.md, "Trace
// context"): the caller's trace id, span (the server's parent) and flags,
// and the span the server gave the call.
struct JobTrace {
  TraceContext parent;
  SpanId span_id{};
};

// Who asked for a job and through which RPC, for its log line and stats
// (service/engine/job_log.h).
struct JobCall {
  const char* method = "";  // "Multiply", "MultiplyStream", ... (a static string)
  std::string client{};     // the fair share's client: a peer address, token@address
  std::optional<JobTrace> trace{};  // nullopt: the call carried none
};

struct JobStats {
  std::optional<BackendKind> backend;  // nullopt: no backend ran it (the Echo bench)
  std::string device;                  // "cpu (16 threads)", "cuda:0 NVIDIA H200", "echo"
  int device_index = -1;               // -1: the CPU
  // Nanoseconds waiting for admission, copying host to device, in the
  // multiply, copying device to host, and from arrival to the result ready.
  int64_t queue_wait_ns = 0, h2d_ns = 0, compute_ns = 0, d2h_ns = 0, total_ns = 0;
  int64_t bytes_in = 0, bytes_out = 0;  // payload received and sent
  uint64_t job_id = 0;
  std::optional<JobGroup> group;
  std::optional<JobTrace> trace;  // the call's (JobCall::trace)
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_JOB_STATS_H_
