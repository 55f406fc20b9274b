// The diagonal-product kernel: one template for both element types and both
// scaling modes. What is computed (DiagScale, a functor) is kept apart from
// how it is launched (LaunchPolicy, chosen in ChooseLaunchPolicy); Dispatch
// is the only place that knows both.
#include <algorithm>
#include <cstdint>

#include "service/backends/cuda/dgmm_kernel.h"

namespace dgmm::cuda {
namespace {

constexpr int kBlockThreads = 256;
// Blocks per SM beyond which the grid-stride loop takes over (a 4 GB f32
// tile still gets one pass at 132 SMs).
constexpr int kMaxBlocksPerSm = 8192;
constexpr int kVectorBytes = 16;

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// Scales one vector of kVec elements that lies within one line. `line` is the
// line index within the tile, `pos` the element position within the line.
template <typename T, bool kPerLine>
struct DiagScale {
  const T* diag;

  template <int kVec>
  __device__ __forceinline__ void operator()(Vec<T, kVec>& x, int64_t line,
                                             int64_t pos) const {
    if constexpr (kPerLine) {
      const T s = __ldg(diag + line);
#pragma unroll
      for (int k = 0; k < kVec; ++k) x.v[k] *= s;
    } else {
      const Vec<T, kVec> s = *reinterpret_cast<const Vec<T, kVec>*>(diag + pos);
#pragma unroll
      for (int k = 0; k < kVec; ++k) x.v[k] *= s.v[k];
    }
  }
};

// How far one step moves a vector index, as whole lines and a remainder, so
// that the kernel advances (line, position) by addition with carry and
// divides only once per thread. Computed on the host at launch.
struct Step {
  int64_t lines;
  int64_t rem;
};

struct Walk {
  int64_t vectors;           // vectors in the tile
  int64_t vectors_per_line;  // line_len / kVec
  Step thread_step;          // blockDim.x vectors
  Step grid_step;            // blockDim.x * kItems * gridDim.x vectors
};

__device__ __forceinline__ void Advance(int64_t& line, int64_t& pos, Step s,
                                        int64_t per_line) {
  pos += s.rem;
  line += s.lines;
  if (pos >= per_line) {
    pos -= per_line;
    ++line;
  }
}

// Grid-stride over the tile as vectors of kVec elements (line_len is a
// multiple of kVec, so no vector straddles two lines). Each thread handles
// kItems vectors per step, blockDim.x apart, loading all before storing any.
template <typename T, int kVec, int kItems, typename Op>
__global__ void __launch_bounds__(kBlockThreads)
    DgmmKernel(const T* in, T* out, Walk w, Op op) {
  using V = Vec<T, kVec>;
  const V* vin = reinterpret_cast<const V*>(in);
  V* vout = reinterpret_cast<V*>(out);
  const int64_t threads = blockDim.x;
  const int64_t grid_step = threads * kItems * gridDim.x;

  int64_t i = static_cast<int64_t>(blockIdx.x) * threads * kItems + threadIdx.x;
  if (i >= w.vectors) return;
  int64_t line, pos;
  if (i <= UINT32_MAX && w.vectors_per_line <= UINT32_MAX) {  // cheap division
    const uint32_t q =
        static_cast<uint32_t>(i) / static_cast<uint32_t>(w.vectors_per_line);
    line = q;
    pos = i - int64_t{q} * w.vectors_per_line;
  } else {
    line = i / w.vectors_per_line;
    pos = i - line * w.vectors_per_line;
  }
  for (; i < w.vectors; i += grid_step) {
    V x[kItems];
    int64_t lines[kItems];
    int64_t positions[kItems];
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      lines[k] = k == 0 ? line : lines[k - 1];
      positions[k] = k == 0 ? pos : positions[k - 1];
      if (k > 0)
        Advance(lines[k], positions[k], w.thread_step, w.vectors_per_line);
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = i + k * threads;
      if (j < w.vectors) x[k] = vin[j];
    }
#pragma unroll
    for (int k = 0; k < kItems; ++k) {
      const int64_t j = i + k * threads;
      if (j < w.vectors) {
        op(x[k], lines[k], positions[k] * kVec);
        vout[j] = x[k];
      }
    }
    Advance(line, pos, w.grid_step, w.vectors_per_line);
  }
}

Step Split(int64_t vectors, int64_t per_line) {
  return Step{vectors / per_line, vectors % per_line};
}

bool Aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kVectorBytes == 0;
}

