// Why a job ended: the outcome counters of GetServerInfo and /metrics.
#ifndef DGMM_SERVICE_CORE_OUTCOME_H_
#define DGMM_SERVICE_CORE_OUTCOME_H_

#include "absl/status/status.h"

namespace dgmm {

// Why a job ended otherwise than OK; the keys of the rejected_jobs counters
// (OutcomeName). Each is decided where the refusal is made and travels with
// the status (WithOutcome), so that a counter never guesses from a code:
//   too_large          the job can never fit the budget, or exceeds --max_dim
//   message_too_large  a message over --max_unary_message_bytes (Multiply) or
//                      over --max_block_bytes plus framing (a stream block)
//   queue_full         the admission queue is full (--max_queue) and this
//                      client has the most waiting: the newcomer, or the
//                      newest job that gave way to it (admission.h)
//   client_limit       this connection already has --max_queued_per_client
//                      jobs waiting
//   cancelled          the client cancelled, its connection was lost, or
//                      gRPC's transport quota cancelled the stream ("Buffers
//                      full"; gRPC 1.51 does not tell the server which)
//   deadline, invalid, unavailable, internal: as the status says
//   resource_exhausted any other RESOURCE_EXHAUSTED (a failed allocation)
enum class Outcome {
  kCompleted,
  kTooLarge,
  kMessageTooLarge,
  kQueueFull,
  kClientLimit,
  kDeadline,
  kCancelled,
  kInternal,
  kInvalid,
  kUnavailable,
  kResourceExhausted,
};
const char* OutcomeName(Outcome o);

// Tags `s` with the outcome it stands for (a status payload; the message and
// code are unchanged).
absl::Status WithOutcome(absl::Status s, Outcome o);
// The outcome `s` was tagged with, else the one its code implies.
Outcome OutcomeOf(const absl::Status& s);

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_OUTCOME_H_
