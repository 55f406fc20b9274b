// The read side that a Multiply call and a MultiplyBatch call share: their
// request is one message, which gRPC takes in whole, so the call asks for it
// only once the ReceiveGate has room (charged ReceiveGate::UnsizedCharge
// until its size is known), holds what it really takes until its job is
// admitted, ends with DEADLINE_EXCEEDED when it does not arrive within
// --stream_header_timeout_s, cancels at the transport a reply the client
// does not take within --stream_idle_timeout_s, and ends once, with a reply
// or a status. UnaryJob and BatchJob (unary_job.h, batch_job.h) add what
// they do with the request. gRPC-free.
#ifndef DGMM_SERVICE_JOB_GATED_CALL_H_
#define DGMM_SERVICE_JOB_GATED_CALL_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/core/host_buffers.h"
#include "service/job/intake.h"
#include "service/job/receive_gate.h"
#include "service/job/session.h"
#include "service/job/watchdog.h"
#include "service/pipeline/stages.h"

namespace dgmm {

// What a gated call asks of the RPC layer besides its reply. Finish-like
// calls (the reply, Fail) come once.
class GatedCallIo {
 public:
  virtual ~GatedCallIo() = default;
  virtual void StartRead() = 0;
  virtual void Fail(const absl::Status& status) = 0;
  // Cancels the call at the transport (a reply the client never takes).
  virtual void CancelCall() = 0;
};

class GatedCall : public StreamWatchdog::Watched,
                  public std::enable_shared_from_this<GatedCall> {
 public:
  // Waits at the gate (or refuses at once), then asks io for the request.
  void Begin();
  // The call was cancelled or its deadline passed.
  void OnCancel();
  // gRPC is done with the call: io is not used again; what the call holds
  // (at the gate, its job's reservation) goes back.
  void Detach();
  void CheckIdle(absl::Time now) override;

 protected:
  // `method` names the call in messages ("Multiply", "MultiplyBatch").
  GatedCall(std::shared_ptr<JobSession> session, const Intake* intake, ReceiveGate* gate,
            StreamTimeouts timeouts, GatedCallIo* io, const char* method)
      : session_(std::move(session)),
        intake_(intake),
        gate_(gate),
        timeouts_(timeouts),
        method_(method),
        io_(io),
        live_io_(io) {}

  // The request arrived (`arrived`) or the call ended without one. False:
  // the call is over (ended here, or by the watchdog meanwhile). True: the
  // gate now holds `size`, what the message takes, until ReleaseGate.
  bool Arrived(bool arrived, bool call_cancelled, int64_t size);
  // Ends the call once: OK with the reply SendReply sends, else Fail.
  void Finish(const absl::Status& s);
  void ReleaseGate();
  // Gives the gate's room back and ends the call with `s`.
  void End(const absl::Status& s);
  // Counts the refusal, gives the gate's room back and ends the call.
  void Refuse(const absl::Status& s);
  template <class T>
  std::shared_ptr<T> self() {
    return std::static_pointer_cast<T>(shared_from_this());
  }
  // The callback a job's admission calls: the gate's room goes back (the
  // job's reservation covers the request now), then T's `run` goes on with
  // the admitted job, or the call ends with why it was not admitted.
  template <class T, class Admitted>
  std::function<void(absl::StatusOr<Admitted>)> AfterAdmission(void (T::*run)(Admitted)) {
    return [self = self<T>(), run](absl::StatusOr<Admitted> admitted) {
      self->ReleaseGate();
      if (!admitted.ok()) return self->Finish(admitted.status());
      ((*self).*run)(*std::move(admitted));
    };
  }

  const std::shared_ptr<JobSession> session_;
  const Intake* const intake_;
  ReceiveGate* const gate_;
  const StreamTimeouts timeouts_;
  std::mutex mu_;

 private:
  // Sends the reply on `io`, under mu_.
  virtual void SendReply(GatedCallIo* io) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) = 0;
  // Lets the job's reservation go (Detach), outside mu_.
  virtual void DropJob() = 0;
  void OnGate(const absl::Status& s);

  const char* const method_;
  GatedCallIo* io_ ABSL_GUARDED_BY(mu_);                                 // null once finished
  std::optional<ReceiveGate::Ticket> gate_ticket_ ABSL_GUARDED_BY(mu_);  // waiting
  int64_t gate_hold_ ABSL_GUARDED_BY(mu_) = 0;                           // bytes held at the gate
  std::optional<absl::Time> reading_since_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Time> replied_at_ ABSL_GUARDED_BY(mu_);
  // Cancelling at the transport stays possible after Finish, until Detach.
  std::mutex live_mu_;
  GatedCallIo* live_io_ ABSL_GUARDED_BY(live_mu_);
};

// One whole job on its device: A copied by `copy_a` into a block buffer of
// the job's device, C computed in place or, when C is wider than A
// (`c_bytes` > `a_bytes`), into a second buffer of C's size. Returns the
// buffer that holds C. The job is not ended (ComputeStage::End).
absl::StatusOr<HostBuffer> ComputeWhole(ComputeStage& stage, int64_t a_bytes, int64_t c_bytes,
                                        int64_t lines,
                                        absl::FunctionRef<absl::Status(std::byte*)> copy_a,
                                        const CancelFn& cancelled);

}  // namespace dgmm

#endif  // DGMM_SERVICE_JOB_GATED_CALL_H_
