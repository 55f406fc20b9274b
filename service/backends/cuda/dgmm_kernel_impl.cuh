// The diagonal-product kernel, as templates over the storage type read (TA),
// the storage type written (TC) and the scaling mode; included by the .cu
// files that instantiate it (dgmm_kernel.cu: float and double;
// dgmm_kernel_types.cu: half, bfloat16, complex; dgmm_kernel_mixed.cu: pairs
// where A is narrower than C). What is computed (ScaleOp, a functor) is kept
// apart from how it is launched (LaunchPolicy, chosen in ChooseScalePolicy);
// the Dispatch functions are the only place that knows both.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_DGMM_KERNEL_IMPL_CUH_
#define DGMM_SERVICE_BACKENDS_CUDA_DGMM_KERNEL_IMPL_CUH_

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "service/backends/cuda/dgmm_kernel.h"

namespace dgmm::cuda {
namespace impl {

constexpr int kBlockThreads = 256;
// Blocks per SM beyond which the grid-stride loop takes over (a 4 GB f32
// tile still gets one pass at 132 SMs).
constexpr int kMaxBlocksPerSm = 8192;
constexpr int kVectorBytes = 16;

// Elements per vector: 16 bytes of the wider of the two storage types.
template <typename TA, typename TC>
constexpr int kFullVector =
    kVectorBytes / static_cast<int>(sizeof(TA) > sizeof(TC) ? sizeof(TA) : sizeof(TC));

// A C wider than A (a promoted pair) runs its full vectors two per thread
// (one and two are built; dtype_bench times the other). Measured on an H200
// (dtype_bench, N = 10000, two-sided, bench/results/dtypes/h200_5d9ae3c/):
// against a copy of as many bytes, float32 -> float64 0.93 at one vector
// per thread, 0.98 at two, 0.97 at four; float16 -> float64 0.88 / 0.97 /
// 0.96; float16 -> complex128 0.82 / 0.95 / 0.91. Vectors of 32 bytes of C,
// or of 16 bytes of A, were slower at every count.
template <typename TA, typename TC>
constexpr bool kWidening = sizeof(TC) > sizeof(TA);
template <typename TA, typename TC>
constexpr int kFullItems = kWidening<TA, TC> ? 2 : 1;

// float and double, same type in and out: the launch-policy sweep's types,
// which get every items_per_thread; the others get the shapes
// ChooseScalePolicy picks (full vectors one per thread, or two for a
// promoted pair, with one and two built for those; scalars four).
template <typename TA, typename TC>
constexpr bool kEveryShape = std::is_same_v<TA, TC> &&
                             (std::is_same_v<TA, float> || std::is_same_v<TA, double>);

template <typename T, int kVec>
struct alignas(sizeof(T) * kVec) Vec {
  T v[kVec];
};

// The scaling modes: one diagonal per line or per position, or two (left
// applied first: out = (left · a) · right) with left per line or per position.
enum Mode { kLine, kPos, kLinePos, kPosLine };

template <typename K>
__device__ __forceinline__ K LoadScalar(const K* p) {
  if constexpr (std::is_same_v<K, float> || std::is_same_v<K, double>) {
    return __ldg(p);
  } else if constexpr (std::is_same_v<K, Complex64>) {
    const float2 v = __ldg(reinterpret_cast<const float2*>(p));
    return Complex64{v.x, v.y};
  } else {
    const double2 v = __ldg(reinterpret_cast<const double2*>(p));
    return Complex128{v.x, v.y};
  }
}

// Scales one vector of kVec elements that lies within one line. `line` is the
// line index within the tile, `pos` the element position within the line.
template <typename TA, typename TC, int kMode>
struct ScaleOp {
  using K = Compute<TC>;
  const K* left;
  const K* right;

