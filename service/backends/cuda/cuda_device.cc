#include "service/backends/cuda/cuda_device.h"

#include <cuda.h>
#include <fcntl.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "service/backends/cuda/cuda_job_context.h"
#include "service/backends/cuda/cuda_status.h"
#include "service/backends/cuda/dgmm_kernel.h"
#include "service/backends/cuda/driver_api.h"
#include "service/backends/cuda/tile_split.h"

namespace dgmm::cuda {

// ---------------------------------------------------------------- StagingRing

absl::StatusOr<std::unique_ptr<StagingRing>> StagingRing::Create(
    int count, int64_t bytes) {
  std::vector<std::byte*> buffers;
  for (int i = 0; i < count; ++i) {
    void* p = nullptr;
    const cudaError_t err =
        cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable);
    if (err != cudaSuccess) {
      for (std::byte* b : buffers) cudaFreeHost(b);
      return CudaStatus(err, absl::StrFormat("cudaHostAlloc(%d bytes)", bytes));
    }
    buffers.push_back(static_cast<std::byte*>(p));
  }
  return std::unique_ptr<StagingRing>(
      new StagingRing(std::move(buffers), bytes));
}

StagingRing::StagingRing(std::vector<std::byte*> buffers, int64_t bytes)
    : all_(buffers), bytes_(bytes), free_(std::move(buffers)) {}

StagingRing::~StagingRing() {
  for (std::byte* b : all_) cudaFreeHost(b);
}

std::vector<std::byte*> StagingRing::Acquire(int want) {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](std::vector<std::byte*>* f) { return !f->empty(); }, &free_));
  const int n =
      std::min<int>(std::max(want, 1), static_cast<int>(free_.size()));
  std::vector<std::byte*> taken(free_.end() - n, free_.end());
  free_.resize(free_.size() - n);
  return taken;
}

void StagingRing::Release(const std::vector<std::byte*>& buffers) {
  absl::MutexLock lock(&mu_);
  free_.insert(free_.end(), buffers.begin(), buffers.end());
}

// ----------------------------------------------------------------- CudaDevice

std::shared_ptr<HostBufferPool> NewPinnedBlockPool(int64_t max_cached_bytes) {
  return HostBufferPool::Create(
      "pinned host",
      [](int64_t bytes) -> absl::StatusOr<std::byte*> {
        void* p = nullptr;
        const cudaError_t err =
            cudaHostAlloc(&p, static_cast<size_t>(bytes), cudaHostAllocPortable);
        if (err != cudaSuccess) {
          cudaGetLastError();
          return CudaStatus(err, "cudaHostAlloc");
        }
        return static_cast<std::byte*>(p);
      },
      [](std::byte* data, int64_t) { cudaFreeHost(data); }, max_cached_bytes);
}

absl::StatusOr<std::unique_ptr<CudaDevice>> CudaDevice::Open(
    int ordinal, const CudaOptions& options, std::shared_ptr<HostBufferPool> blocks) {
  std::unique_ptr<CudaDevice> device(new CudaDevice());
  device->blocks_ = blocks != nullptr ? std::move(blocks) : NewPinnedBlockPool();
  if (auto st = device->Init(ordinal, options); !st.ok()) return st;
  return device;
}

