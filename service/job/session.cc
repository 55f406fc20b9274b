#include "service/job/session.h"

#include <utility>

namespace dgmm {
namespace {

constexpr absl::Duration kDeadlineMargin = absl::Milliseconds(250);

}  // namespace

absl::Status CancelledStatus(absl::Time deadline) {
  if (absl::Now() + kDeadlineMargin >= deadline) {
    return absl::DeadlineExceededError("the client's deadline expired while the job waited or ran");
  }
  return absl::CancelledError("the client cancelled the call");
}

absl::Status JobSession::Start(const JobRequest& job, JobMode mode, Admitted admitted,
                              bool run_here) {
  std::unique_lock lock(mu_);
  std::unique_ptr<ActiveJob> here;
  auto run = std::make_shared<Admitted>(std::move(admitted));
  auto ticket = engine_->Start(
      job, mode, call_.arrived, call_.deadline,
      [self = shared_from_this(), run](absl::StatusOr<std::unique_ptr<ActiveJob>> job) {
        if (!job.ok()) {
          (*run)(job.status());
          return;
        }
        (*run)(std::make_shared<ComputeStage>(
            std::move(*job), [self] { return self->cancelled_status(); }));
      },
      call_.id(), run_here ? &here : nullptr);
  if (!ticket.ok()) return ticket.status();
  ticket_ = *ticket;
  lock.unlock();
  if (here != nullptr) {
    // Admitted at once and small: run here, with no lock held. A cancel
    // that came meanwhile is seen by the job (cancelled()), as on a worker.
    (*run)(std::make_shared<ComputeStage>(
        std::move(here), [self = shared_from_this()] { return self->cancelled_status(); }));
    return absl::OkStatus();
  }
  // A cancel that came before the ticket existed found nothing to cancel:
  // both sides publish before they look, so one of them sees the other.
  if (cancelled_) engine_->Cancel(*ticket, cancelled_status());
  return absl::OkStatus();
}

absl::Status JobSession::StartBatch(const std::vector<const JobRequest*>& jobs,
                                    AdmittedBatchFn admitted, bool run_here) {
  std::unique_lock lock(mu_);
  std::unique_ptr<AdmittedBatch> here;
  auto run = std::make_shared<AdmittedBatchFn>(std::move(admitted));
  auto ticket = engine_->StartBatch(
      jobs, call_.arrived, call_.deadline,
      [run](absl::StatusOr<std::unique_ptr<AdmittedBatch>> batch) { (*run)(std::move(batch)); },
      call_.id(), run_here ? &here : nullptr);
  if (!ticket.ok()) return ticket.status();
  ticket_ = *ticket;
  lock.unlock();
  if (here != nullptr) {
    (*run)(std::move(here));  // as Start's: no lock held
    return absl::OkStatus();
  }
  if (cancelled_) engine_->Cancel(*ticket, cancelled_status());
  return absl::OkStatus();
}

void JobSession::Cancel() {
  cancelled_ = true;
  std::optional<Admission::Ticket> ticket;
  {
    std::lock_guard lock(mu_);
    ticket = ticket_;
  }
  if (ticket.has_value()) engine_->Cancel(*ticket, cancelled_status());
}

void JobSession::Refuse(const absl::Status& s, const JobRequest* job) {
  if (job != nullptr) {
    engine_->Refused(0, s, *job);
  } else {
    engine_->metrics().Refused(0, s);
  }
}

}  // namespace dgmm
