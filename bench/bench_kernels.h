// Device-side helpers for gpu_bench.
#ifndef DGMM_BENCH_BENCH_KERNELS_H_
#define DGMM_BENCH_BENCH_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>

namespace dgmm::bench {

// Fills out[0, n) with values in ±[0.5, 2) from a hash of (seed, index):
// never zero, reproducible, and fast enough for gigabytes.
template <typename T>
cudaError_t FillRandom(T* out, int64_t n, uint64_t seed, cudaStream_t stream);

}  // namespace dgmm::bench

#endif  // DGMM_BENCH_BENCH_KERNELS_H_
