// The checks a job passes before it is admitted, in one order for every RPC
// that carries a job. kSteps in intake.cc is the one place that order is
// written; dgmm.proto states it for each RPC.
//
//   1. served   the RPC takes this request at all: a Multiply message within
//               --max_unary_message_bytes; regions on (--allow_regions) for
//               MultiplyRegion
//   2. header   the request decodes, and its JobHeader is valid (validator.h)
//   3. sources  MultiplyRegion: its matrix and result refs are set, name the
//               caller's regions (NOT_FOUND otherwise) and are of one kind;
//               a diagonal region is shared memory. Or both name addresses
//               in the caller's process, with the diagonal inline, and its
//               session has process memory (FAILED_PRECONDITION otherwise)
//   4. fits     the job could ever fit the budgets (too_large)
//   5. payload  Multiply: the matrix has exactly the header's bytes;
//               MultiplyRegion: each span lies within its region, aligned,
//               and the result is the matrix or apart from it; the diagonal
//               is read from its region. Process memory: the addresses are
//               aligned, do not wrap, and the result is the matrix or apart
// MultiplyStream's blocks are checked as they come (StreamAssembler).
//
// A refusal is counted once, here (JobMetrics::Refused), with its job
// group when the header was valid. gRPC-free (tests/layering).
#ifndef DGMM_SERVICE_JOB_INTAKE_H_
#define DGMM_SERVICE_JOB_INTAKE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/engine/engine.h"
#include "service/core/validator.h"
#include "service/regions/region_registry.h"

namespace dgmm {

enum class JobKind { kUnary, kStream, kRegion };

// A job request as the RPC layer decoded it.
struct JobDraft {
  JobKind kind = JobKind::kUnary;
  // Whether the request decoded (the RPC layer's wire format); when not OK
  // the header step returns it.
  absl::Status decoded;
  // The header, when decoded. kRegion: the request's.
  const v1::JobHeader* header = nullptr;
  // kUnary: the request message's size and its matrix payload's, and
  // whether it came with MultiplySmall (its own message limit).
  int64_t message_bytes = 0;
  bool small = false;
  // kUnary: the RPC's name in a refusal, and what a request over
  // --max_unary_message_bytes is told to do instead.
  const char* method = "Multiply";
  const char* too_large_advice = "send it with MultiplyStream";
  int64_t matrix_bytes = 0;
  // kRegion: the request and the caller's key in the registry, and the
  // caller's own memory when its session was granted it (process_memory.h).
  const v1::MultiplyRegionRequest* region = nullptr;
  std::string owner;
  std::shared_ptr<const ProcessMemory> process_memory;
  // Who asked and through which RPC (JobSession::Call): the job's
  // JobRequest::call once its header is valid.
  JobCall call;
};

// What passed: the job to Start, its mode and, for a region job, its spans.
// Not movable: job.diagonal may point into `diagonal`.
struct IntakenJob {
  IntakenJob() = default;
  IntakenJob(const IntakenJob&) = delete;
  IntakenJob& operator=(const IntakenJob&) = delete;

  JobRequest job;
  JobMode mode = JobMode::kWhole;
  // kRegion: the regions (held while the job runs) and the spans in them;
  // or, for a job in the client's own memory, that memory (then `in` and
  // `out` are addresses in the client process, and the regions are null).
  std::shared_ptr<Region> matrix, result, diagonal_region, right_region;
  std::shared_ptr<const ProcessMemory> process_memory;
  const std::byte* in = nullptr;
  std::byte* out = nullptr;
  // Diagonals read out of regions (SIDE_BOTH: the left and the right one).
  std::string diagonal, right_diagonal;
};

// FAILED_PRECONDITION: the region RPCs on a server without --allow_regions.
absl::Status RegionsOffError();

class Intake {
 public:
  // `engine` (and `regions`, null when regions are off) must outlive it.
  Intake(Engine* engine, const RegionRegistry* regions) : engine_(engine), regions_(regions) {}

  // Runs the steps in order; the first failure is counted and returned.
  absl::Status Check(const JobDraft& draft, IntakenJob* out) const;

 private:
  absl::Status Served(const JobDraft& d, IntakenJob* out) const;
  absl::Status Header(const JobDraft& d, IntakenJob* out) const;
  absl::Status Sources(const JobDraft& d, IntakenJob* out) const;
  absl::Status Fits(const JobDraft& d, IntakenJob* out) const;
  absl::Status ProcessSources(const JobDraft& d, IntakenJob* out) const;
  absl::Status Payload(const JobDraft& d, IntakenJob* out) const;
  absl::Status RegionPayload(const v1::MultiplyRegionRequest& r, IntakenJob* out) const;

  using Step = absl::Status (Intake::*)(const JobDraft&, IntakenJob*) const;
  static const Step kSteps[];

  Engine* const engine_;
  const RegionRegistry* const regions_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_JOB_INTAKE_H_
