#include "service/core/outcome.h"

#include <optional>
#include <string>

#include "absl/strings/cord.h"
#include "service/core/enum_names.h"

namespace dgmm {
namespace {

constexpr char kOutcomeUrl[] = "type.dgmm.dev/outcome";

constexpr EnumName<Outcome> kOutcomeNames[] = {
    {Outcome::kCompleted, "completed"},     {Outcome::kTooLarge, "too_large"},
    {Outcome::kMessageTooLarge, "message_too_large"}, {Outcome::kQueueFull, "queue_full"},
    {Outcome::kClientLimit, "client_limit"}, {Outcome::kResourceExhausted, "resource_exhausted"},
    {Outcome::kDeadline, "deadline"},       {Outcome::kCancelled, "cancelled"},
    {Outcome::kInternal, "internal"},       {Outcome::kInvalid, "invalid"},
    {Outcome::kUnavailable, "unavailable"}};

}  // namespace

absl::Status WithOutcome(absl::Status s, Outcome o) {
  s.SetPayload(kOutcomeUrl, absl::Cord(OutcomeName(o)));
  return s;
}

Outcome OutcomeOf(const absl::Status& s) {
  if (auto tag = s.GetPayload(kOutcomeUrl); tag.has_value()) {
    if (std::optional<Outcome> o = ValueOf(kOutcomeNames, std::string(*tag)); o.has_value()) {
      return *o;
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

const char* OutcomeName(Outcome o) { return NameOf(kOutcomeNames, o, "unknown"); }

}  // namespace dgmm