absl::Status CudaDevice::Init(int ordinal, const CudaOptions& options) {
  ordinal_ = ordinal;
  tile_bytes_ = options.tile_bytes;
  const int copy_threads =
      std::clamp(static_cast<int>(std::thread::hardware_concurrency()) / 2, 1, 8);
  copy_pool_ = std::make_unique<ThreadPool>(copy_threads);
  copy_out_pool_ = std::make_unique<ThreadPool>(copy_threads);
  if (auto st = CudaStatus(cudaSetDevice(ordinal), "cudaSetDevice"); !st.ok()) {
    return st;
  }
  cudaDeviceProp prop{};
  if (auto st = CudaStatus(cudaGetDeviceProperties(&prop, ordinal),
                           "cudaGetDeviceProperties");
      !st.ok()) {
    return st;
  }
  name_ = prop.name;
  total_bytes_ = static_cast<int64_t>(prop.totalGlobalMem);
  multiprocessors_ = prop.multiProcessorCount;
  size_t free_bytes = 0, total = 0;
  if (auto st =
          CudaStatus(cudaMemGetInfo(&free_bytes, &total), "cudaMemGetInfo");
      !st.ok()) {
    return st;
  }
  free_at_start_ = static_cast<int64_t>(free_bytes);

  streams_.resize(options.streams, nullptr);
  cublas_.resize(options.streams, nullptr);
  for (int i = 0; i < options.streams; ++i) {
    if (auto st = CudaStatus(
            cudaStreamCreateWithFlags(&streams_[i], cudaStreamNonBlocking),
            "cudaStreamCreate");
        !st.ok()) {
      return st;
    }
    if (auto st = CublasStatus(cublasCreate(&cublas_[i]), "cublasCreate");
        !st.ok()) {
      return st;
    }
    if (auto st = CublasStatus(cublasSetStream(cublas_[i], streams_[i]),
                               "cublasSetStream");
        !st.ok()) {
      return st;
    }
  }
  if (auto st = CudaStatus(
          cudaStreamCreateWithFlags(&setup_stream_, cudaStreamNonBlocking),
          "cudaStreamCreate");
      !st.ok()) {
    return st;
  }

  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = ordinal;
  if (auto st =
          CudaStatus(cudaMemPoolCreate(&pool_, &props), "cudaMemPoolCreate");
      !st.ok()) {
    return st;
  }
  // Keep freed memory in the pool: jobs come and go, the pool stays warm.
  uint64_t keep = std::numeric_limits<uint64_t>::max();
  if (auto st = CudaStatus(cudaMemPoolSetAttribute(
                               pool_, cudaMemPoolAttrReleaseThreshold, &keep),
                           "cudaMemPoolSetAttribute");
      !st.ok()) {
    return st;
  }

  pieces_in_flight_ = options.pieces_in_flight > 0 ? options.pieces_in_flight
                                                   : 2 * options.streams;
  staging_count_ = options.staging_buffers > 0 ? options.staging_buffers
                                               : 2 * pieces_in_flight_;

  if (options.measure_backend_order) return OrderBackendsByTiming();
  return absl::OkStatus();
}

CudaDevice::~CudaDevice() {
  if (cudaSetDevice(ordinal_) != cudaSuccess) {
    cudaGetLastError();
    return;
  }
  for (cudaStream_t s : streams_) {
    if (s != nullptr) cudaStreamSynchronize(s);
  }
  if (setup_stream_ != nullptr) cudaStreamSynchronize(setup_stream_);
  {
    absl::MutexLock lock(&ring_mu_);
    ring_.reset();
  }
  for (cublasHandle_t h : cublas_) {
    if (h != nullptr) cublasDestroy(h);
  }
  for (cudaStream_t s : streams_) {
    if (s != nullptr) cudaStreamDestroy(s);
  }
  if (setup_stream_ != nullptr) cudaStreamDestroy(setup_stream_);
  if (pool_ != nullptr) cudaMemPoolDestroy(pool_);
  cudaGetLastError();
}

absl::Status CudaDevice::StagingCopy(std::byte* dst, const std::byte* src, int64_t bytes,
                                     const TileMemory* memory, bool into_staging) {
  constexpr int64_t kGrain = int64_t{1} << 20;
  ThreadPool* pool = into_staging ? copy_pool_.get() : copy_out_pool_.get();
  if (memory == nullptr) {
    pool->ParallelFor(bytes, kGrain, [&](int64_t begin, int64_t end) {
      std::memcpy(dst + begin, src + begin, static_cast<size_t>(end - begin));
    });
    return absl::OkStatus();
  }
  absl::Mutex mu;
  absl::Status first;
  pool->ParallelFor(bytes, kGrain, [&](int64_t begin, int64_t end) {
    absl::Status s = into_staging ? memory->Read(dst + begin, src + begin, end - begin)
                                  : memory->Write(dst + begin, src + begin, end - begin);
    if (!s.ok()) {
      absl::MutexLock lock(&mu);
      if (first.ok()) first = std::move(s);
    }
  });
  return first;
}