  template <int kVec>
  __device__ __forceinline__ void operator()(const Vec<TA, kVec>& x, Vec<TC, kVec>& y,
                                             int64_t line, int64_t pos) const {
    if constexpr (kMode == kLine) {
      const K s = LoadScalar(left + line);
#pragma unroll
      for (int k = 0; k < kVec; ++k) y.v[k] = Narrow<TC>::From(Mul(s, Widen<K>::From(x.v[k])));
    } else if constexpr (kMode == kPos) {
      const Vec<K, kVec> s = *reinterpret_cast<const Vec<K, kVec>*>(left + pos);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        y.v[k] = Narrow<TC>::From(Mul(s.v[k], Widen<K>::From(x.v[k])));
    } else if constexpr (kMode == kLinePos) {
      const K l = LoadScalar(left + line);
      const Vec<K, kVec> r = *reinterpret_cast<const Vec<K, kVec>*>(right + pos);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        y.v[k] = Narrow<TC>::From(Mul(Mul(l, Widen<K>::From(x.v[k])), r.v[k]));
    } else {
      const Vec<K, kVec> l = *reinterpret_cast<const Vec<K, kVec>*>(left + pos);
      const K r = LoadScalar(right + line);
#pragma unroll
      for (int k = 0; k < kVec; ++k)
        y.v[k] = Narrow<TC>::From(Mul(Mul(l.v[k], Widen<K>::From(x.v[k])), r));
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
template <typename TA, typename TC, int kVec, int kItems, typename Op>
__global__ void __launch_bounds__(kBlockThreads)
    DgmmKernel(const TA* in, TC* out, Walk w, Op op) {
  using VI = Vec<TA, kVec>;
  using VO = Vec<TC, kVec>;
  const VI* vin = reinterpret_cast<const VI*>(in);
  VO* vout = reinterpret_cast<VO*>(out);
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
    VI x[kItems];
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
        VO y;
        op(x[k], y, lines[k], positions[k] * kVec);
        vout[j] = y;
      }
    }
    Advance(line, pos, w.grid_step, w.vectors_per_line);
  }
}

inline Step Split(int64_t vectors, int64_t per_line) {
  return Step{vectors / per_line, vectors % per_line};
}

inline bool Aligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// The tile with a lone diagonal moved to `left` (so that right != null means
// two-sided) and the mode it runs in.
template <typename TA, typename TC>
int Normalize(ScaleTile<TA, TC>& t) {
  if (t.left == nullptr && t.right != nullptr) {
    t.left = t.right;
    t.right = nullptr;
    t.left_per_line = !t.left_per_line;
  }
  if (t.right == nullptr) return t.left_per_line ? kLine : kPos;
  return t.left_per_line ? kLinePos : kPosLine;
}

template <typename TA, typename TC, int kVec, int kItems, int kMode>
cudaError_t LaunchShape(const ScaleTile<TA, TC>& tile, const LaunchPolicy& policy,
                        cudaStream_t stream) {
  const int64_t per_line = tile.line_len / kVec;
  const int64_t threads = policy.block_threads;
  const Walk walk{
      .vectors = tile.lines * per_line,
      .vectors_per_line = per_line,
      .thread_step = Split(threads, per_line),
      .grid_step = Split(threads * kItems * policy.grid_blocks, per_line)};
  DgmmKernel<TA, TC, kVec, kItems>
      <<<policy.grid_blocks, policy.block_threads, 0, stream>>>(
          tile.in, tile.out, walk, ScaleOp<TA, TC, kMode>{tile.left, tile.right});
  return cudaGetLastError();
}

template <typename TA, typename TC, int kVec, int kItems>
cudaError_t DispatchMode(const ScaleTile<TA, TC>& tile, int mode,
                         const LaunchPolicy& policy, cudaStream_t stream) {
  switch (mode) {
    case kLine:
      return LaunchShape<TA, TC, kVec, kItems, kLine>(tile, policy, stream);
    case kPos:
      return LaunchShape<TA, TC, kVec, kItems, kPos>(tile, policy, stream);
    case kLinePos:
      return LaunchShape<TA, TC, kVec, kItems, kLinePos>(tile, policy, stream);
    default:
      return LaunchShape<TA, TC, kVec, kItems, kPosLine>(tile, policy, stream);
  }
}

template <typename TA, typename TC, int kVec>
cudaError_t DispatchItems(const ScaleTile<TA, TC>& tile, int mode,
                          const LaunchPolicy& policy, cudaStream_t stream) {
  constexpr bool kAll = kEveryShape<TA, TC>;
  constexpr int kFull = kFullVector<TA, TC>;
  switch (policy.items_per_thread) {
    case 1:
      if constexpr (kAll || kVec == kFull)
        return DispatchMode<TA, TC, kVec, 1>(tile, mode, policy, stream);
      break;
    case 2:
      if constexpr (kAll || (kVec == kFull && kWidening<TA, TC>))
        return DispatchMode<TA, TC, kVec, 2>(tile, mode, policy, stream);
      break;
    case 4:
      if constexpr (kAll || kVec == 1)
        return DispatchMode<TA, TC, kVec, 4>(tile, mode, policy, stream);
      break;
    default:
      break;
  }
  return cudaErrorInvalidConfiguration;
}

}  // namespace impl

template <typename TA, typename TC>
LaunchPolicy ChooseScalePolicy(const ScaleTile<TA, TC>& tile_in, int multiprocessors) {
  using K = Compute<TC>;
  constexpr int kFull = impl::kFullVector<TA, TC>;
  ScaleTile<TA, TC> tile = tile_in;
  const int mode = impl::Normalize(tile);
  // The per-position diagonal is read as vectors of kFull compute-type
  // elements.
  const K* pos_diag = mode == impl::kLine      ? nullptr
                      : mode == impl::kLinePos ? tile.right
                                               : tile.left;
  const bool vectorizable =
      tile.line_len % kFull == 0 && impl::Aligned(tile.in, sizeof(TA) * kFull) &&
      impl::Aligned(tile.out, sizeof(TC) * kFull) &&
      (pos_diag == nullptr || impl::Aligned(pos_diag, sizeof(K) * kFull));
  LaunchPolicy policy;
  policy.block_threads = impl::kBlockThreads;
  policy.vector_width = vectorizable ? kFull : 1;
  // Measured on an H200 (bench/results/kernel/h200_6b105dd/gpu_bench.md, launch-policy sweep): one vector per
  // thread and a grid that covers the tile in one pass beat fewer, longer-
  // lived blocks by 5-8% at N = 16384 (the block scheduler evens out the
  // tail better than a grid-stride loop); promoted pairs take two (see
  // kFullItems). The loop stays for tiles past the cap.
  policy.items_per_thread = vectorizable ? impl::kFullItems<TA, TC> : 4;
  const int64_t vectors = tile.lines * tile.line_len / policy.vector_width;
  const int64_t per_block = int64_t{impl::kBlockThreads} * policy.items_per_thread;
  const int64_t needed = (vectors + per_block - 1) / per_block;
  const int64_t cap = int64_t{std::max(multiprocessors, 1)} * impl::kMaxBlocksPerSm;
  policy.grid_blocks = static_cast<int>(std::max<int64_t>(1, std::min(needed, cap)));
  return policy;
}

template <typename TA, typename TC>
cudaError_t LaunchScaleKernel(const ScaleTile<TA, TC>& tile_in, const LaunchPolicy& policy,
                              cudaStream_t stream) {
  if (tile_in.lines <= 0 || tile_in.line_len <= 0) return cudaSuccess;
  if (tile_in.left == nullptr && tile_in.right == nullptr) return cudaErrorInvalidValue;
  ScaleTile<TA, TC> tile = tile_in;
  const int mode = impl::Normalize(tile);
  constexpr int kFull = impl::kFullVector<TA, TC>;
  if (policy.vector_width == kFull) {
    return impl::DispatchItems<TA, TC, kFull>(tile, mode, policy, stream);
  }
  if constexpr (kFull != 1) {
    if (policy.vector_width == 1) return impl::DispatchItems<TA, TC, 1>(tile, mode, policy, stream);
  }
  return cudaErrorInvalidConfiguration;
}

template <typename TA, typename TC>
cudaError_t LaunchScaleKernel(const ScaleTile<TA, TC>& tile, int multiprocessors,
                              cudaStream_t stream) {
  return LaunchScaleKernel(tile, ChooseScalePolicy(tile, multiprocessors), stream);
}

#define DGMM_INSTANTIATE_SCALE_KERNEL(TA, TC)                                         \
  template LaunchPolicy ChooseScalePolicy<TA, TC>(const ScaleTile<TA, TC>&, int);     \
  template cudaError_t LaunchScaleKernel<TA, TC>(const ScaleTile<TA, TC>&,            \
                                                 const LaunchPolicy&, cudaStream_t);  \
  template cudaError_t LaunchScaleKernel<TA, TC>(const ScaleTile<TA, TC>&, int, cudaStream_t)

}  // namespace dgmm::cuda

#endif  // DGMM_SERVICE_BACKENDS_CUDA_DGMM_KERNEL_IMPL_CUH_
