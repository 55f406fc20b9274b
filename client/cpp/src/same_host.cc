// The same-host path of Client::Multiply (issue 25; ClientOptions.same_host):
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
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "dgmm/client.h"
#include "dgmm/regions.h"

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

// memcpy with up to 8 threads (the copies are memory-bound: a few threads
// reach the host's bandwidth where one does not).
void ParallelCopy(char* dst, const char* src, size_t bytes) {
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t parts = std::min<size_t>({8, hw, std::max<size_t>(1, bytes / kParallelCopyBytes)});
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
                                                             Lane* probe, std::string* why) {
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
    std::lock_guard lock(staging_mu_);
    same_host_off_ = s;
    same_host_checked_ = absl::Now();
    *why = reason(s);
    return std::nullopt;
  };
  // The caller's data already in this client's regions: no copy at all.
  if (std::optional<v1::RegionRef> in = OwnRegionRef(job.matrix.data, matrix_bytes)) {
    if (std::optional<v1::RegionRef> at = OwnRegionRef(out, matrix_bytes)) {
      absl::StatusOr<JobResult> done = MultiplyRegion(*this, RegionJobOf(job, *in, *at));
      if (done.ok()) {
        done->mode = TransferMode::kRegion;
        done->received_bytes = static_cast<int64_t>(matrix_bytes);
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
  // Twice at most: a staging region the server dropped (idle past its
  // timeout) is replaced once.
  for (int attempt = 0;; ++attempt) {
    absl::StatusOr<std::shared_ptr<Staging>> staging = TakeStaging(matrix_bytes);
    if (!staging.ok()) {
      // A full region budget or too many regions: this job goes over the
      // socket, and the path is tried again for later ones.
      if (staging.status().code() != absl::StatusCode::kResourceExhausted) {
        return not_here(staging.status());
      }
      *why = reason(staging.status());
      return std::nullopt;
    }
    SharedMemoryRegion& region = *(*staging)->region;
    ParallelCopy(region.bytes(), static_cast<const char*>(job.matrix.data), matrix_bytes);
    if (progress) {
      progress(static_cast<int64_t>(matrix_bytes), 0, static_cast<int64_t>(matrix_bytes));
    }
    // In place: the staging holds a copy of A.
    absl::StatusOr<JobResult> done =
        MultiplyRegion(*this, RegionJobOf(job, region.Ref(0), region.Ref(0)));
    if (done.ok()) {
      ParallelCopy(static_cast<char*>(out), region.bytes(), matrix_bytes);
      ReturnStaging(*std::move(staging));
      if (progress) {
        progress(static_cast<int64_t>(matrix_bytes), static_cast<int64_t>(matrix_bytes),
                 static_cast<int64_t>(matrix_bytes));
      }
      done->mode = TransferMode::kRegion;
      done->stripes = 1;
      done->received_bytes = static_cast<int64_t>(matrix_bytes);
      done->part_stats = {done->stats};
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
    if (!SocketCanStillDoIt(done.status())) return absl::StatusOr<JobResult>(done.status());
    *why = absl::StrCat("the same-host job failed, so the socket carried it: ",
                        reason(done.status()));
    return std::nullopt;
  }
}

}  // namespace dgmm
