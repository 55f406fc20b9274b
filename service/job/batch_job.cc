#include "service/job/batch_job.h"

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/core/outcome.h"

namespace dgmm {
namespace {

// Each result's place in the reply's buffer starts on a 64-byte boundary.
int64_t AlignUp(int64_t n) { return (n + 63) & ~int64_t{63}; }

}  // namespace

void BatchJob::OnRequest(std::unique_ptr<BatchRequest> request, bool call_cancelled) {
  const int64_t size = request == nullptr ? 0 : request->size();
  if (!Arrived(request != nullptr, call_cancelled, size)) return;
  const RequestLimits& limits = session_->engine().options().limits;
  // The batch's own checks, before any job's: its size, its framing, its count.
  if (size > limits.max_unary_message_bytes) {
    Refuse(WithOutcome(
        absl::ResourceExhaustedError(absl::StrCat(
            "MultiplyBatch request of ", size, " bytes exceeds this server's max unary message of ",
            limits.max_unary_message_bytes,
            " bytes (--max_unary_message_bytes); send fewer jobs per batch")),
        Outcome::kMessageTooLarge));
    return;
  }
  int64_t total_jobs = 0;
  if (absl::Status s = request->Peek(limits.max_batch_jobs, &jobs_, &total_jobs); !s.ok()) {
    Refuse(s);
    return;
  }
  if (total_jobs > limits.max_batch_jobs) {
    Refuse(WithOutcome(
        absl::ResourceExhaustedError(absl::StrCat(
            "MultiplyBatch of ", total_jobs, " jobs exceeds this server's ", limits.max_batch_jobs,
            " jobs per batch (--max_batch_jobs); split the batch")),
        Outcome::kMessageTooLarge));
    return;
  }
  // Each job through the intake, as a Multiply request of its own.
  reply_.jobs.resize(jobs_.size());
  intaken_.resize(jobs_.size());
  std::vector<const JobRequest*> valid_jobs;
  int64_t results_bytes = 0;
  const JobCall call = session_->Call("MultiplyBatch");
  for (size_t i = 0; i < jobs_.size(); ++i) {
    const BatchRequest::Job& job = jobs_[i];
    JobDraft draft;
    draft.call = call;
    draft.kind = JobKind::kUnary;
    draft.message_bytes = job.message_bytes;
    draft.decoded = job.decoded;
    draft.header = job.header;
    draft.matrix_bytes = job.matrix_bytes;
    intaken_[i] = std::make_unique<IntakenJob>();
    reply_.jobs[i].status = intake_->Check(draft, intaken_[i].get());
    if (!reply_.jobs[i].status.ok()) continue;
    valid_.push_back(i);
    valid_jobs.push_back(&intaken_[i]->job);
    reply_.jobs[i].offset = results_bytes;
    // The result is C's size (more than A's for a promoted result).
    reply_.jobs[i].bytes = intaken_[i]->job.problem.out_matrix_bytes();
    results_bytes += AlignUp(reply_.jobs[i].bytes);
  }
  if (valid_.empty()) {
    // Nothing to run (an empty batch, or every job refused): the statuses.
    return End(absl::OkStatus());
  }
  request_ = std::move(request);
  absl::Status started =
      session_->StartBatch(valid_jobs, AfterAdmission(&BatchJob::Run), /*run_here=*/true);
  if (!started.ok()) End(started);
}

void BatchJob::Run(std::unique_ptr<AdmittedBatch> batch) {
  for (size_t i : valid_) reply_.results_bytes += AlignUp(reply_.jobs[i].bytes);
  // From the CPU's pool: memory already mapped and reused from call to call
  // (a fresh allocation per batch cost its page faults), and sent from in
  // place (large results as slices of it).
  absl::StatusOr<HostBuffer> results =
      session_->engine().host_block_buffers().Take(reply_.results_bytes);
  if (!results.ok()) {
    // Every job ends with the allocation's error, each counted once.
    for (size_t k = 0; k < valid_.size(); ++k) {
      session_->Refuse(results.status(), &intaken_[valid_[k]]->job);
    }
    {
      std::lock_guard lock(mu_);
      batch_ = std::move(batch);
    }
    request_.reset();
    Finish(results.status());
    return;
  }
  reply_.results = std::move(*results);
  const CancelFn cancelled = [session = session_] { return session->cancelled(); };
  absl::Status call_status;
  for (size_t k = 0; k < valid_.size(); ++k) {
    const size_t i = valid_[k];
    BatchReply::Job& out = reply_.jobs[i];
    if (session_->cancelled()) {
      // The call is over: the jobs not run yet end here, each counted once.
      call_status = session_->cancelled_status();
      for (size_t rest = k; rest < valid_.size(); ++rest) {
        session_->Refuse(call_status, &intaken_[valid_[rest]]->job);
      }
      break;
    }
    absl::StatusOr<std::unique_ptr<ActiveJob>> active = batch->Activate(k);
    if (!active.ok()) {
      out.status = active.status();  // counted by the engine
      continue;
    }
    ComputeStage stage(std::move(*active),
                       [session = session_] { return session->cancelled_status(); });
    const Problem& problem = intaken_[i]->job.problem;
    const int64_t bytes = problem.matrix_bytes();
    const int64_t out_bytes = out.bytes;  // C's
    const bool wider = out_bytes != bytes;
    const int64_t lines = problem.lines();
    std::byte* place = reply_.results.data() + out.offset;
    absl::Status s;
    if (stage.job().stats().device_index < 0) {
      if (!wider) {
        // The CPU computes in place, in the reply's buffer.
        s = request_->CopyMatrix(i, place, bytes);
        if (s.ok()) s = stage.Process(place, 0, lines, cancelled);
      } else {
        // C wider than A: A in a block buffer, C computed into the reply's.
        absl::StatusOr<HostBuffer> buffer = stage.job().block_buffers().Take(bytes);
        s = buffer.ok() ? request_->CopyMatrix(i, buffer->data(), bytes) : buffer.status();
        if (s.ok()) {
          s = stage.ProcessTile(
              Tile{.in = buffer->data(), .out = place, .first_line = 0, .lines = lines}, cancelled);
        }
      }
    } else {
      // A GPU job as a unary one: through a block buffer of its device (and
      // one of C's size when C is wider), then into the reply's buffer.
      absl::StatusOr<HostBuffer> c = ComputeWhole(
          stage, bytes, out_bytes, lines,
          [&](std::byte* a) { return request_->CopyMatrix(i, a, bytes); }, cancelled);
      s = c.status();
      if (s.ok()) std::memcpy(place, c->data(), static_cast<size_t>(out_bytes));
    }
    stage.End(s, bytes, s.ok() ? out_bytes : 0);
    out.status = s;
    out.stats = stage.job().stats();
  }
  request_.reset();  // the transport's buffers go back now
  {
    std::lock_guard lock(mu_);
    batch_ = std::move(batch);  // its reservation goes back once the reply is sent
  }
  Finish(call_status);
}

void BatchJob::SendReply(GatedCallIo* io) {
  static_cast<BatchIo*>(io)->Reply(std::move(reply_));
}

void BatchJob::DropJob() {
  std::unique_ptr<AdmittedBatch> batch;
  {
    std::lock_guard lock(mu_);
    batch = std::move(batch_);
  }
}

}  // namespace dgmm
