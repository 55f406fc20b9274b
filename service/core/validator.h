// The one request validator, shared by Multiply, MultiplyStream and
// MultiplyRegion (service/job/intake.h runs it): turns a
// wire JobHeader into a Problem, or says exactly what is wrong with it.
#ifndef DGMM_SERVICE_CORE_VALIDATOR_H_
#define DGMM_SERVICE_CORE_VALIDATOR_H_

#include <algorithm>
#include <cstdint>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/core/job_stats.h"
#include "service/core/problem.h"

namespace dgmm {

// Request limits a client cannot get around.
struct RequestLimits {
  // Largest rows or cols (RESOURCE_EXHAUSTED above it).
  int64_t max_dim = int64_t{1} << 20;
  // Largest payload of one MultiplyStream block.
  int64_t max_block_bytes = int64_t{4} << 20;
  // Largest Multiply request (--max_unary_message_bytes).
  int64_t max_unary_message_bytes = int64_t{16} << 20;
  // Most jobs in one MultiplyBatch request (--max_batch_jobs).
  int64_t max_batch_jobs = 4096;

  // Largest MultiplySmall request: gRPC reads a unary method's message whole
  // before the server sees it, so this one is kept small (the receive gate
  // bounds Multiply's instead).
  static constexpr int64_t kMaxSmallMessageBytes = int64_t{256} << 10;
  int64_t max_small_message_bytes() const {
    return std::min(kMaxSmallMessageBytes, max_unary_message_bytes);
  }
};

// A validated header: the problem, the diagonal (a view into the request,
// which must outlive it) and the backend hint (nullopt for BACKEND_AUTO).
struct JobRequest {
  Problem problem;
  // The diagonal (kBoth: the left one) and, for kBoth, the right one, in
  // problem.diag_dtype(), as sent.
  absl::string_view diagonal;
  absl::string_view right_diagonal;
  std::optional<BackendKind> backend;
  // Jobs on CUDA IPC regions: the GPU ordinal they must run on; -1: any.
  int gpu = -1;
  // JobHeader.group when set (one part of a striped job), validated.
  std::optional<JobGroup> group;
  // The call that asked for the job (set by the intake, not the header).
  JobCall call;
};

// The wire's name for a backend (JobStats.backend, GetServerInfo).
v1::Backend WireBackend(BackendKind b);

// Checks dims (positive, within max_dim), enums (known values), that
// rows*cols*element size fits in int64, and the diagonal's length for the
// side, and the job group when set (id of 1-64 characters of [A-Za-z0-9._-],
// first_line >= 0, first_line + lines <= total_lines, parts >= 1; the message
// names the field). INVALID_ARGUMENT for malformed headers, RESOURCE_EXHAUSTED for a shape
// over the limits. For streamed jobs it also checks that one line fits in a
// block.
// Where a job's diagonal is: in the header, or (MultiplyRegion) in a region,
// read once the header is valid; then the header's own diagonal must be
// empty and JobRequest::diagonal is left empty for the caller to fill.
enum class DiagonalIn { kHeader, kRegion };
absl::StatusOr<JobRequest> ValidateHeader(const v1::JobHeader& header,
                                          const RequestLimits& limits,
                                          bool streamed,
                                          DiagonalIn diagonal_in = DiagonalIn::kHeader);

// Checks that a whole-matrix payload has exactly matrix_bytes() bytes.
absl::Status ValidateMatrixPayload(const Problem& p, std::size_t payload_bytes);

// Follows the blocks of one MultiplyStream and enforces the protocol: blocks
// start where the previous one ended, hold whole lines, are not empty, not
// over max_block_bytes, and do not run past the last line.
class StreamAssembler {
 public:
  StreamAssembler(const Problem& p, int64_t max_block_bytes)
      : problem_(p), max_block_bytes_(max_block_bytes) {}

  // Accepts the next block; returns the number of whole lines it holds.
  absl::StatusOr<int64_t> Accept(int64_t first_line, std::size_t data_bytes);
  // INVALID_ARGUMENT for a block over max_block_bytes: checked before a
  // block is received into memory sized by it (Accept checks it too).
  absl::Status CheckSize(std::size_t data_bytes) const;
  // Called on the client's half-close: INVALID_ARGUMENT unless every line came.
  absl::Status Finish() const;

  int64_t lines_received() const { return next_line_; }
  bool complete() const { return next_line_ == problem_.lines(); }

 private:
  Problem problem_;
  int64_t max_block_bytes_;
  int64_t next_line_ = 0;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_VALIDATOR_H_
