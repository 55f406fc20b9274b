// Local inputs and checks for `dgmm-cli multiply`: random operands and the
// float64 (complex128) reference the server's result is compared against.
#ifndef DGMM_CLIENT_CPP_CLI_REFERENCE_H_
#define DGMM_CLIENT_CPP_CLI_REFERENCE_H_

#include <cstdint>

#include "dgmm/client.h"

namespace dgmm::cli {

// Fills `count` elements of `dtype` at `data` with values uniform in
// [0.5, 2) (for the complex types, both parts; for float16 and bfloat16,
// uniform over the patterns of that range): non-zero, so relative errors are
// well defined. The values depend on `seed` alone, not on the machine: the
// array is cut into fixed pieces, each drawn from its own generator seeded
// from `seed` and the piece's index, on every core.
void FillUniform(v1::DType dtype, void* data, int64_t count, uint64_t seed);

// The largest |c - ref| / |ref| over all elements (|.| the complex modulus
// for the complex types), where ref is A·diag(d) (SIDE_RIGHT), diag(d)·A
// (SIDE_LEFT) or diag(l)·A·diag(r) (SIDE_BOTH: `diagonal` is l,
// `right_diagonal` r) computed in float64, or complex128 when A or d is
// complex, from the job's inputs (A of job.matrix.dtype, the diagonals of
// job.diagonal_dtype or A's), and c is `result` (A's shape and layout, of
// ResultDType(job)). Where ref is 0 the absolute error counts. NaN in the result gives
// infinity. Runs on every core.
double MaxRelativeError(const Job& job, const void* result);

// The tolerance for MaxRelativeError: a scaled element is exact to one
// rounding (two for SIDE_BOTH), so a few units in the last place of the
// dtype: 1e-6 for float32 and complex64, 1e-14 for float64 and complex128,
// 2e-3 for float16, 1.6e-2 for bfloat16.
double DefaultTolerance(v1::DType dtype);

}  // namespace dgmm::cli

#endif  // DGMM_CLIENT_CPP_CLI_REFERENCE_H_
