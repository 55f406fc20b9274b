// The same-host path of Client::Multiply (ClientOptions.same_host):
// A is copied into a staging region of this client -- a sealed memfd passed
// to the server's local socket and registered once -- the job runs there in
// place (MultiplyRegion), and C is copied out. Staging regions are kept on a
// free list and reused, so the server pins them from their second job on;
// one that is too small is replaced by one of the next power of two.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dgmm/client.h"
#include "dgmm/regions.h"
#include "src/job_lines.h"
#include "src/retry.h"

namespace dgmm {

// A registered staging region. Unregistered by the server when the client's
// session closes; dropped from the free list, it is unregistered here.
struct Client::Staging {
  // No unregister call on the way out: the client is going (its session
  // closes and the server drops the region), the session already closed, or
  // the region is known to be gone.
  ~Staging() {
    if (region != nullptr) region->Abandon();
  }
  std::unique_ptr<SharedMemoryRegion> region;
  bool used = false;  // false until its first job: its pages are not there yet
  size_t bytes() const { return region->size(); }
};

namespace {

// How long a finding that the server is not usable through memory is kept
// before it is checked again.
constexpr absl::Duration kRecheckAfter = absl::Seconds(60);
// Free staging regions kept per client.
constexpr size_t kMaxFreeStaging = 4;
// Copies split over threads from this size on, in slices of at least this.
constexpr size_t kParallelCopyBytes = size_t{8} << 20;

// memcpy with up to `max_threads` threads (the copies are memory-bound, and
// into a new staging region page-fault-bound: a few threads go further than
// one).
void ParallelCopy(char* dst, const char* src, size_t bytes, size_t max_threads) {
  const size_t parts =
      std::min<size_t>({max_threads, std::max<size_t>(1, bytes / kParallelCopyBytes)});
  if (parts <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const size_t slice = (bytes / parts + 4095) / 4096 * 4096;
  std::vector<std::thread> threads;
  for (size_t p = 1; p < parts; ++p) {
    const size_t at = p * slice;
    if (at >= bytes) break;
    threads.emplace_back([=] { std::memcpy(dst + at, src + at, std::min(slice, bytes - at)); });
  }
  std::memcpy(dst, src, std::min(slice, bytes));
  for (std::thread& t : threads) t.join();
}

size_t HardwareThreads() { return std::max(1u, std::thread::hardware_concurrency()); }

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

size_t StagingSize(size_t need) {
  size_t size = size_t{1} << 20;
  while (size < need) size *= 2;
  return size;
}

// A region job failed this way: should the job go over the socket instead?
// (Jobs are pure: the socket path recomputes it from the caller's A.)
bool SocketCanStillDoIt(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kUnavailable:         // the transport: the socket path retries
    case absl::StatusCode::kNotFound:            // the staging region is gone (session)
    case absl::StatusCode::kFailedPrecondition:  // regions off now, memory shrank
    case absl::StatusCode::kUnauthenticated:     // the session closed
    case absl::StatusCode::kResourceExhausted:   // no room for a region job
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;  // the job's own error (INVALID_ARGUMENT, DEADLINE_EXCEEDED, ...)
  }
}

// A staging job may run in blocks of whole lines (rows of a row-major
// matrix, columns of a column-major one), one region job each, so that
// copying block k+1 in, the job on block k and copying block k-1 out
// overlap: ClientOptions.same_host_blocks > 1. Not by default: on the H200
// host (bench/results/user_path/h200_ae98e10/README.md) the overlapped
// copies share the host's memory bandwidth with each other and with the
// GPU's DMA (warm jobs 0.88-1.22 x one block), and a new region's second
// block makes the server pin it while the rest of the job runs (first jobs
// 1.6-1.9 x one block).
constexpr int kMaxBlocks = 8;

// The job's lines in blocks: one when the job cannot be cut (its diagonal
// has not the length the job needs: the server names that error, on the
// whole job).
struct Blocks {
  internal::JobLines cut;
  std::vector<LineRange> ranges;
  size_t line_bytes = 0;
};

Blocks PlanBlocks(const Job& job, size_t matrix_bytes, int blocks_option) {
  Blocks plan;
  plan.cut = internal::LinesOfJob(job);
  const int64_t lines = std::max<int64_t>(plan.cut.lines, 1);
  plan.line_bytes = matrix_bytes / static_cast<size_t>(lines);
  const int64_t blocks = plan.cut.lines > 0 && plan.cut.diagonal_fits
                             ? std::clamp<int64_t>(blocks_option, 1, kMaxBlocks)
                             : 1;
  plan.ranges = SplitLines(lines, static_cast<int>(std::min(blocks, lines)));
  return plan;
}

void AddStats(const v1::JobStats& part, v1::JobStats* sum) {
  sum->set_queue_wait_ns(std::max(sum->queue_wait_ns(), part.queue_wait_ns()));
  sum->set_h2d_ns(sum->h2d_ns() + part.h2d_ns());
  sum->set_compute_ns(sum->compute_ns() + part.compute_ns());
  sum->set_d2h_ns(sum->d2h_ns() + part.d2h_ns());
  sum->set_total_ns(sum->total_ns() + part.total_ns());
  sum->set_bytes_in(sum->bytes_in() + part.bytes_in());
  sum->set_bytes_out(sum->bytes_out() + part.bytes_out());
}

// Where C lies in a staging region: over A (in place), or after A when C's
// dtype is wider than A's.
size_t ResultOffset(size_t matrix_bytes, size_t out_bytes) {
  return out_bytes == matrix_bytes ? 0 : (matrix_bytes + 255) / 256 * 256;
}

// Runs `job` on the staging `region` block by block: a thread copies A in, this
// thread runs each block's region job as soon as its lines are in, and
// another copies C out as soon as a block is done -- unless `out` overlaps A
// (in place), where C is copied out only after every block succeeded, so that
// a failed job leaves A whole for the socket path. On failure, the first
// error; `out` may then hold some blocks of C (never when it overlaps A).
// C is computed in place over A in the region, or, when its dtype is wider
// (`out_bytes` more than `matrix_bytes`), at ResultOffset in the region,
// each block at C's offset of its lines.

absl::StatusOr<JobResult> RunInBlocks(Client& client, const Job& job, SharedMemoryRegion& region,
                                      void* out, size_t matrix_bytes, size_t out_bytes,
                                      const ProgressCallback& progress, bool fresh,
                                      CancelToken* cancel, JobResult::SameHostPhases* phases) {
  const Blocks plan = PlanBlocks(job, matrix_bytes, client.options().same_host_blocks);
  const size_t count = plan.ranges.size();
  const char* a = static_cast<const char*>(job.matrix.data);
  char* c = static_cast<char*>(out);
  const bool overlaps = c < a + matrix_bytes && a < c + out_bytes;
  const size_t result_at = ResultOffset(matrix_bytes, out_bytes);
  const size_t out_line_bytes = out_bytes / (matrix_bytes / plan.line_bytes);
  const size_t hw = HardwareThreads();
  // One block: the copies take every thread; several: in and out share them.
  const size_t copy_threads =
      count == 1 ? std::min<size_t>(8, hw) : std::max<size_t>(1, std::min<size_t>(4, hw / 2));
  // A new region's first copy is bound by page faults (the kernel makes and
  // zeroes each page), not by memory bandwidth: it takes twice the threads.
  const size_t in_threads = fresh ? std::min<size_t>(2 * copy_threads, hw) : copy_threads;
  const auto offset = [&](size_t k) { return plan.ranges[k].first_line * plan.line_bytes; };
  const auto size = [&](size_t k) { return plan.ranges[k].lines * plan.line_bytes; };
  // Where block k of C lies, from the region's result (result_at) and `out`.
  const auto out_offset = [&](size_t k) { return plan.ranges[k].first_line * out_line_bytes; };
  const auto out_size = [&](size_t k) { return plan.ranges[k].lines * out_line_bytes; };

  std::mutex mu;
  std::condition_variable cv;
  size_t copied_in = 0;  // blocks whose lines are in the region
  size_t computed = 0;   // blocks whose job succeeded
  bool failed = false;
  double copy_in_s = 0, copy_out_s = 0;

  std::thread in([&] {
    for (size_t k = 0; k < count; ++k) {
      {
        std::lock_guard lock(mu);
        if (failed) return;
      }
      const auto start = std::chrono::steady_clock::now();
      ParallelCopy(region.bytes() + offset(k), a + offset(k), size(k), in_threads);
      copy_in_s += SecondsSince(start);
      std::lock_guard lock(mu);
      copied_in = k + 1;
      cv.notify_all();
    }
  });
  std::thread out_copier;
  if (!overlaps) {
    out_copier = std::thread([&] {
      for (size_t k = 0; k < count; ++k) {
        {
          std::unique_lock lock(mu);
          cv.wait(lock, [&] { return failed || computed > k; });
          if (failed) return;
        }
        const auto start = std::chrono::steady_clock::now();
        ParallelCopy(c + out_offset(k), region.bytes() + result_at + out_offset(k), out_size(k),
                     copy_threads);
        copy_out_s += SecondsSince(start);
      }
    });
  }

  absl::StatusOr<JobResult> whole = absl::UnknownError("no block ran");
  for (size_t k = 0; k < count; ++k) {
    {
      std::unique_lock lock(mu);
      cv.wait(lock, [&] { return copied_in > k; });
    }
    const Job part =
        internal::JobOfLines(job, plan.cut, plan.line_bytes, plan.ranges[k].first_line,
                             plan.ranges[k].lines);
    const v1::RegionRef at = region.Ref(static_cast<int64_t>(offset(k)));
    const v1::RegionRef to = region.Ref(static_cast<int64_t>(result_at + out_offset(k)));
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<JobResult> done = MultiplyRegion(client, RegionJobOf(part, at, to, cancel));
    phases->job += SecondsSince(start);
    if (!done.ok()) {
      whole = done.status();
      std::lock_guard lock(mu);
      failed = true;
      cv.notify_all();
      break;
    }
    if (k == 0) {
      whole = *std::move(done);
      whole->part_stats = {whole->stats};
    } else {
      AddStats(done->stats, &whole->stats);
      whole->part_stats.push_back(done->stats);
    }
    {
      std::lock_guard lock(mu);
      computed = k + 1;
      cv.notify_all();
    }
    // Sent: the lines the server has processed; received counts C once it
    // is in `out` (below).
    if (progress && k + 1 < count) {
      progress(static_cast<int64_t>(offset(k) + size(k)), 0, static_cast<int64_t>(matrix_bytes));
    }
  }
  in.join();
  if (out_copier.joinable()) out_copier.join();
  if (whole.ok() && overlaps) {
    const auto start = std::chrono::steady_clock::now();
    ParallelCopy(c, region.bytes() + result_at, out_bytes, std::min<size_t>(8, hw));
    copy_out_s += SecondsSince(start);
  }
  phases->copy_in = copy_in_s;
  phases->copy_out = copy_out_s;
  if (whole.ok() && progress) {
    const auto total = static_cast<int64_t>(matrix_bytes);
    progress(total, total, total);
  }
  return whole;
}

}  // namespace

absl::StatusOr<std::shared_ptr<Client::Staging>> Client::TakeStaging(size_t bytes) {
  {
    std::lock_guard lock(staging_mu_);
    // The smallest free one that fits.
    auto best = staging_.end();
    for (auto it = staging_.begin(); it != staging_.end(); ++it) {
      const size_t have = (*it)->bytes();
      if (have >= bytes && (best == staging_.end() || have < (*best)->bytes())) {
        best = it;
      }
    }
    if (best != staging_.end()) {
      std::shared_ptr<Staging> s = std::move(*best);
      staging_.erase(best);
      return s;
    }
  }
  // Unique among the regions of this uid: names are the uid's (with its
  // token), shared by every client object and process of it, and pids repeat
  // across PID namespaces.
  static std::atomic<uint64_t> made{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  const std::string name = absl::StrFormat("dgmm-staging-%d-%d-%08x", getpid(), made.fetch_add(1),
                                           static_cast<uint32_t>(rng()));
  auto region = SharedMemoryRegion::Create(*this, StagingSize(bytes), name);
  if (!region.ok()) return region.status();
  auto s = std::make_shared<Staging>();
  s->region = std::move(*region);
  return s;
}

void Client::ReturnStaging(std::shared_ptr<Staging> staging) {
  std::shared_ptr<Staging> dropped;
  {
    std::lock_guard lock(staging_mu_);
    staging_.push_back(std::move(staging));
    if (staging_.size() > kMaxFreeStaging) {
      // The smallest goes: jobs that needed it fit in the larger ones.
      auto smallest =
          std::min_element(staging_.begin(), staging_.end(),
                           [](const auto& a, const auto& b) { return a->bytes() < b->bytes(); });
      dropped = std::move(*smallest);
      staging_.erase(smallest);
    }
  }
  // Its bytes go back to the server's region budget now.
  if (dropped != nullptr) dropped->region->Unregister().IgnoreError();
}

std::optional<absl::StatusOr<JobResult>> Client::SameHostJob(const Job& job, void* out,
                                                             size_t matrix_bytes,
                                                             const ProgressCallback& progress,
                                                             Lane* probe, CancelToken* cancel,
                                                             std::string* why) {
  const auto reason = [](const absl::Status& s) {
    return absl::StrCat(absl::StatusCodeToString(s.code()), ": ", s.message());
  };
  {
    std::lock_guard lock(staging_mu_);
    if (!same_host_off_.ok() && absl::Now() - same_host_checked_ < kRecheckAfter) {
      *why = reason(same_host_off_);
      return std::nullopt;
    }
  }
  const auto not_here = [&](const absl::Status& s) -> std::optional<absl::StatusOr<JobResult>> {
    *why = reason(s);
    // The server's own verdicts (no socket path, regions off, ...) hold
    // for a while; a connection that could not be had is tried again next
    // job. One waited for in vain for the whole reconnect wait ends the job:
    // the socket would wait as long again for the same server.
    if (ReconnectWaitSpent(s)) return absl::StatusOr<JobResult>(s);
    if (s.code() == absl::StatusCode::kUnavailable) return std::nullopt;
    std::lock_guard lock(staging_mu_);
    same_host_off_ = s;
    same_host_checked_ = absl::Now();
    return std::nullopt;
  };
  // C's size: more than A's for a result of a wider dtype (CheckBuffers
  // has checked that it is known).
  const size_t out_bytes = ResultBytes(job).value_or(matrix_bytes);
  // The caller's data already in this client's regions: no copy at all.
  if (std::optional<v1::RegionRef> in = OwnRegionRef(job.matrix.data, matrix_bytes)) {
    if (std::optional<v1::RegionRef> at = OwnRegionRef(out, out_bytes)) {
      const auto start = std::chrono::steady_clock::now();
      absl::StatusOr<JobResult> done = MultiplyRegion(*this, RegionJobOf(job, *in, *at, cancel));
      if (done.ok()) {
        done->same_host.job = SecondsSince(start);
        done->mode = TransferMode::kRegion;
        done->received_bytes = static_cast<int64_t>(out_bytes);
        done->part_stats = {done->stats};
        return done;
      }
      // In place, A may be half-written: only a job into other memory can
      // be run again over the socket.
      if (out == job.matrix.data || !SocketCanStillDoIt(done.status())) {
        return absl::StatusOr<JobResult>(done.status());
      }
      *why = absl::StrCat("the job on this client's region failed, so the socket carried it: ",
                          reason(done.status()));
      return std::nullopt;
    }
  }
  const auto setup_start = std::chrono::steady_clock::now();
  // The session: the server's local socket, reached and its own. Whether
  // the server takes regions is asked on the connection the job would use
  // over the socket: a server that does not costs no connection more.
  {
    bool open;
    {
      std::lock_guard lock(session_mu_);
      open = session_ != nullptr && session_->open();
    }
    if (!open) {
      absl::StatusOr<v1::GetServerInfoResponse> info = InfoOn(probe);
      if (!info.ok()) return not_here(info.status());
      absl::StatusOr<std::shared_ptr<LocalSession>> session = RegionSessionWith(*info);
      if (!session.ok()) return not_here(session.status());
    }
  }
  // The caller's own memory, read and written by the server: no staging,
  // no copy.
  std::shared_ptr<LocalSession> session;
  {
    std::lock_guard lock(session_mu_);
    session = session_;
  }
  if (options_.process_memory && session != nullptr && session->process_memory()) {
    const double setup = SecondsSince(setup_start);
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<JobResult> done = MultiplyRegion(
        *this,
        RegionJobOf(job, ProcessMemoryRef(job.matrix.data), ProcessMemoryRef(out), cancel));
    if (done.ok()) {
      done->same_host.setup = setup;
      done->same_host.job = SecondsSince(start);
      done->mode = TransferMode::kRegion;
      done->process_memory = true;
      done->received_bytes = static_cast<int64_t>(out_bytes);
      done->part_stats = {done->stats};
      return done;
    }
    // As for a job in the caller's regions: in place, A may be half-written.
    if (out == job.matrix.data || !SocketCanStillDoIt(done.status())) {
      return absl::StatusOr<JobResult>(done.status());
    }
    *why = absl::StrCat("the job in this process's memory failed, so the socket carried it: ",
                        reason(done.status()));
    return std::nullopt;
  }
  // Twice at most: a staging region the server dropped (idle past its
  // timeout) is replaced once.
  for (int attempt = 0;; ++attempt) {
    // A and, when C is wider, C after it (RunInBlocks).
    absl::StatusOr<std::shared_ptr<Staging>> staging =
        TakeStaging(ResultOffset(matrix_bytes, out_bytes) + out_bytes);
    if (!staging.ok()) {
      // A full region budget or too many regions: this job goes over the
      // socket, and the path is tried again for later ones.
      if (staging.status().code() != absl::StatusCode::kResourceExhausted) {
        return not_here(staging.status());
      }
      *why = reason(staging.status());
      return std::nullopt;
    }
    JobResult::SameHostPhases phases;
    phases.setup = SecondsSince(setup_start);
    SharedMemoryRegion& region = *(*staging)->region;
    const bool fresh = !(*staging)->used;
    (*staging)->used = true;
    absl::StatusOr<JobResult> done =
        RunInBlocks(*this, job, region, out, matrix_bytes, out_bytes, progress, fresh, cancel,
                    &phases);
    if (done.ok()) {
      ReturnStaging(*std::move(staging));
      done->mode = TransferMode::kRegion;
      done->stripes = 1;
      done->received_bytes = static_cast<int64_t>(out_bytes);
      done->same_host = phases;
      return done;
    }
    const absl::StatusCode code = done.status().code();
    if (code == absl::StatusCode::kNotFound) {
      // This staging region is gone (dropped while idle): not reused.
      (*staging)->region->Abandon();
      if (attempt == 0) continue;
    } else if (code == absl::StatusCode::kUnauthenticated ||
               code == absl::StatusCode::kUnavailable) {
      // The session (or the server) went: so did every staging region.
      std::vector<std::shared_ptr<Staging>> stale;
      std::lock_guard lock(staging_mu_);
      stale.swap(staging_);
    } else {
      ReturnStaging(*std::move(staging));  // still registered and good
    }
    if (!SocketCanStillDoIt(done.status()) || ReconnectWaitSpent(done.status())) {
      return absl::StatusOr<JobResult>(done.status());
    }
    *why =
        absl::StrCat("the same-host job failed, so the socket carried it: ", reason(done.status()));
    return std::nullopt;
  }
}

}  // namespace dgmm
