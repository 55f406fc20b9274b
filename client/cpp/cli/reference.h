// Local inputs and checks for `dgmm-cli multiply`: random operands and the
// float64 reference the server's result is compared against.
#ifndef DGMM_CLIENT_CPP_CLI_REFERENCE_H_
#define DGMM_CLIENT_CPP_CLI_REFERENCE_H_

#include <cstdint>
#include <random>

#include "dgmm/client.h"

namespace dgmm::cli {

// Fills `count` elements of `dtype` at `data` with values uniform in
// [0.5, 2): non-zero, so relative errors are well defined.
void FillUniform(v1::DType dtype, void* data, int64_t count, std::mt19937_64* rng);

// The largest |c - ref| / |ref| over all elements, where ref is A·diag(d)
// (SIDE_RIGHT) or diag(d)·A (SIDE_LEFT) computed in float64 from the job's
// inputs, and c is `result` (A's shape, dtype and layout). Where ref is 0 the
// absolute error counts. NaN in the result gives infinity.
double MaxRelativeError(const Job& job, const void* result);

// The tolerance for MaxRelativeError: a scaled element is exact to one
// rounding, so a few units in the last place of the dtype.
double DefaultTolerance(v1::DType dtype);

}  // namespace dgmm::cli

#endif  // DGMM_CLIENT_CPP_CLI_REFERENCE_H_