absl::StatusOr<StagingRing*> CudaDevice::Ring() {
  absl::MutexLock lock(&ring_mu_);
  if (ring_ == nullptr) {
    auto ring = StagingRing::Create(staging_count_, tile_bytes_);
    if (!ring.ok()) return ring.status();
    ring_ = std::move(*ring);
  }
  return ring_.get();
}

absl::Status CudaDevice::Enter() {
  return Check(cudaSetDevice(ordinal_), "cudaSetDevice");
}

absl::Status CudaDevice::Check(cudaError_t err, std::string_view what) {
  if (err != cudaSuccess && IsStickyError(err)) in_service_.store(false);
  return CudaStatus(err, what);
}

absl::Status CudaDevice::Check(cublasStatus_t st, std::string_view what) {
  if (st == CUBLAS_STATUS_EXECUTION_FAILED ||
      st == CUBLAS_STATUS_INTERNAL_ERROR) {
    // cuBLAS hides the CUDA error; see whether the context is still sound.
    const cudaError_t err = cudaPeekAtLastError();
    if (IsStickyError(err)) in_service_.store(false);
  }
  return CublasStatus(st, what);
}

int64_t CudaDevice::SlotBytes(JobMode mode, const Problem& p,
                              int64_t max_block_bytes) const {
  // A host region is one tile the device cuts into pieces of its own size.
  if (mode == JobMode::kWhole || mode == JobMode::kHostRegion) return tile_bytes_;
  if (mode == JobMode::kDeviceRegion) return 0;
  const int64_t block =
      std::max<int64_t>(max_block_bytes, static_cast<int64_t>(p.elem_size()));
  return RoundUp(std::min(tile_bytes_, block), kAlign);
}

int64_t CudaDevice::Footprint(const Problem& p, JobMode mode,
                              int64_t max_block_bytes) const {
  // The diagonals are held widened to C's compute type (and, for
  // SIDE_BOTH, both of them): prepared_diag_bytes.
  if (mode == JobMode::kWhole) {
    return p.matrix_bytes() + p.out_matrix_bytes() + p.prepared_diag_bytes();
  }
  // In place in the client's device memory: the diagonals' copy alone.
  if (mode == JobMode::kDeviceRegion) return p.prepared_diag_bytes();
  return 2 * int64_t{pieces_in_flight_} * SlotBytes(mode, p, max_block_bytes) +
         p.prepared_diag_bytes();
}

absl::StatusOr<std::unique_ptr<JobContext>> CudaDevice::Begin(
    const Problem& p, BackendKind backend, const std::byte* diag, JobMode mode,
    int64_t max_block_bytes) {
  if (backend != BackendKind::kCudaKernel && backend != BackendKind::kCublas) {
    return absl::InvalidArgumentError(
        "a GPU runs only the cuda-kernel and cublas backends");
  }
  if (!in_service()) {
    return absl::UnavailableError(absl::StrFormat(
        "GPU %d (%s) is out of service after an unrecoverable CUDA error",
        ordinal_, name_));
  }
  if (auto st = Enter(); !st.ok()) return st;
  auto job = std::make_unique<CudaJobContext>(
      this, p, backend, mode, SlotBytes(mode, p, max_block_bytes));
  if (auto st = job->Init(diag); !st.ok()) return st;
  return job;
}

absl::StatusOr<std::function<void()>> CudaDevice::PinHostMemory(void* p,
                                                                int64_t bytes) {
  if (auto st = Enter(); !st.ok()) return st;
  if (auto st = CudaStatus(cudaHostRegister(p, static_cast<size_t>(bytes),
                                            cudaHostRegisterPortable),
                           "cudaHostRegister of a shared-memory region");
      !st.ok()) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(absl::StrCat(
        "cannot pin the region for DMA (", st.message(),
        "); pinned memory is limited by the host: register less"));
  }
  const int ordinal = ordinal_;
  return std::function<void()>([p, ordinal] {
    cudaSetDevice(ordinal);
    cudaHostUnregister(p);  // fails harmlessly after a SIGBUS remapped it
    cudaGetLastError();
  });
}

