// Helpers shared by the GPU benchmarks (gpu_bench, dtype_bench, ipc_vmm_bench).
#ifndef DGMM_BENCH_BENCH_KERNELS_H_
#define DGMM_BENCH_BENCH_KERNELS_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <functional>

namespace dgmm::bench {

// Fills out[0, n) with values in ±[0.5, 2) from a hash of (seed, index):
// never zero, reproducible, and fast enough for gigabytes.
template <typename T>
cudaError_t FillRandom(T* out, int64_t n, uint64_t seed, cudaStream_t stream);

// Reads bytes [0, 16·vectors) of `in` once, 16 bytes per access (a read-only
// pass: the read half of a copy).
cudaError_t ReadOnce(const void* in, int64_t vectors, int multiprocessors, cudaStream_t stream);

// Writes 16·vectors bytes of `out` once, 16 bytes per access, values that
// vary with the position (the write half of a copy).
cudaError_t WriteOnce(void* out, int64_t vectors, int multiprocessors, cudaStream_t stream);

// Times `enqueue` on `stream` with CUDA events: 3 warm-up runs, then `reps`
// timed ones; *median_ms is their median in milliseconds. The first CUDA
// error, if any.
cudaError_t MedianEventMs(cudaStream_t stream, int reps, const std::function<void()>& enqueue,
                          double* median_ms);

}  // namespace dgmm::bench

#endif  // DGMM_BENCH_BENCH_KERNELS_H_
