#include "service/admission.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "service/util/retry_pushback.h"

namespace dgmm {

const char* OutcomeName(Outcome o) {
  switch (o) {
    case Outcome::kCompleted:
      return "completed";
    case Outcome::kTooLarge:
      return "too_large";
    case Outcome::kQueueFull:
      return "queue_full";
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

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = other.owner_;
    host_bytes_ = other.host_bytes_;
    device_pool_ = other.device_pool_;
    device_bytes_ = other.device_bytes_;
    other.owner_ = nullptr;
  }
  return *this;
}

void Reservation::Release() {
  if (owner_ == nullptr) return;
  Admission* owner = owner_;
  owner_ = nullptr;
  owner->Return(host_bytes_, device_pool_, device_bytes_);
}

Admission::Admission(std::vector<Pool> pools, int max_queue, absl::Duration max_head_wait)
    : max_queue_(max_queue), max_head_wait_(max_head_wait) {
  for (auto& p : pools) {
    PoolState state;
    state.config = std::move(p);
    pools_.push_back(std::move(state));
  }
  timer_ = std::thread([this] { TimerLoop(); });
}

Admission::~Admission() {
  Close();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  timer_cv_.notify_all();
  timer_.join();
}

bool Admission::FitsLocked(const Need& n) const {
  const PoolState& host = pools_[0];
  if (host.reserved + n.host_bytes > host.config.capacity) return false;
  if (n.device_pool == 0) return true;
  const PoolState& dev = pools_[n.device_pool];
  return dev.reserved + n.device_bytes <= dev.config.capacity;
}

Reservation Admission::TakeLocked(const Need& n) {
  pools_[0].reserved += n.host_bytes;
  if (n.device_pool != 0) pools_[n.device_pool].reserved += n.device_bytes;
  pools_[n.device_pool].running++;
  Reservation r;
  r.owner_ = this;
  r.host_bytes_ = n.host_bytes;
  r.device_pool_ = n.device_pool;
  r.device_bytes_ = n.device_bytes;
  return r;
}

void Admission::Run(Fired& fired) {
  for (auto& [cb, result] : fired) cb(std::move(result));
  fired.clear();
}

absl::StatusOr<Admission::Ticket> Admission::Submit(const Need& need, absl::Time deadline,
                                                    Callback cb) {
  Fired fired;
  Ticket ticket;
  {
    std::lock_guard lock(mu_);
    if (closed_) return absl::UnavailableError("server is shutting down; retry on another replica");
    if (need.device_pool < 0 || need.device_pool >= pool_count()) {
      return absl::InternalError("job routed to an unknown device");
    }
    if (need.host_bytes > pools_[0].config.capacity ||
        (need.device_pool != 0 &&
         need.device_bytes > pools_[need.device_pool].config.capacity)) {
      return absl::ResourceExhaustedError("job exceeds the budget's capacity");
    }
    if (static_cast<int>(queue_.size()) >= max_queue_) {
      // Wait roughly as long as the jobs ahead need to drain, from recent hold times.
      int64_t running = 0;
      for (const PoolState& p : pools_) running += p.running;
      const int64_t per_job_ms = std::max<int64_t>(10, static_cast<int64_t>(ewma_hold_ms_));
      const int64_t pushback = std::clamp<int64_t>(
          per_job_ms * (static_cast<int64_t>(queue_.size()) + 1) / std::max<int64_t>(running, 1),
          10, 30000);
      return WithRetryPushback(
          absl::ResourceExhaustedError(absl::StrCat(
              "admission queue is full (", max_queue_, " jobs waiting, --max_queue); retry after ",
              pushback, " ms")),
          pushback);
    }
    ticket = next_ticket_++;
    queue_.push_back(Waiter{ticket, need, deadline, absl::Now(), std::move(cb)});
    PumpLocked(&fired);
  }
  timer_cv_.notify_all();
  Run(fired);
  return ticket;
}

void Admission::PumpLocked(Fired* fired) {
  const absl::Time now = absl::Now();
  const Waiter* blocked_head = nullptr;
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (blocked_head != nullptr && now - blocked_head->enqueued >= max_head_wait_) break;
    if (FitsLocked(it->need)) {
      fired->emplace_back(std::move(it->cb), TakeLocked(it->need));
      it = queue_.erase(it);
    } else {
      if (blocked_head == nullptr) blocked_head = &*it;
      ++it;
    }
  }
}

