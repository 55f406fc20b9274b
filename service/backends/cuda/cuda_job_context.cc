#include "service/backends/cuda/cuda_job_context.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "service/backends/cuda/cuda_status.h"
#include "service/core/log.h"

namespace dgmm::cuda {
namespace {

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

CudaJobContext::~CudaJobContext() {
  const absl::Time begin = absl::Now();
  struct Trace {
    const CudaJobContext* job;
    absl::Time begin;
    ~Trace() {
      if (!TraceJobs()) return;
      const auto ms = [](absl::Duration d) { return absl::ToDoubleMilliseconds(d); };
      LogInfo(absl::StrFormat(
          "trace: job of %d bytes: set-up %.3f ms, until the pipeline %.3f ms, pipeline %.3f ms "
          "(%d pieces; its thread: copy in %.3f ms, GPU wait %.3f ms, copy-out wait %.3f ms; "
          "copies out %.3f ms), until tear-down %.3f ms, tear-down %.3f ms",
          job->p_.matrix_bytes(), ms(job->initialized_ - job->created_),
          ms(job->processed_ - job->initialized_ - (job->pipeline_end_ - job->pipeline_start_)),
          ms(job->pipeline_end_ - job->pipeline_start_), job->pieces_, ms(job->copying_in_),
          ms(job->waiting_gpu_), ms(job->waiting_copy_out_), ms(job->copying_out_),
          ms(begin - job->processed_), ms(absl::Now() - begin)));
    }
  } trace{this, begin};
  if (!device_->Enter().ok()) return;
  // Process drains every piece before returning, so nothing of this job is
  // in flight: the frees need no ordering beyond the setup stream.
  for (std::byte* p : {d_diag_, d_in_, d_out_}) {
    if (p != nullptr) cudaFreeAsync(p, device_->setup_stream_);
  }
  for (Lane& lane : lanes_) {
    for (cudaEvent_t e : {lane.start, lane.uploaded, lane.computed, lane.done}) {
      if (e != nullptr) cudaEventDestroy(e);
    }
  }
  cudaGetLastError();
}

absl::Status CudaJobContext::Init(const std::byte* diag) {
  cudaStream_t s = device_->setup_stream_;
  auto alloc = [&](std::byte** out, int64_t bytes) {
    return device_->Check(cudaMallocFromPoolAsync(reinterpret_cast<void**>(out),
                                                  static_cast<size_t>(std::max<int64_t>(bytes, 1)),
                                                  device_->pool_, s),
                          absl::StrFormat("cudaMallocFromPoolAsync(%d bytes)", bytes));
  };
  // The prepared diagonals (in C's compute type; SIDE_BOTH: both).
  if (auto st = alloc(&d_diag_, p_.prepared_diag_bytes()); !st.ok()) return st;
  // A job on the client's device memory (kDeviceRegion) needs no slots.
  if (region_bytes() > 0) {
    if (auto st = alloc(&d_in_, region_bytes()); !st.ok()) return st;
    if (auto st = alloc(&d_out_, out_region_bytes()); !st.ok()) return st;
  }
  if (auto st = device_->Check(
          cudaMemcpyAsync(d_diag_, diag, static_cast<size_t>(p_.prepared_diag_bytes()),
                          cudaMemcpyHostToDevice, s),
          "diagonal upload");
      !st.ok()) {
    return st;
  }
  if (auto st = device_->Check(cudaStreamSynchronize(s), "diagonal upload sync"); !st.ok()) {
    return st;
  }
  // kDeviceRegion launches once: one lane's events.
  lanes_.resize(mode_ == JobMode::kDeviceRegion ? 1 : device_->pieces_in_flight());
  for (Lane& lane : lanes_) {
    for (cudaEvent_t* e : {&lane.start, &lane.uploaded, &lane.computed, &lane.done}) {
      if (auto st = device_->Check(cudaEventCreate(e), "cudaEventCreate"); !st.ok()) {
        return st;
      }
    }
  }
  initialized_ = absl::Now();
  return absl::OkStatus();
}

std::byte* CudaJobContext::DeviceAddress(std::byte* region, int lane, const Piece& piece,
                                         bool out) const {
  if (mode_ == JobMode::kWhole) {
    return region + piece.first_line * (out ? p_.out_line_bytes() : p_.line_bytes()) +
           piece.pos * static_cast<int64_t>(out ? p_.out_elem_size() : p_.elem_size());
  }
  return region + lane * slot_bytes_;
}

template <typename T>
DeviceTile<T> CudaJobContext::MakeDeviceTile(std::byte* in, std::byte* out,
                                             const Piece& piece) const {
  const bool per_line = p_.scale_per_line();
  const T* diag = reinterpret_cast<const T*>(d_diag_) + (per_line ? piece.first_line : piece.pos);
  return DeviceTile<T>{.in = reinterpret_cast<const T*>(in),
                       .out = reinterpret_cast<T*>(out),
                       .diag = diag,
                       .lines = piece.lines,
                       .line_len = piece.line_len,
                       .per_line = per_line};
}

absl::Status CudaJobContext::Launch(const Lane& lane, const Piece& piece, int lane_index) {
  return LaunchOn(DeviceAddress(d_in_, lane_index, piece),
                  DeviceAddress(d_out_, lane_index, piece, /*out=*/true), piece, lane.stream);
}

absl::Status CudaJobContext::LaunchOn(std::byte* in, std::byte* out, const Piece& piece,
                                      int stream_index) {
  cudaStream_t stream = device_->streams_[stream_index];
  const int sms = device_->multiprocessors_;
  if (backend_ == BackendKind::kCublas) {
    cublasHandle_t h = device_->cublas_[stream_index];
    cublasStatus_t st = CUBLAS_STATUS_NOT_SUPPORTED;
    switch (p_.dtype) {
      case DType::kFloat32:
        st = LaunchCublasDgmm(h, MakeDeviceTile<float>(in, out, piece));
        break;
      case DType::kFloat64:
        st = LaunchCublasDgmm(h, MakeDeviceTile<double>(in, out, piece));
        break;
      case DType::kComplex64:
        st = LaunchCublasDgmm(h, MakeDeviceTile<Complex64>(in, out, piece));
        break;
      case DType::kComplex128:
        st = LaunchCublasDgmm(h, MakeDeviceTile<Complex128>(in, out, piece));
        break;
      default:  // refused before the job started (CublasTakes)
        break;
    }
    return device_->Check(st, "cublas<t>dgmm");
  }
  if (!p_.plain()) {
    // Every other dtype, a promoted diagonal, SIDE_BOTH: the general
    // kernel, with the prepared diagonals offset to this piece.
    const int64_t k = static_cast<int64_t>(p_.compute_elem_size());
    const std::byte* left = p_.has_left() ? d_diag_ : nullptr;
    const std::byte* right = p_.two_sided()   ? d_diag_ + p_.right_diag_offset()
                             : p_.has_right() ? d_diag_
                                              : nullptr;
    const bool left_per_line = p_.left_per_line();
    if (left != nullptr) left += (left_per_line ? piece.first_line : piece.pos) * k;
    if (right != nullptr) right += (left_per_line ? piece.pos : piece.first_line) * k;
    const AnyScaleTile tile{.in_type = p_.dtype,
                            .out_type = p_.out_dtype(),
                            .in = in,
                            .out = out,
                            .left = left,
                            .right = right,
                            .left_per_line = left_per_line,
                            .lines = piece.lines,
                            .line_len = piece.line_len};
    return device_->Check(LaunchScaleKernel(tile, sms, stream), "dgmm kernel launch");
  }
  return device_->Check(p_.dtype == DType::kFloat32
                            ? LaunchDgmmKernel(MakeDeviceTile<float>(in, out, piece), sms, stream)
                            : LaunchDgmmKernel(MakeDeviceTile<double>(in, out, piece), sms, stream),
                        "dgmm kernel launch");
}

absl::Status CudaJobContext::Start(Lane& lane, int lane_index, const Piece& piece, const Tile& tile,
                                   bool pinned_in, bool pinned_out, StageTimes* times) {
  const std::byte* src = tile.in + piece.byte_offset;
  // The staging buffer's last result must be out before it is refilled.
  if (auto st = AwaitCopyOut(lane, times); !st.ok()) return st;
  if (!pinned_in) {
    const absl::Time t0 = absl::Now();
    absl::Status copied = device_->StagingCopy(lane.staging, src, piece.bytes, tile.memory,
                                               /*into_staging=*/true);
    const absl::Duration took = absl::Now() - t0;
    if (times != nullptr) times->h2d += took;
    copying_in_ += took;
    if (!copied.ok()) return copied;
    src = lane.staging;
  }
  // C's bytes of the piece go to C's offset (more than A's for a wider C);
  // the staging buffer takes A's piece in, then C's out.
  std::byte* dst = pinned_out ? tile.out + OutBytes(piece.byte_offset) : lane.staging;
  cudaStream_t s = device_->streams_[lane.stream];
  const size_t n = static_cast<size_t>(piece.bytes);
  const size_t out_n = static_cast<size_t>(OutBytes(piece.bytes));
  lane.piece = piece;
  lane.busy = true;
  if (auto st = device_->Check(cudaEventRecord(lane.start, s), "cudaEventRecord"); !st.ok()) {
    return st;
  }
  if (auto st = device_->Check(cudaMemcpyAsync(DeviceAddress(d_in_, lane_index, piece), src, n,
                                               cudaMemcpyHostToDevice, s),
                               "host-to-device copy");
      !st.ok()) {
    return st;
  }
  if (auto st = device_->Check(cudaEventRecord(lane.uploaded, s), "cudaEventRecord"); !st.ok()) {
    return st;
  }
  if (auto st = Launch(lane, piece, lane_index); !st.ok()) return st;
  if (auto st = device_->Check(cudaEventRecord(lane.computed, s), "cudaEventRecord"); !st.ok()) {
    return st;
  }
  if (auto st = device_->Check(cudaMemcpyAsync(dst, DeviceAddress(d_out_, lane_index, piece, true),
                                               out_n, cudaMemcpyDeviceToHost, s),
                               "device-to-host copy");
      !st.ok()) {
    return st;
  }
  return device_->Check(cudaEventRecord(lane.done, s), "cudaEventRecord");
}

absl::Status CudaJobContext::Finish(Lane& lane, const Tile& tile, bool pinned_out,
                                    StageTimes* times) {
  lane.busy = false;
  const absl::Time wait_start = absl::Now();
  if (auto st = device_->Check(cudaEventSynchronize(lane.done), "pipeline wait"); !st.ok()) {
    return st;
  }
  waiting_gpu_ += absl::Now() - wait_start;
  if (times != nullptr) {
    times->h2d += EventGap(lane.start, lane.uploaded);
    times->compute += EventGap(lane.uploaded, lane.computed);
    times->d2h += EventGap(lane.computed, lane.done);
  }
  if (!pinned_out) {
    // Out of the staging buffer on a thread of its own (with the device's
    // copy-out threads), so that it overlaps the next pieces' copies in.
    std::byte* dst = tile.out + OutBytes(lane.piece.byte_offset);
    const std::byte* src = lane.staging;
    const int64_t bytes = OutBytes(lane.piece.bytes);
    const TileMemory* memory = tile.memory;
    auto copy = [device = device_, dst, src, bytes, memory] {
      const absl::Time t0 = absl::Now();
      absl::Status st = device->StagingCopy(dst, src, bytes, memory, /*into_staging=*/false);
      return Lane::CopyOut{std::move(st), absl::Now() - t0};
    };
    try {
      lane.copy_out = std::async(std::launch::async, copy);
    } catch (const std::system_error&) {  // no thread to be had: copy here
      std::promise<Lane::CopyOut> done;
      done.set_value(copy());
      lane.copy_out = done.get_future();
    }
  }
  return absl::OkStatus();
}

absl::Status CudaJobContext::AwaitCopyOut(Lane& lane, StageTimes* times) {
  if (!lane.copy_out.valid()) return absl::OkStatus();
  const absl::Time wait_start = absl::Now();
  Lane::CopyOut done = lane.copy_out.get();
  waiting_copy_out_ += absl::Now() - wait_start;
  copying_out_ += done.took;
  if (times != nullptr) times->d2h += done.took;
  return done.status;
}

absl::Status CudaJobContext::ProcessResident(const Tile& tile, StageTimes* times) {
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
  if (auto st = device_->Check(cudaEventRecord(lane.uploaded, s), "cudaEventRecord"); !st.ok()) {
    return st;
  }
  absl::Status status = LaunchOn(const_cast<std::byte*>(tile.in), tile.out, piece, lane.stream);
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

absl::Status CudaJobContext::Process(const Tile& tile, const CancelFn& cancelled,
                                     StageTimes* times) {
  if (tile.lines == 0) return absl::OkStatus();
  if (tile.first_line < 0 || tile.lines < 0 || tile.first_line + tile.lines > p_.lines()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tile lines [%d, %d) lie outside the matrix's %d lines", tile.first_line,
                        tile.first_line + tile.lines, p_.lines()));
  }
  if (!device_->in_service()) {
    return absl::UnavailableError(
        absl::StrFormat("GPU %d (%s) is out of service after an unrecoverable CUDA error",
                        device_->index(), device_->name()));
  }
  if (auto st = device_->Enter(); !st.ok()) return st;
  if (mode_ == JobMode::kDeviceRegion) return ProcessResident(tile, times);

