// Device-side helpers for gpu_bench: random fill on the GPU, so that large
// inputs need not cross PCIe before the timings start.
#include <cuda_runtime.h>

#include <cstdint>

#include "bench/bench_kernels.h"

namespace dgmm::bench {
namespace {

__device__ __forceinline__ uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

template <typename T>
__global__ void FillKernel(T* out, int64_t n, uint64_t seed) {
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n;
       i += stride) {
    const uint64_t h = Mix(seed ^ Mix(static_cast<uint64_t>(i)));
    const double u = static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);
    const double v = 0.5 + 1.5 * u;
    out[i] = static_cast<T>((h & 1) ? v : -v);
  }
}

}  // namespace

template <typename T>
cudaError_t FillRandom(T* out, int64_t n, uint64_t seed, cudaStream_t stream) {
  FillKernel<T><<<1024, 256, 0, stream>>>(out, n, seed);
  return cudaGetLastError();
}

template cudaError_t FillRandom<float>(float*, int64_t, uint64_t, cudaStream_t);
template cudaError_t FillRandom<double>(double*, int64_t, uint64_t,
                                        cudaStream_t);

}  // namespace dgmm::bench
