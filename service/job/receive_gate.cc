#include "service/job/receive_gate.h"

#include <algorithm>

#include <utility>

#include "absl/strings/str_cat.h"
#include "service/core/outcome.h"
#include "service/core/retry_pushback.h"

namespace dgmm {

ReceiveGate::ReceiveGate(int64_t capacity, int max_waiting)
    : capacity_(capacity), max_waiting_(max_waiting) {}

absl::StatusOr<ReceiveGate::Acquired> ReceiveGate::Acquire(const std::string& client,
                                                           int64_t bytes, Granted granted) {
  std::lock_guard lock(mu_);
  // A request larger than the whole gate still gets in alone.
  if (waiters_.empty() && (held_ + bytes <= capacity_ || held_ == 0)) {
    held_ += bytes;
    held_by_client_[client] += bytes;
    return Acquired{.granted = true};
  }
  if (static_cast<int>(waiters_.size()) >= max_waiting_) {
    return WithOutcome(
        WithRetryPushback(absl::ResourceExhaustedError(absl::StrCat(
                              max_waiting_,
                              " Multiply requests already wait for room to be received; retry "
                              "after 100 ms or send the job with MultiplyStream")),
                          100),
        Outcome::kQueueFull);
  }
  const Ticket t = next_ticket_++;
  waiters_.push_back(Waiter{t, client, bytes, std::move(granted)});
  return Acquired{.granted = false, .ticket = t};
}

void ReceiveGate::Cancel(Ticket ticket, absl::Status why) {
  Fired fired;
  {
    std::lock_guard lock(mu_);
    auto it = std::find_if(waiters_.begin(), waiters_.end(),
                           [ticket](const Waiter& w) { return w.ticket == ticket; });
    if (it != waiters_.end()) {
      fired.emplace_back(std::move(it->granted), std::move(why));
      waiters_.erase(it);
    }
  }
  for (auto& [cb, s] : fired) cb(s);
}

void ReceiveGate::Shrink(const std::string& client, int64_t from, int64_t to) {
  Fired fired;
  {
    std::lock_guard lock(mu_);
    held_ -= from - to;
    auto it = held_by_client_.find(client);
    if (it != held_by_client_.end() && (it->second -= from - to) <= 0) held_by_client_.erase(it);
    PumpLocked(&fired);
  }
  for (auto& [cb, s] : fired) cb(s);
}

void ReceiveGate::PumpLocked(Fired* fired) {
  while (!waiters_.empty()) {
    // The waiter whose client holds the least goes next.
    auto next = waiters_.begin();
    int64_t least = INT64_MAX;
    for (auto it = waiters_.begin(); it != waiters_.end(); ++it) {
      auto h = held_by_client_.find(it->client);
      const int64_t held = h == held_by_client_.end() ? 0 : h->second;
      if (held < least) {
        least = held;
        next = it;
      }
    }
    if (held_ + next->bytes > capacity_ && held_ != 0) return;
    held_ += next->bytes;
    held_by_client_[next->client] += next->bytes;
    fired->emplace_back(std::move(next->granted), absl::OkStatus());
    waiters_.erase(next);
  }
}

int64_t ReceiveGate::held() const {
  std::lock_guard lock(mu_);
  return held_;
}

int ReceiveGate::waiting() const {
  std::lock_guard lock(mu_);
  return static_cast<int>(waiters_.size());
}

}  // namespace dgmm
