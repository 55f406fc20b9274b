#include "service/outcome.h"

#include "absl/strings/cord.h"

namespace dgmm {
namespace {

constexpr char kOutcomeUrl[] = "type.dgmm.dev/outcome";

}  // namespace

absl::Status WithOutcome(absl::Status s, Outcome o) {
  s.SetPayload(kOutcomeUrl, absl::Cord(OutcomeName(o)));
  return s;
}

Outcome OutcomeOf(const absl::Status& s) {
  if (auto tag = s.GetPayload(kOutcomeUrl); tag.has_value()) {
    for (Outcome o : {Outcome::kTooLarge, Outcome::kMessageTooLarge, Outcome::kQueueFull,
                      Outcome::kClientLimit, Outcome::kDeadline, Outcome::kCancelled,
                      Outcome::kInternal, Outcome::kInvalid, Outcome::kUnavailable,
                      Outcome::kResourceExhausted}) {
      if (*tag == OutcomeName(o)) return o;
    }
  }
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return Outcome::kCompleted;
    case absl::StatusCode::kDeadlineExceeded:
      return Outcome::kDeadline;
    case absl::StatusCode::kCancelled:
      return Outcome::kCancelled;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return Outcome::kInvalid;
    case absl::StatusCode::kUnavailable:
      return Outcome::kUnavailable;
    case absl::StatusCode::kResourceExhausted:
      return Outcome::kResourceExhausted;
    default:
      return Outcome::kInternal;
  }
}

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kCompleted:
      return "completed";
    case Outcome::kTooLarge:
      return "too_large";
    case Outcome::kMessageTooLarge:
      return "message_too_large";
    case Outcome::kQueueFull:
      return "queue_full";
    case Outcome::kClientLimit:
      return "client_limit";
    case Outcome::kResourceExhausted:
      return "resource_exhausted";
    case Outcome::kDeadline:
      return "deadline";
    case Outcome::kCancelled:
      return "cancelled";
    case Outcome::kInternal:
      return "internal";
    case Outcome::kInvalid:
      return "invalid";
    case Outcome::kUnavailable:
      return "unavailable";
  }
  return "unknown";
}

}  // namespace dgmm
