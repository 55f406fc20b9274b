#include "service/backends/cuda/cuda_device.h"

#include <cuda.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "service/backends/cuda/cuda_status.h"
#include "service/backends/cuda/dgmm_kernel.h"
#include "service/backends/cuda/tile_split.h"

namespace dgmm::cuda {
namespace {

constexpr int64_t kAlign = 256;

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

bool IsPinned(const void* p, int64_t bytes) {
  auto pinned_at = [](const void* q) {
    cudaPointerAttributes attr{};
    if (cudaPointerGetAttributes(&attr, q) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return attr.type == cudaMemoryTypeHost;
  };
  const auto* b = static_cast<const std::byte*>(p);
  return bytes > 0 && pinned_at(b) && pinned_at(b + bytes - 1);
}

absl::Duration EventGap(cudaEvent_t from, cudaEvent_t to) {
  float ms = 0;
  if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess) {
    cudaGetLastError();
    return absl::ZeroDuration();
  }
  return absl::Microseconds(static_cast<int64_t>(ms * 1000.0f));
}

}  // namespace

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

// ------------------------------------------------------------- CudaJobContext

// One job on one CudaDevice. Device memory: the diagonal, plus input and
// output regions (the whole matrix for kWhole, one slot per stream for
// kStreamed), all from the device's pool.
class CudaJobContext final : public JobContext {
 public:
  CudaJobContext(CudaDevice* device, const Problem& p, BackendKind backend,
                 JobMode mode, int64_t slot_bytes)
      : device_(device),
        p_(p),
        backend_(backend),
        mode_(mode),
        slot_bytes_(slot_bytes) {}
  ~CudaJobContext() override;

  // Allocates the job's device memory and uploads the diagonal.
  absl::Status Init(const std::byte* diag);

  absl::Status Process(const Tile& tile, const CancelFn& cancelled,
                       StageTimes* times) override;

 private:
  // One piece in flight: its staging buffer (if any), stream and events.
  struct Lane {
    std::byte* staging = nullptr;
    int stream = 0;
    cudaEvent_t start = nullptr, uploaded = nullptr, computed = nullptr,
                done = nullptr;
    bool busy = false;
    Piece piece;
  };

  int64_t region_bytes() const {
    return mode_ == JobMode::kWhole
               ? RoundUp(p_.matrix_bytes(), kAlign)
               : int64_t{device_->pieces_in_flight()} * slot_bytes_;
  }
  // Device address of `piece`'s input (or output) in lane `lane`.
  std::byte* DeviceAddress(std::byte* region, int lane,
                           const Piece& piece) const;
  absl::Status Launch(const Lane& lane, const Piece& piece, int lane_index);
  absl::Status LaunchOn(std::byte* in, std::byte* out, const Piece& piece, int stream);
  // kDeviceRegion: the tile's pointers are device memory of this GPU.
  absl::Status ProcessResident(const Tile& tile, StageTimes* times);
  absl::Status Start(Lane& lane, int lane_index, const Piece& piece,
                     const Tile& tile, bool pinned_in, bool pinned_out,
                     StageTimes* times);
  absl::Status Finish(Lane& lane, const Tile& tile, bool pinned_out,
                      StageTimes* times);
  template <typename T>
  DeviceTile<T> MakeDeviceTile(std::byte* in, std::byte* out,
                               const Piece& piece) const;