absl::StatusOr<int64_t> CudaDevice::PoolHighWaterBytes() const {
  uint64_t v = 0;
  if (auto st = CudaStatus(
          cudaMemPoolGetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &v),
          "cudaMemPoolGetAttribute");
      !st.ok()) {
    return st;
  }
  return static_cast<int64_t>(v);
}

absl::Status CudaDevice::ResetPoolHighWater() {
  uint64_t zero = 0;
  return CudaStatus(
      cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrUsedMemHigh, &zero),
      "cudaMemPoolSetAttribute");
}

absl::Status CudaDevice::OrderBackendsByTiming() {
  // Both backends on the same 8 MB float32 tile, both scaling modes; the
  // faster total goes first. The custom kernel keeps first place unless
  // cuBLAS beats it by more than 5%, so timing noise does not flip the order.
  constexpr int64_t kLines = 2048, kLineLen = 1024, kReps = 10;
  const int64_t bytes = kLines * kLineLen * 4;
  cudaStream_t s = streams_[0];
  void *in = nullptr, *out = nullptr, *diag = nullptr;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  absl::Status status =
      Check(cudaMallocFromPoolAsync(&in, bytes, pool_, s), "alloc");
  if (status.ok())
    status = Check(cudaMallocFromPoolAsync(&out, bytes, pool_, s), "alloc");
  if (status.ok()) {
    status =
        Check(cudaMallocFromPoolAsync(&diag, kLines * 4, pool_, s), "alloc");
  }
  if (status.ok())
    status = Check(cudaMemsetAsync(in, 0x3f, bytes, s), "memset");
  if (status.ok())
    status = Check(cudaMemsetAsync(diag, 0x3f, kLines * 4, s), "memset");
  if (status.ok()) status = Check(cudaEventCreate(&t0), "cudaEventCreate");
  if (status.ok()) status = Check(cudaEventCreate(&t1), "cudaEventCreate");
  float ms[2] = {0, 0};
  for (int b = 0; b < 2 && status.ok(); ++b) {
    for (int rep = -2; rep < kReps && status.ok(); ++rep) {
      if (rep == 0) status = Check(cudaEventRecord(t0, s), "cudaEventRecord");
      for (bool per_line : {true, false}) {
        const DeviceTile<float> tile{.in = static_cast<const float*>(in),
                                     .out = static_cast<float*>(out),
                                     .diag = static_cast<const float*>(diag),
                                     .lines = per_line ? kLines : kLineLen,
                                     .line_len = per_line ? kLineLen : kLines,
                                     .per_line = per_line};
        if (!status.ok()) break;
        status = b == 0 ? Check(LaunchDgmmKernel(tile, multiprocessors_, s),
                                "kernel")
                        : Check(LaunchCublasDgmm(cublas_[0], tile), "cublas");
      }
    }
    if (status.ok()) status = Check(cudaEventRecord(t1, s), "cudaEventRecord");
    if (status.ok())
      status = Check(cudaEventSynchronize(t1), "cudaEventSynchronize");
    if (status.ok())
      status = Check(cudaEventElapsedTime(&ms[b], t0, t1), "elapsed");
  }
  for (void* p : {in, out, diag}) {
    if (p != nullptr) cudaFreeAsync(p, s);
  }
  cudaStreamSynchronize(s);
  if (t0 != nullptr) cudaEventDestroy(t0);
  if (t1 != nullptr) cudaEventDestroy(t1);
  if (!status.ok()) return status;
  if (ms[1] < 0.95f * ms[0]) {
    backends_ = {BackendKind::kCublas, BackendKind::kCudaKernel};
  }
  return absl::OkStatus();
}

}  // namespace dgmm::cuda
