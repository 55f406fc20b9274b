#include "service/job/unary_job.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dgmm {

void UnaryJob::BeginRead(std::unique_ptr<UnaryRequest> request) {
  if (session_->engine().draining()) {
    Refuse(absl::UnavailableError("server is draining; retry on another replica"));
    return;
  }
  small_ = true;
  OnRequest(std::move(request), /*call_cancelled=*/false);
}

void UnaryJob::OnRequest(std::unique_ptr<UnaryRequest> request, bool call_cancelled) {
  const int64_t size = request == nullptr ? 0 : request->size();
  if (!Arrived(request != nullptr, call_cancelled, size)) return;
  JobDraft draft;
  draft.kind = JobKind::kUnary;
  draft.message_bytes = size;
  draft.small = small_;
  draft.method = names_.method;
  draft.too_large_advice = names_.too_large_advice;
  draft.call = session_->Call(small_ ? "MultiplySmall" : names_.method);
  draft.decoded = request->Peek(&draft.header, &draft.matrix_bytes);
  IntakenJob intaken;
  if (absl::Status s = intake_->Check(draft, &intaken); !s.ok()) return End(s);
  matrix_bytes_ = draft.matrix_bytes;
  result_bytes_ = intaken.job.problem.out_matrix_bytes();
  lines_ = intaken.job.problem.lines();
  request_ = std::move(request);
  absl::Status started = session_->Start(intaken.job, JobMode::kWhole,
                                         AfterAdmission(&UnaryJob::Run), /*run_here=*/true);
  if (!started.ok()) End(started);
}

void UnaryJob::Run(std::shared_ptr<ComputeStage> stage) {
  absl::StatusOr<HostBuffer> c =
      session_->cancelled()
          ? absl::StatusOr<HostBuffer>(session_->cancelled_status())
          : ComputeWhole(
                *stage, matrix_bytes_, result_bytes_, lines_,
                [this](std::byte* a) {
                  absl::Status copied = request_->CopyMatrix(a, matrix_bytes_);
                  request_.reset();  // the transport's buffers go back now
                  return copied;
                },
                [session = session_] { return session->cancelled(); });
  request_.reset();
  const absl::Status s = c.status();
  stage->End(s, matrix_bytes_, s.ok() ? result_bytes_ : 0);
  if (s.ok()) result_ = std::move(*c);
  {
    std::lock_guard lock(mu_);
    stage_ = std::move(stage);  // its reservation goes back once the reply is sent
  }
  Finish(s);
}

void UnaryJob::SendReply(GatedCallIo* io) {
  static_cast<UnaryIo*>(io)->Reply(std::move(*result_), static_cast<size_t>(result_bytes_),
                                   stage_->job().stats());
}

void UnaryJob::DropJob() {
  std::shared_ptr<ComputeStage> stage;
  {
    std::lock_guard lock(mu_);
    stage = std::move(stage_);
  }
}

}  // namespace dgmm
