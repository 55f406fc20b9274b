// Device-side helpers for gpu_bench: random fill on the GPU, so that large
// inputs need not cross PCIe before the timings start.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

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

// Four independent 16-byte loads in flight per thread; the sum is stored only
// under a condition the data never meets, so the loads cannot be dropped.
__global__ void ReadKernel(const float4* in, int64_t n, float* sink) {
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  float acc = 0;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const float4 a = in[i], b = in[i + stride], c = in[i + 2 * stride], d = in[i + 3 * stride];
    acc += (a.x + b.y) + (c.z + d.w);
  }
  for (; i < n; i += stride) acc += in[i].x;
  if (acc == 1.2345e-30f) *sink = acc;
}

__global__ void WriteKernel(float4* out, int64_t n) {
  const int64_t stride = int64_t{blockDim.x} * gridDim.x;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += stride) {
    const float v = static_cast<float>(i);
    out[i] = make_float4(v, v + 0.25f, v + 0.5f, v + 0.75f);
  }
}

__device__ float g_sink;

}  // namespace

cudaError_t ReadOnce(const void* in, int64_t vectors, int multiprocessors, cudaStream_t stream) {
  float* sink = nullptr;
  if (cudaError_t e = cudaGetSymbolAddress(reinterpret_cast<void**>(&sink), g_sink);
      e != cudaSuccess) {
    return e;
  }
  ReadKernel<<<multiprocessors * 8, 256, 0, stream>>>(static_cast<const float4*>(in), vectors,
                                                       sink);
  return cudaGetLastError();
}

cudaError_t WriteOnce(void* out, int64_t vectors, int multiprocessors, cudaStream_t stream) {
  WriteKernel<<<multiprocessors * 8, 256, 0, stream>>>(static_cast<float4*>(out), vectors);
  return cudaGetLastError();
}

template <typename T>
cudaError_t FillRandom(T* out, int64_t n, uint64_t seed, cudaStream_t stream) {
  FillKernel<T><<<1024, 256, 0, stream>>>(out, n, seed);
  return cudaGetLastError();
}

template cudaError_t FillRandom<float>(float*, int64_t, uint64_t, cudaStream_t);
template cudaError_t FillRandom<double>(double*, int64_t, uint64_t,
                                        cudaStream_t);

cudaError_t MedianEventMs(cudaStream_t stream, int reps, const std::function<void()>& enqueue,
                          double* median_ms) {
  cudaEvent_t a = nullptr, b = nullptr;
  cudaError_t err = cudaEventCreate(&a);
  if (err == cudaSuccess) err = cudaEventCreate(&b);
  for (int i = 0; err == cudaSuccess && i < 3; ++i) enqueue();
  if (err == cudaSuccess) err = cudaStreamSynchronize(stream);
  std::vector<double> ms;
  for (int i = 0; err == cudaSuccess && i < reps; ++i) {
    err = cudaEventRecord(a, stream);
    if (err != cudaSuccess) break;
    enqueue();
    err = cudaEventRecord(b, stream);
    if (err == cudaSuccess) err = cudaEventSynchronize(b);
    float t = 0;
    if (err == cudaSuccess) err = cudaEventElapsedTime(&t, a, b);
    ms.push_back(t);
  }
  if (a != nullptr) cudaEventDestroy(a);
  if (b != nullptr) cudaEventDestroy(b);
  if (err != cudaSuccess) return err;
  if (ms.empty()) return cudaErrorInvalidValue;
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  *median_ms = n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2]);
  return cudaSuccess;
}

}  // namespace dgmm::bench