template <typename T, int kVec, int kItems, bool kPerLine>
cudaError_t LaunchShape(const DeviceTile<T>& tile, const LaunchPolicy& policy,
                        cudaStream_t stream) {
  const int64_t per_line = tile.line_len / kVec;
  const int64_t threads = policy.block_threads;
  const Walk walk{
      .vectors = tile.lines * per_line,
      .vectors_per_line = per_line,
      .thread_step = Split(threads, per_line),
      .grid_step = Split(threads * kItems * policy.grid_blocks, per_line)};
  DgmmKernel<T, kVec, kItems>
      <<<policy.grid_blocks, policy.block_threads, 0, stream>>>(
          tile.in, tile.out, walk, DiagScale<T, kPerLine>{tile.diag});
  return cudaGetLastError();
}

template <typename T, int kVec, int kItems>
cudaError_t DispatchMode(const DeviceTile<T>& tile, const LaunchPolicy& policy,
                         cudaStream_t stream) {
  return tile.per_line
             ? LaunchShape<T, kVec, kItems, true>(tile, policy, stream)
             : LaunchShape<T, kVec, kItems, false>(tile, policy, stream);
}

template <typename T, int kVec>
cudaError_t DispatchItems(const DeviceTile<T>& tile, const LaunchPolicy& policy,
                          cudaStream_t stream) {
  switch (policy.items_per_thread) {
    case 1:
      return DispatchMode<T, kVec, 1>(tile, policy, stream);
    case 2:
      return DispatchMode<T, kVec, 2>(tile, policy, stream);
    case 4:
      return DispatchMode<T, kVec, 4>(tile, policy, stream);
    default:
      return cudaErrorInvalidConfiguration;
  }
}

}  // namespace

template <typename T>
LaunchPolicy ChooseLaunchPolicy(const DeviceTile<T>& tile,
                                int multiprocessors) {
  constexpr int kFullVector = kVectorBytes / sizeof(T);
  const bool vectorizable = tile.line_len % kFullVector == 0 &&
                            Aligned(tile.in) && Aligned(tile.out) &&
                            (tile.per_line || Aligned(tile.diag));
  LaunchPolicy policy;
  policy.block_threads = kBlockThreads;
  policy.vector_width = vectorizable ? kFullVector : 1;
  // Measured on an H200 (bench/results, launch-policy sweep): one vector per
  // thread and a grid that covers the tile in one pass beat fewer, longer-
  // lived blocks by 5-8% at N = 16384 (the block scheduler evens out the
  // tail better than a grid-stride loop). The loop stays for tiles past the
  // cap.
  policy.items_per_thread = vectorizable ? 1 : 4;
  const int64_t vectors = tile.lines * tile.line_len / policy.vector_width;
  const int64_t per_block = int64_t{kBlockThreads} * policy.items_per_thread;
  const int64_t needed = (vectors + per_block - 1) / per_block;
  const int64_t cap = int64_t{std::max(multiprocessors, 1)} * kMaxBlocksPerSm;
  policy.grid_blocks =
      static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
  return policy;
}

template <typename T>
cudaError_t LaunchDgmmKernel(const DeviceTile<T>& tile,
                             const LaunchPolicy& policy, cudaStream_t stream) {
  if (tile.lines <= 0 || tile.line_len <= 0) return cudaSuccess;
  constexpr int kFullVector = kVectorBytes / sizeof(T);
  if (policy.vector_width == kFullVector) {
    return DispatchItems<T, kFullVector>(tile, policy, stream);
  }
  if (policy.vector_width == 1)
    return DispatchItems<T, 1>(tile, policy, stream);
  return cudaErrorInvalidConfiguration;
}

template <typename T>
cudaError_t LaunchDgmmKernel(const DeviceTile<T>& tile, int multiprocessors,
                             cudaStream_t stream) {
  return LaunchDgmmKernel(tile, ChooseLaunchPolicy(tile, multiprocessors),
                          stream);
}

template LaunchPolicy ChooseLaunchPolicy<float>(const DeviceTile<float>&, int);
template LaunchPolicy ChooseLaunchPolicy<double>(const DeviceTile<double>&,
                                                 int);
template cudaError_t LaunchDgmmKernel<float>(const DeviceTile<float>&,
                                             const LaunchPolicy&, cudaStream_t);
template cudaError_t LaunchDgmmKernel<double>(const DeviceTile<double>&,
                                              const LaunchPolicy&,
                                              cudaStream_t);
template cudaError_t LaunchDgmmKernel<float>(const DeviceTile<float>&, int,
                                             cudaStream_t);
template cudaError_t LaunchDgmmKernel<double>(const DeviceTile<double>&, int,
                                              cudaStream_t);

}  // namespace dgmm::cuda
