// Shared helpers for the GPU engine's tests: random matrices that are never
// zero, an independent float64 reference that works on the user's view
// (rows, columns, layout, side) rather than the engine's normalized lines,
// NaN poisoning of outputs, and a per-options cache of opened devices.
#ifndef DGMM_TESTS_GPU_GPU_TEST_UTIL_H_
#define DGMM_TESTS_GPU_GPU_TEST_UTIL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "service/backends/cuda/cuda_device.h"
#include "service/core/problem.h"

namespace dgmm::testing {

// Bytes of `count` elements of `t` filled with values in ±[0.5, 2), from a
// generator seeded with `seed`.
std::vector<std::byte> RandomElements(DType t, int64_t count, uint64_t seed);

// `count` elements of `t`, all NaN.
std::vector<std::byte> NaNElements(DType t, int64_t count);

// Largest |got - want| / |want| over the matrix, where want is computed in
// float64 from `a` and `d` by the definition: C[r][c] = A[r][c] · d[c] for
// side RIGHT and d[r] · A[r][c] for LEFT, elements addressed by layout. NaN
// anywhere in `got` yields +infinity.
double MaxRelativeError(const Problem& p, const std::byte* a,
                        const std::byte* d, const std::byte* got);

// Tolerance for MaxRelativeError: one rounding of the element type.
double Tolerance(DType t);

// An opened GPU for `options`, shared by all tests of the process that ask for
// the same options (devices are never closed: the process ends first). Null
// when the machine has no usable GPU; `why` then says why.
cuda::CudaDevice* SharedDevice(const CudaOptions& options, std::string* why);

// Message the tests skip with when there is no GPU; ctest recognizes it.
inline constexpr char kNoGpuSkip[] = "dgmm-gpu-skip: no CUDA device: ";

}  // namespace dgmm::testing

#endif  // DGMM_TESTS_GPU_GPU_TEST_UTIL_H_