  const int64_t bytes = tile.lines * p_.line_bytes();
  // Another process's memory (Tile.memory) is never ours to DMA from.
  const bool pinned_in = tile.memory == nullptr && IsPinned(tile.in, bytes);
  const bool pinned_out = tile.memory == nullptr && IsPinned(tile.out, OutBytes(bytes));
  // A piece must fit one staging buffer and one device slot, in A's bytes
  // and in C's (C's element is never narrower than A's): the limit in A's
  // bytes is the whole elements of C that fit, at least one.
  const int64_t piece_limit = PieceLimitBytes(p_, std::min(slot_bytes_, device_->tile_bytes_));
  const int64_t line_bytes = p_.line_bytes();
  const int64_t pieces =
      line_bytes > piece_limit
          ? tile.lines * ((line_bytes + piece_limit - 1) / piece_limit)
          : (tile.lines + piece_limit / line_bytes - 1) / (piece_limit / line_bytes);
  const int want = static_cast<int>(
      std::min<int64_t>(device_->pieces_in_flight(), std::max<int64_t>(pieces, 1)));

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
    lanes_[i].stream = static_cast<int>((first_stream + i) % device_->streams());
    lanes_[i].busy = false;
  }

  // From and to pinned memory nothing but the GPU's copies are in the
  // pipeline: for a job of many pieces, a ramp (an eighth of a full piece
  // first and last) shortens the time it waits to fill and to drain. On the
  // H200 the pipeline of an N=20000 float32 job took 35.1 ms with it against
  // 36.2 without; at N=10000 9.04 and 9.07; a job of a few pieces only got
  // more of them (N=1000: 0.28 against 0.19 ms), so it has none
  // (bench/results/user_path/h200_ec561f3/README.md).
  // DGMM_PIECE_RAMP=0 turns it off (A/B).
  static const bool ramp_on = [] {
    const char* v = std::getenv("DGMM_PIECE_RAMP");
    return v == nullptr || std::string(v) != "0";
  }();
  constexpr int64_t kRampMinPieces = 16;
  const int64_t ramp =
      ramp_on && pinned_in && pinned_out && pieces >= kRampMinPieces ? piece_limit / 8 : 0;
  absl::Status status;
  TileSplitter splitter(p_, tile.first_line, tile.lines, piece_limit, ramp);
  Piece piece;
  pipeline_start_ = absl::Now();
  for (int64_t i = 0; status.ok() && splitter.Next(&piece); ++i) {
    ++pieces_;
    const int l = static_cast<int>(i % depth);
    // Results that leave through staging: the lane after this one is
    // finished a piece early, so that its result is copied out (on its own
    // thread) while this piece is copied in; then this lane is finished if
    // it is still busy (depth 1, or results DMAed straight to pinned memory).
    if (const int next = (l + 1) % depth; !pinned_out && lanes_[next].busy) {
      status = Finish(lanes_[next], tile, pinned_out, times);
      if (!status.ok()) break;
    }
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
  // Every result out of staging (or its copy ended) before the buffers go
  // back, whatever happened.
  for (int l = 0; l < depth; ++l) {
    absl::Status st = AwaitCopyOut(lanes_[l], times);
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
  pipeline_end_ = absl::Now();
  if (!staging.empty()) ring->Release(staging);
  processed_ = absl::Now();
  return status;
}

}  // namespace dgmm::cuda
