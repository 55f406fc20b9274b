// Fuzzes the one request validator with arbitrary wire bytes: whatever a
// client sends as a JobHeader, ValidateHeader either rejects it with
// INVALID_ARGUMENT / RESOURCE_EXHAUSTED or returns a problem whose sizes are
// consistent, within the limits and free of overflow; ValidateMatrixPayload
// accepts exactly matrix_bytes() bytes.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "dgmm/v1/dgmm.pb.h"
#include "service/core/validator.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

bool IsRejection(const absl::Status& s) {
  return s.code() == absl::StatusCode::kInvalidArgument ||
         s.code() == absl::StatusCode::kResourceExhausted;
}

void CheckAccepted(const dgmm::v1::JobHeader& header, const dgmm::JobRequest& job,
                   const dgmm::RequestLimits& limits, bool streamed) {
  const dgmm::Problem& p = job.problem;
  FUZZ_CHECK(p.rows == header.rows() && p.cols == header.cols());
  FUZZ_CHECK(p.rows >= 1 && p.cols >= 1);
  FUZZ_CHECK(p.rows <= limits.max_dim && p.cols <= limits.max_dim);
  FUZZ_CHECK(p.elem_size() == 2 || p.elem_size() == 4 || p.elem_size() == 8 || p.elem_size() == 16);
  // The result is NumPy's result type of A and d, or a type that widens
  // from it exactly (a stated result_dtype): A and d both widen into it,
  // and it is never narrower than A.
  const dgmm::DType promoted = dgmm::ResultType(p.dtype, p.diag_dtype());
  FUZZ_CHECK(dgmm::KernelSupports(promoted, p.out_dtype()));
  FUZZ_CHECK(dgmm::KernelSupports(p.dtype, p.out_dtype()));
  FUZZ_CHECK(dgmm::KernelSupports(p.diag_dtype(), p.out_dtype()));
  if (header.result_dtype() == dgmm::v1::DTYPE_UNSPECIFIED) FUZZ_CHECK(p.out_dtype() == promoted);
  FUZZ_CHECK(p.out_elem_size() >= p.elem_size());
  int64_t bytes = 0;
  FUZZ_CHECK(!__builtin_mul_overflow(p.rows, p.cols, &bytes));
  int64_t out_bytes = 0;
  FUZZ_CHECK(!__builtin_mul_overflow(bytes, static_cast<int64_t>(p.out_elem_size()), &out_bytes));
  FUZZ_CHECK(p.out_matrix_bytes() == out_bytes);
  FUZZ_CHECK(!__builtin_mul_overflow(bytes, static_cast<int64_t>(p.elem_size()), &bytes));
  FUZZ_CHECK(p.matrix_bytes() == bytes);
  FUZZ_CHECK(p.lines() * p.line_len() == p.rows * p.cols);
  FUZZ_CHECK(static_cast<int64_t>(job.diagonal.size()) == p.diag_bytes());
  FUZZ_CHECK(job.diagonal.data() == header.diagonal().data());
  FUZZ_CHECK(static_cast<int64_t>(job.right_diagonal.size()) == p.right_diag_bytes());
  FUZZ_CHECK(p.two_sided() == (header.side() == dgmm::v1::SIDE_BOTH));
  if (streamed) FUZZ_CHECK(p.line_bytes() <= limits.max_block_bytes);

  FUZZ_CHECK(dgmm::ValidateMatrixPayload(p, static_cast<std::size_t>(p.matrix_bytes())).ok());
  FUZZ_CHECK(!dgmm::ValidateMatrixPayload(p, static_cast<std::size_t>(p.matrix_bytes()) + 1).ok());
  FUZZ_CHECK(!dgmm::ValidateMatrixPayload(p, static_cast<std::size_t>(p.matrix_bytes()) - 1).ok());
  FUZZ_CHECK(!dgmm::ValidateMatrixPayload(p, std::numeric_limits<std::size_t>::max()).ok());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  dgmm::v1::JobHeader header;
  if (!header.ParseFromArray(data, static_cast<int>(size))) return 0;
  // The defaults, and a tiny server's limits so that every branch is near.
  const dgmm::RequestLimits limits[] = {
      dgmm::RequestLimits{},
      dgmm::RequestLimits{.max_dim = 64, .max_block_bytes = 64},
  };
  for (const dgmm::RequestLimits& l : limits) {
    for (bool streamed : {false, true}) {
      absl::StatusOr<dgmm::JobRequest> job = dgmm::ValidateHeader(header, l, streamed);
      if (job.ok()) {
        CheckAccepted(header, *job, l, streamed);
      } else {
        FUZZ_CHECK(IsRejection(job.status()));
        FUZZ_CHECK(!job.status().message().empty());
      }
    }
  }
  // Any payload length against a shape taken from the header, validated or
  // not: the message must be built without overflow or UB.
  dgmm::Problem p;
  p.rows = header.rows() & 0xffff;
  p.cols = header.cols() & 0xffff;
  p.dtype =
      header.dtype() == dgmm::v1::DTYPE_FLOAT64 ? dgmm::DType::kFloat64 : dgmm::DType::kFloat32;
  const absl::Status s = dgmm::ValidateMatrixPayload(p, size);
  FUZZ_CHECK(s.ok() == (static_cast<int64_t>(size) == p.matrix_bytes()));
  return 0;
}