void Admission::Cancel(Ticket t, absl::Status why) {
  Fired fired;
  {
    std::lock_guard lock(mu_);
    for (auto it = queue_.begin(); it != queue_.end(); ++it) {
      if (it->ticket == t) {
        fired.emplace_back(std::move(it->cb), std::move(why));
        queue_.erase(it);
        break;
      }
    }
    PumpLocked(&fired);  // a removed head may let others through
  }
  Run(fired);
}

void Admission::StopAccepting() {
  std::lock_guard lock(mu_);
  closed_ = true;
}

int64_t Admission::queued() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(queue_.size());
}

void Admission::Close() {
  Fired fired;
  {
    std::lock_guard lock(mu_);
    closed_ = true;
    for (Waiter& w : queue_) {
      fired.emplace_back(std::move(w.cb),
                         absl::UnavailableError("server is shutting down; retry on another replica"));
    }
    queue_.clear();
  }
  Run(fired);
}

void Admission::Return(int64_t host_bytes, int device_pool, int64_t device_bytes) {
  Fired fired;
  {
    std::lock_guard lock(mu_);
    pools_[0].reserved -= host_bytes;
    if (device_pool != 0) pools_[device_pool].reserved -= device_bytes;
    pools_[device_pool].running--;
    PumpLocked(&fired);
  }
  Run(fired);
}

void Admission::TimerLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    for (const Waiter& w : queue_) next = std::min(next, w.deadline);
    if (next == absl::InfiniteFuture()) {
      timer_cv_.wait(lock);
    } else {
      timer_cv_.wait_for(lock, absl::ToChronoNanoseconds(
                                   std::max(next - absl::Now(), absl::ZeroDuration())));
    }
    Fired fired;
    const absl::Time now = absl::Now();
    for (auto it = queue_.begin(); it != queue_.end();) {
      if (it->deadline <= now) {
        fired.emplace_back(std::move(it->cb),
                           absl::DeadlineExceededError(
                               "deadline expired while the job waited for memory budget"));
        it = queue_.erase(it);
      } else {
        ++it;
      }
    }
    if (!fired.empty()) {
      PumpLocked(&fired);
      lock.unlock();
      Run(fired);
      lock.lock();
    }
  }
}

void Admission::RecordOutcome(int pool, Outcome o) {
  std::lock_guard lock(mu_);
  if (pool < 0 || pool >= pool_count()) return;
  if (o == Outcome::kCompleted) {
    pools_[pool].completed++;
  } else {
    pools_[pool].rejected[OutcomeName(o)]++;
  }
}

void Admission::RecordHoldTime(absl::Duration d) {
  std::lock_guard lock(mu_);
  ewma_hold_ms_ = 0.8 * ewma_hold_ms_ + 0.2 * absl::ToDoubleMilliseconds(d);
}

std::vector<PoolStats> Admission::Stats() const {
  std::lock_guard lock(mu_);
  std::vector<PoolStats> out;
  for (const PoolState& p : pools_) {
    out.push_back(PoolStats{.name = p.config.name,
                            .capacity = p.config.capacity,
                            .reserved = p.reserved,
                            .queued = 0,
                            .running = p.running,
                            .completed = p.completed,
                            .rejected = p.rejected});
  }
  for (const Waiter& w : queue_) out[w.need.device_pool].queued++;
  return out;
}

int64_t Admission::free_bytes(int pool) const {
  std::lock_guard lock(mu_);
  return pools_[pool].config.capacity - pools_[pool].reserved;
}

int64_t Admission::capacity(int pool) const {
  std::lock_guard lock(mu_);
  return pools_[pool].config.capacity;
}

int64_t Admission::total_reserved() const {
  std::lock_guard lock(mu_);
  int64_t sum = 0;
  for (const PoolState& p : pools_) sum += p.reserved;
  return sum;
}

int64_t Admission::running() const {
  std::lock_guard lock(mu_);
  int64_t sum = 0;
  for (const PoolState& p : pools_) sum += p.running;
  return sum;
}

}  // namespace dgmm
