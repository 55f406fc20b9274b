// Bounds the bytes of Multiply requests that gRPC holds for the server before
// their jobs are admitted.
//
// gRPC assembles a message whole before a handler sees it, and checks its
// size only then. So Multiply is served as a stream at the transport level
// (handlers.cc): its call starts before its message is read, and the message
// is read only once the gate grants it room for the largest request allowed
// (--max_unary_message_bytes). A call waiting here reads nothing: HTTP/2 flow
// control holds its client to the stream's initial window. Once the message
// is in, the hold shrinks to the message's real size, and it is released
// when the job is admitted (the job's reservation then covers those bytes)
// or the call ends.
//
// Waiting calls are served clients in turn: the waiter whose client holds
// the fewest bytes goes first, arrival order breaking ties. Thread-safe.
#ifndef DGMM_SERVICE_JOB_RECEIVE_GATE_H_
#define DGMM_SERVICE_JOB_RECEIVE_GATE_H_

#include <algorithm>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <mutex>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dgmm {

class ReceiveGate {
 public:
  // Runs once for a queued call: OK when it now holds its bytes, or the
  // status it was cancelled with. Never under the gate's lock.
  using Granted = std::function<void(absl::Status)>;
  using Ticket = uint64_t;

  // `capacity`: bytes of requests held at once. `max_waiting`: calls that may
  // wait; beyond it Acquire fails with RESOURCE_EXHAUSTED.
  ReceiveGate(int64_t capacity, int max_waiting);

  struct Acquired {
    bool granted = false;  // true: the bytes are held now, `granted` will not run
    Ticket ticket = 0;     // else: queued; Cancel with this ticket
  };
  // Asks for `bytes` for `client`. Granted at once when they fit and nobody
  // waits; else queued (`granted` runs later); RESOURCE_EXHAUSTED (with a
  // retry pushback) when max_waiting calls already wait.
  absl::StatusOr<Acquired> Acquire(const std::string& client, int64_t bytes, Granted granted);
  // Ends a queued wait with `why` (its callback runs with it); no effect once
  // granted.
  void Cancel(Ticket ticket, absl::Status why);
  // Lowers a granted hold of `from` bytes to `to` bytes, or returns it all
  // (to = 0), letting waiters in.
  void Shrink(const std::string& client, int64_t from, int64_t to);

  // What a read of a message whose size is not known yet is charged, for a
  // limit of `max_message` bytes: the limit, and at least a quarter of the
  // capacity. gRPC takes in a message whole, whatever its length prefix
  // says, before the server can check it against the limit: so at most four
  // reads of unknown size run at once however small the limit, and what
  // messages over the limit hold while they arrive does not grow as the
  // limit shrinks (docs/operations.md §12).
  static constexpr int kMaxUnsizedReads = 4;
  int64_t UnsizedCharge(int64_t max_message) const {
    return std::max(max_message, capacity_ / kMaxUnsizedReads);
  }

  int64_t held() const;
  int waiting() const;
  int64_t capacity() const { return capacity_; }

 private:
  struct Waiter {
    Ticket ticket;
    std::string client;
    int64_t bytes;
    Granted granted;
  };
  using Fired = std::list<std::pair<Granted, absl::Status>>;
  void PumpLocked(Fired* fired);

  const int64_t capacity_;
  const int max_waiting_;
  mutable std::mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, int64_t> held_by_client_ ABSL_GUARDED_BY(mu_);
  std::list<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  Ticket next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_JOB_RECEIVE_GATE_H_