  CudaDevice* const device_;
  const Problem p_;
  const BackendKind backend_;
  const JobMode mode_;
  const int64_t slot_bytes_;
  std::byte* d_diag_ = nullptr;
  std::byte* d_in_ = nullptr;
  std::byte* d_out_ = nullptr;
  std::vector<Lane> lanes_;
};

CudaJobContext::~CudaJobContext() {
  if (!device_->Enter().ok()) return;
  // Process drains every piece before returning, so nothing of this job is
  // in flight: the frees need no ordering beyond the setup stream.
  for (std::byte* p : {d_diag_, d_in_, d_out_}) {
    if (p != nullptr) cudaFreeAsync(p, device_->setup_stream_);
  }
  for (Lane& lane : lanes_) {
    for (cudaEvent_t e :
         {lane.start, lane.uploaded, lane.computed, lane.done}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  cudaGetLastError();
}

absl::Status CudaJobContext::Init(const std::byte* diag) {
  cudaStream_t s = device_->setup_stream_;
  auto alloc = [&](std::byte** out, int64_t bytes) {
    return device_->Check(
        cudaMallocFromPoolAsync(
            reinterpret_cast<void**>(out),
            static_cast<size_t>(std::max<int64_t>(bytes, 1)), device_->pool_,
            s),
        absl::StrFormat("cudaMallocFromPoolAsync(%d bytes)", bytes));
  };
  if (auto st = alloc(&d_diag_, p_.diag_bytes()); !st.ok()) return st;
  // A job on the client's device memory (kDeviceRegion) needs no slots.
  if (region_bytes() > 0) {
    if (auto st = alloc(&d_in_, region_bytes()); !st.ok()) return st;
    if (auto st = alloc(&d_out_, region_bytes()); !st.ok()) return st;
  }
  if (auto st = device_->Check(
          cudaMemcpyAsync(d_diag_, diag, static_cast<size_t>(p_.diag_bytes()),
                          cudaMemcpyHostToDevice, s),
          "diagonal upload");
      !st.ok()) {
    return st;
  }
  if (auto st =
          device_->Check(cudaStreamSynchronize(s), "diagonal upload sync");
      !st.ok()) {
    return st;
  }
  // kDeviceRegion launches once: one lane's events.
  lanes_.resize(mode_ == JobMode::kDeviceRegion ? 1 : device_->pieces_in_flight());
  for (Lane& lane : lanes_) {
    for (cudaEvent_t* e :
         {&lane.start, &lane.uploaded, &lane.computed, &lane.done}) {
      if (auto st = device_->Check(cudaEventCreate(e), "cudaEventCreate");
          !st.ok()) {
        return st;
      }
    }
  }
  return absl::OkStatus();
}

std::byte* CudaJobContext::DeviceAddress(std::byte* region, int lane,
                                         const Piece& piece) const {
  if (mode_ == JobMode::kWhole) {
    return region + piece.first_line * p_.line_bytes() +
           piece.pos * static_cast<int64_t>(p_.elem_size());
  }
  return region + lane * slot_bytes_;
}

template <typename T>
DeviceTile<T> CudaJobContext::MakeDeviceTile(std::byte* in, std::byte* out,
                                             const Piece& piece) const {
  const bool per_line = p_.scale_per_line();
  const T* diag = reinterpret_cast<const T*>(d_diag_) +
                  (per_line ? piece.first_line : piece.pos);
  return DeviceTile<T>{.in = reinterpret_cast<const T*>(in),
                       .out = reinterpret_cast<T*>(out),
                       .diag = diag,
                       .lines = piece.lines,
                       .line_len = piece.line_len,
                       .per_line = per_line};
}

absl::Status CudaJobContext::Launch(const Lane& lane, const Piece& piece,
                                    int lane_index) {
  return LaunchOn(DeviceAddress(d_in_, lane_index, piece),
                  DeviceAddress(d_out_, lane_index, piece), piece, lane.stream);
}

absl::Status CudaJobContext::LaunchOn(std::byte* in, std::byte* out,
                                      const Piece& piece, int stream_index) {
  cudaStream_t stream = device_->streams_[stream_index];
  const int sms = device_->multiprocessors_;
  if (backend_ == BackendKind::kCublas) {
    cublasHandle_t h = device_->cublas_[stream_index];
    return device_->Check(
        p_.dtype == DType::kFloat32
            ? LaunchCublasDgmm(h, MakeDeviceTile<float>(in, out, piece))
            : LaunchCublasDgmm(h, MakeDeviceTile<double>(in, out, piece)),
        "cublas<t>dgmm");
  }
  return device_->Check(
      p_.dtype == DType::kFloat32
          ? LaunchDgmmKernel(MakeDeviceTile<float>(in, out, piece), sms, stream)
          : LaunchDgmmKernel(MakeDeviceTile<double>(in, out, piece), sms,
                             stream),
      "dgmm kernel launch");
}

absl::Status CudaJobContext::Start(Lane& lane, int lane_index,
                                   const Piece& piece, const Tile& tile,
                                   bool pinned_in, bool pinned_out,
                                   StageTimes* times) {
  const std::byte* src = tile.in + piece.byte_offset;
  if (!pinned_in) {
    const absl::Time t0 = absl::Now();
    std::memcpy(lane.staging, src, static_cast<size_t>(piece.bytes));
    if (times != nullptr) times->h2d += absl::Now() - t0;
    src = lane.staging;
  }
  std::byte* dst = pinned_out ? tile.out + piece.byte_offset : lane.staging;
  cudaStream_t s = device_->streams_[lane.stream];
  const size_t n = static_cast<size_t>(piece.bytes);
  lane.piece = piece;
  lane.busy = true;
  if (auto st =
          device_->Check(cudaEventRecord(lane.start, s), "cudaEventRecord");
      !st.ok()) {
    return st;
  }
  if (auto st = device_->Check(
          cudaMemcpyAsync(DeviceAddress(d_in_, lane_index, piece), src, n,
                          cudaMemcpyHostToDevice, s),
          "host-to-device copy");
      !st.ok()) {
    return st;
  }
  if (auto st =
          device_->Check(cudaEventRecord(lane.uploaded, s), "cudaEventRecord");
      !st.ok()) {
    return st;
  }
  if (auto st = Launch(lane, piece, lane_index); !st.ok()) return st;
  if (auto st =
          device_->Check(cudaEventRecord(lane.computed, s), "cudaEventRecord");
      !st.ok()) {
    return st;
  }
  if (auto st = device_->Check(
          cudaMemcpyAsync(dst, DeviceAddress(d_out_, lane_index, piece), n,
                          cudaMemcpyDeviceToHost, s),
          "device-to-host copy");
      !st.ok()) {
    return st;
  }
  return device_->Check(cudaEventRecord(lane.done, s), "cudaEventRecord");
}

absl::Status CudaJobContext::Finish(Lane& lane, const Tile& tile,
                                    bool pinned_out, StageTimes* times) {
  lane.busy = false;
  if (auto st =
          device_->Check(cudaEventSynchronize(lane.done), "pipeline wait");
      !st.ok()) {
    return st;
  }
  if (times != nullptr) {
    times->h2d += EventGap(lane.start, lane.uploaded);
    times->compute += EventGap(lane.uploaded, lane.computed);
    times->d2h += EventGap(lane.computed, lane.done);
  }
  if (!pinned_out) {
    const absl::Time t0 = absl::Now();
    std::memcpy(tile.out + lane.piece.byte_offset, lane.staging,
                static_cast<size_t>(lane.piece.bytes));
    if (times != nullptr) times->d2h += absl::Now() - t0;
  }
  return absl::OkStatus();
}

absl::Status CudaJobContext::ProcessResident(const Tile& tile,
                                             StageTimes* times) {
  Lane& lane = lanes_[0];
  lane.stream = static_cast<int>(device_->next_stream_.fetch_add(1) %
                                 static_cast<uint32_t>(device_->streams()));
  cudaStream_t s = device_->streams_[lane.stream];
  // One launch over the whole tile: lines of any length, no piece limit.
  Piece piece;
  piece.byte_offset = 0;
  piece.bytes = tile.lines * p_.line_bytes();
  piece.first_line = tile.first_line;
  piece.lines = tile.lines;
  piece.line_len = p_.line_len();
  piece.pos = 0;
  if (auto st = device_->Check(cudaEventRecord(lane.uploaded, s), "cudaEventRecord");
      !st.ok()) {
    return st;
  }
  absl::Status status = LaunchOn(const_cast<std::byte*>(tile.in), tile.out, piece,
                                 lane.stream);
  if (status.ok()) {
    status = device_->Check(cudaEventRecord(lane.computed, s), "cudaEventRecord");
  }
  if (status.ok()) {
    status = device_->Check(cudaEventSynchronize(lane.computed), "kernel wait");
  }
  if (!status.ok()) {
    cudaStreamSynchronize(s);
    cudaGetLastError();
    return status;
  }
  if (times != nullptr) times->compute += EventGap(lane.uploaded, lane.computed);
  return absl::OkStatus();
}

absl::Status CudaJobContext::Process(const Tile& tile,
                                     const CancelFn& cancelled,
                                     StageTimes* times) {
  if (tile.lines == 0) return absl::OkStatus();
  if (tile.first_line < 0 || tile.lines < 0 ||
      tile.first_line + tile.lines > p_.lines()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tile lines [%d, %d) lie outside the matrix's %d lines",
        tile.first_line, tile.first_line + tile.lines, p_.lines()));
  }
  if (!device_->in_service()) {
    return absl::UnavailableError(absl::StrFormat(
        "GPU %d (%s) is out of service after an unrecoverable CUDA error",
        device_->index(), device_->name()));
  }
  if (auto st = device_->Enter(); !st.ok()) return st;
  if (mode_ == JobMode::kDeviceRegion) return ProcessResident(tile, times);

  const int64_t bytes = tile.lines * p_.line_bytes();
  const bool pinned_in = IsPinned(tile.in, bytes);
  const bool pinned_out = IsPinned(tile.out, bytes);
  // A piece must fit one staging buffer and one device slot.
  const int64_t piece_limit = std::min(slot_bytes_, device_->tile_bytes_);
  const int64_t line_bytes = p_.line_bytes();
  const int64_t pieces =
      line_bytes > piece_limit
          ? tile.lines * ((line_bytes + piece_limit - 1) / piece_limit)
          : (tile.lines + piece_limit / line_bytes - 1) /
                (piece_limit / line_bytes);
  const int want = static_cast<int>(std::min<int64_t>(
      device_->pieces_in_flight(), std::max<int64_t>(pieces, 1)));

  std::vector<std::byte*> staging;
  StagingRing* ring = nullptr;
  if (!pinned_in || !pinned_out) {
    absl::StatusOr<StagingRing*> r = device_->Ring();
    if (!r.ok()) return r.status();
    ring = *r;
    staging = ring->Acquire(want);
  }
  const int depth = staging.empty() ? want : static_cast<int>(staging.size());
  const uint32_t first_stream = device_->next_stream_.fetch_add(1);
  for (int i = 0; i < depth; ++i) {
    lanes_[i].staging = staging.empty() ? nullptr : staging[i];
    lanes_[i].stream =
        static_cast<int>((first_stream + i) % device_->streams());
    lanes_[i].busy = false;
  }

  absl::Status status;
  TileSplitter splitter(p_, tile.first_line, tile.lines, piece_limit);
  Piece piece;
  for (int64_t i = 0; status.ok() && splitter.Next(&piece); ++i) {
    const int l = static_cast<int>(i % depth);
    if (lanes_[l].busy) {
      status = Finish(lanes_[l], tile, pinned_out, times);
      if (!status.ok()) break;
    }
    if (cancelled && cancelled()) {
      status = absl::CancelledError("job cancelled between tiles");
      break;
    }
    // Piece offsets are relative to the tile; the splitter's lines are
    // absolute, which is what the diagonal and the kWhole layout need.
    status = Start(lanes_[l], l, piece, tile, pinned_in, pinned_out, times);
  }
  for (int l = 0; l < depth; ++l) {
    if (!lanes_[l].busy) continue;
    absl::Status st = Finish(lanes_[l], tile, pinned_out, times);
    if (status.ok()) status = st;
  }
  if (!status.ok()) {
    // A piece that failed half-way may have copies in flight that no event
    // covers; nothing may touch the staging buffers once they are returned.
    for (int l = 0; l < depth; ++l) {
      cudaStreamSynchronize(device_->streams_[lanes_[l].stream]);
    }
    cudaGetLastError();
  }
  if (!staging.empty()) ring->Release(staging);
  return status;
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
  if (mode == JobMode::kWhole) return 2 * p.matrix_bytes() + p.diag_bytes();
  // In place in the client's device memory: the diagonal's copy alone.
  if (mode == JobMode::kDeviceRegion) return p.diag_bytes();
  return 2 * int64_t{pieces_in_flight_} * SlotBytes(mode, p, max_block_bytes) +
         p.diag_bytes();
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

absl::StatusOr<Device::IpcMapping> CudaDevice::OpenIpcMemory(
    absl::string_view handle) {
  if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
    return absl::InvalidArgumentError("a CUDA IPC handle has 64 bytes");
  }
  if (auto st = Enter(); !st.ok()) return st;
  cudaIpcMemHandle_t h;
  std::memcpy(&h, handle.data(), sizeof(h));
  void* base = nullptr;
  const cudaError_t err =
      cudaIpcOpenMemHandle(&base, h, cudaIpcMemLazyEnablePeerAccess);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA IPC handle does not open on GPU ", ordinal_, ": ",
        cudaGetErrorString(err),
        " (a handle opens only in another process than the one that made "
        "it, and only while its allocation lives)"));
  }
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, base) != cudaSuccess ||
      attr.type != cudaMemoryTypeDevice || attr.device != ordinal_) {
    const int actual = attr.device;
    cudaIpcCloseMemHandle(base);
    cudaGetLastError();
    return absl::InvalidArgumentError(absl::StrCat(
        "the CUDA IPC handle names memory on GPU ", actual, ", not on GPU ",
        ordinal_, " (client and server must number the GPUs alike: same "
        "CUDA_VISIBLE_DEVICES)"));
  }
  // The allocation's size, from the driver (the runtime has no call for it).
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  size_t size = 0;
  CUdeviceptr range_base = 0;
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                       cudaEnableDefault, &q) != cudaSuccess ||
      fn == nullptr ||
      reinterpret_cast<GetRange>(fn)(&range_base, &size,
                                     reinterpret_cast<CUdeviceptr>(base)) !=
          CUDA_SUCCESS) {
    cudaIpcCloseMemHandle(base);
    cudaGetLastError();
    return absl::InternalError(
        "cannot read the size of the CUDA IPC allocation (cuMemGetAddressRange)");
  }
  const int64_t bytes = static_cast<int64_t>(
      size - (reinterpret_cast<CUdeviceptr>(base) - range_base));
  const int ordinal = ordinal_;
  return IpcMapping{
      .base = static_cast<std::byte*>(base),
      .bytes = bytes,
      .close = [base, ordinal] {
        cudaSetDevice(ordinal);
        cudaIpcCloseMemHandle(base);
        cudaGetLastError();
      }};
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
