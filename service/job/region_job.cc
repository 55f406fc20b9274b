#include "service/job/region_job.h"

#include <optional>
#include <utility>

#include "absl/strings/str_format.h"
#include "service/core/log.h"

namespace dgmm {

void RegionJob::Begin(const v1::MultiplyRegionRequest& request, const absl::Status& decoded,
                      const std::string& owner,
                      std::shared_ptr<const ProcessMemory> process_memory) {
  if (TraceJobs()) trace_.begin = absl::Now();
  JobDraft draft;
  draft.kind = JobKind::kRegion;
  draft.decoded = decoded;
  draft.header = &request.header();
  draft.region = &request;
  draft.owner = owner;
  draft.process_memory = std::move(process_memory);
  draft.call = session_->Call("MultiplyRegion");
  if (absl::Status s = intake_->Check(draft, &job_); !s.ok()) {
    ReleaseRegions();
    Finish(s);
    return;
  }
  if (TraceJobs()) trace_.begun = absl::Now();
  // The job's diagonal is copied by Start; the request may go after it.
  absl::Status started = session_->Start(
      job_.job, job_.mode,
      [self = shared_from_this()](absl::StatusOr<std::shared_ptr<ComputeStage>> admitted) {
        self->Run(std::move(admitted));
      },
      /*run_here=*/true);
  if (!started.ok()) {
    ReleaseRegions();
    Finish(started);
  }
}

void RegionJob::Run(absl::StatusOr<std::shared_ptr<ComputeStage>> admitted) {
  if (TraceJobs()) trace_.run = absl::Now();
  // The regions are let go before the reply, so that a client that
  // unregisters right after it sees its memory released.
  std::shared_ptr<Region> matrix = std::move(job_.matrix);
  std::shared_ptr<Region> result = std::move(job_.result);
  if (!admitted.ok()) {
    matrix.reset();
    result.reset();
    Finish(admitted.status());
    return;
  }
  std::shared_ptr<ComputeStage> stage = std::move(*admitted);
  absl::Status s;
  const auto cancel = [session = session_] { return session->cancelled(); };
  if (job_.process_memory != nullptr) {
    // The client's own memory: proven still the client's (its cookie in
    // place) just before the copies.
    s = session_->cancelled() ? session_->cancelled_status() : job_.process_memory->Check();
    // Every byte of A readable and of C writable before any is touched: a
    // job that cannot finish writes none of C.
    if (s.ok()) {
      s = job_.process_memory->CheckMapped(
          {{reinterpret_cast<uint64_t>(job_.in), job_.job.problem.matrix_bytes(), 'r'},
           {reinterpret_cast<uint64_t>(job_.out), job_.job.problem.out_matrix_bytes(), 'w'}});
    }
    if (TraceJobs()) trace_.checked = absl::Now();
    if (s.ok()) {
      s = stage->ProcessTile(Tile{.in = job_.in, .out = job_.out, .first_line = 0,
                                  .lines = job_.job.problem.lines(),
                                  .memory = job_.process_memory.get()},
                             cancel);
    }
  } else {
    Region::Use matrix_use(std::move(matrix));
    std::optional<Region::Use> result_use;  // one use when in place
    if (result.get() != &*matrix_use) result_use.emplace(std::move(result));
    result.reset();
    if (registry_ != nullptr) {
      registry_->NoteJob(matrix_use.region());
      if (result_use.has_value()) registry_->NoteJob(result_use->region());
    }
    const Tile tile{.in = job_.in, .out = job_.out, .first_line = 0,
                    .lines = job_.job.problem.lines()};
    if (TraceJobs()) trace_.checked = absl::Now();
    s = session_->cancelled() ? session_->cancelled_status() : stage->ProcessTile(tile, cancel);
    if (s.ok()) s = matrix_use->CheckIntact();
    if (s.ok() && result_use.has_value()) s = (*result_use)->CheckIntact();
  }
  const int64_t bytes = job_.job.problem.matrix_bytes();
  if (TraceJobs()) trace_.tile = absl::Now();
  stage->End(s, s.ok() ? bytes : 0, s.ok() ? job_.job.problem.out_matrix_bytes() : 0);
  const JobStats stats = stage->job().stats();
  if (TraceJobs()) trace_.ended = absl::Now();
  stage.reset();  // the reservation goes back before the reply
  if (TraceJobs()) {
    trace_.released = absl::Now();
    const absl::Time arrived = session_->call().arrived;
    const auto ms = [](absl::Time from, absl::Time to) {
      return absl::ToDoubleMilliseconds(to - from);
    };
    LogInfo(absl::StrFormat(
        "trace: region job of %d bytes: arrival to Begin %.3f ms, intake %.3f ms, admission "
        "to Run %.3f ms, Run to the tile (memory checks) %.3f ms, the tile %.3f ms, End %.3f ms, "
        "stage released %.3f ms",
        bytes, ms(arrived, trace_.begin), ms(trace_.begin, trace_.begun),
        ms(trace_.begun, trace_.run), ms(trace_.run, trace_.checked),
        ms(trace_.checked, trace_.tile), ms(trace_.tile, trace_.ended),
        ms(trace_.ended, trace_.released)));
  }
  Finish(s, stats);
}

void RegionJob::ReleaseRegions() {
  job_.process_memory.reset();
  job_.matrix.reset();
  job_.result.reset();
  job_.diagonal_region.reset();
}

void RegionJob::Finish(const absl::Status& s, const JobStats& stats) {
  RegionIo* io = nullptr;
  {
    std::lock_guard lock(mu_);
    io = std::exchange(io_, nullptr);
  }
  // Not under mu_: gRPC is not done with the call before Finish, so Detach
  // cannot clear io meanwhile.
  if (io != nullptr) io->Finish(s, stats);
}

void RegionJob::Detach() {
  std::lock_guard lock(mu_);
  io_ = nullptr;
}

}  // namespace dgmm
