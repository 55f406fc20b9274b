#include "service/engine/admission.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "service/core/retry_pushback.h"

namespace dgmm {
Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    owner_ = other.owner_;
    host_bytes_ = other.host_bytes_;
    device_pool_ = other.device_pool_;
    device_bytes_ = other.device_bytes_;
    client_ = std::move(other.client_);
    host_ = std::move(other.host_);
    group_ = std::move(other.group_);
    other.owner_ = nullptr;
  }
  return *this;
}

void Reservation::Release() {
  if (owner_ == nullptr) return;
  Admission* owner = owner_;
  owner_ = nullptr;
  owner->Return(host_bytes_, device_pool_, device_bytes_, client_, host_, group_);
}

Admission::Admission(std::vector<Pool> pools, int max_queue, absl::Duration max_head_wait,
                     ClientLimits client_limits)
    : max_queue_(max_queue), client_limits_(client_limits), max_head_wait_(max_head_wait) {
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

Reservation Admission::TakeLocked(const Waiter& w) {
  const Need& n = w.need;
  if (!w.group.empty()) {
    GroupState& g = groups_[w.group];
    g.running++;
    g.admitted++;
  }
  pools_[0].reserved += n.host_bytes;
  if (n.device_pool != 0) pools_[n.device_pool].reserved += n.device_bytes;
  pools_[n.device_pool].running++;
  clients_[w.client].running++;
  ClientState& host = hosts_[w.host];
  host.running++;
  host.reserved[0] += n.host_bytes;
  if (n.device_pool != 0) host.reserved[n.device_pool] += n.device_bytes;
  Reservation r;
  r.owner_ = this;
  r.host_bytes_ = n.host_bytes;
  r.device_pool_ = n.device_pool;
  r.device_bytes_ = n.device_bytes;
  r.client_ = w.client;
  r.host_ = w.host;
  r.group_ = w.group;
  return r;
}

bool Admission::GroupStartedLocked(const Waiter& w) const {
  if (w.group.empty()) return false;
  const auto g = groups_.find(w.group);
  return g != groups_.end() && g->second.admitted > 0 &&
         g->second.admitted < 2 * static_cast<int64_t>(w.parts);
}

bool Admission::WithinShareLocked(const ClientState& connection, const ClientState& host,
                                  const Need& n) const {
  if (client_limits_.max_running > 0 && connection.running >= client_limits_.max_running) {
    return false;
  }
  if (host.running == 0 || client_limits_.max_share_percent >= 100) return true;
  auto held = [&](int pool) {
    auto it = host.reserved.find(pool);
    return it == host.reserved.end() ? int64_t{0} : it->second;
  };
  auto share = [&](int pool) {
    return pools_[pool].config.capacity / 100 * client_limits_.max_share_percent;
  };
  if (held(0) + n.host_bytes > share(0)) return false;
  return n.device_pool == 0 || held(n.device_pool) + n.device_bytes <= share(n.device_pool);
}

int64_t Admission::PushbackMsLocked() const {
  // Wait roughly as long as the jobs ahead need to drain, from recent hold times.
  int64_t running = 0;
  for (const PoolState& p : pools_) running += p.running;
  const int64_t per_job_ms = std::max<int64_t>(10, static_cast<int64_t>(ewma_hold_ms_));
  return std::clamp<int64_t>(
      per_job_ms * (static_cast<int64_t>(queue_.size()) + 1) / std::max<int64_t>(running, 1), 10,
      30000);
}

std::list<Admission::Waiter>::iterator Admission::EraseLocked(std::list<Waiter>::iterator it) {
  for (auto [map, key] : {std::pair{&clients_, &it->client}, std::pair{&hosts_, &it->host}}) {
    auto c = map->find(*key);
    if (c != map->end() && --c->second.queued == 0 && c->second.running == 0) map->erase(c);
  }
  if (!it->group.empty()) {
    auto g = groups_.find(it->group);
    if (g != groups_.end() && --g->second.queued == 0 && g->second.running == 0) {
      groups_.erase(g);
    }
  }
  return queue_.erase(it);
}

void Admission::Run(Fired& fired) {
  for (auto& [cb, result] : fired) cb(std::move(result));
  fired.clear();
}

bool Admission::DisplaceLocked(const ClientId& client, Fired* fired) {
  auto queued = [](const std::map<std::string, ClientState>& map, const std::string& key) {
    auto it = map.find(key);
    return it == map.end() ? 0 : it->second.queued;
  };
  // The waiter that gives way: the newest of the heaviest (host, connection).
  auto victim = queue_.end();
  std::pair<int, int> heaviest{-1, -1};
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    const std::pair<int, int> weight{queued(hosts_, it->host), queued(clients_, it->client)};
    if (weight >= heaviest) {
      heaviest = weight;
      victim = it;
    }
  }
  if (victim == queue_.end()) return false;
  // The newcomer loses ties, compared where it and the victim differ: their
  // hosts, or their connections when they share a host.
  const bool same_host = victim->host == client.host;
  const int mine = same_host ? queued(clients_, client.connection) + 1
                             : queued(hosts_, client.host) + 1;
  if (mine >= (same_host ? heaviest.second : heaviest.first)) return false;
  const int64_t pushback = PushbackMsLocked();
  fired->emplace_back(
      std::move(victim->cb),
      WithOutcome(WithRetryPushback(
                      absl::ResourceExhaustedError(absl::StrCat(
                          "admission queue is full (", max_queue_,
                          " jobs waiting, --max_queue) and this client had the most of them "
                          "waiting: its newest gave way to another client's job; retry after ",
                          pushback, " ms")),
                      pushback),
                  Outcome::kQueueFull));
  EraseLocked(victim);
  return true;
}

absl::StatusOr<Admission::Ticket> Admission::Submit(const Need& need, absl::Time deadline,
                                                    Callback cb, const ClientId& client,
                                                    const GroupRef& group) {
  Fired fired;
  Ticket ticket;
  bool wake_timer = false;
  {
    std::lock_guard lock(mu_);
    if (closed_) return absl::UnavailableError("server is shutting down; retry on another replica");
    if (need.device_pool < 0 || need.device_pool >= pool_count()) {
      return absl::InternalError("job routed to an unknown device");
    }
    if (need.host_bytes > pools_[0].config.capacity ||
        (need.device_pool != 0 &&
         need.device_bytes > pools_[need.device_pool].config.capacity)) {
      return WithOutcome(absl::ResourceExhaustedError("job exceeds the budget's capacity"),
                         Outcome::kTooLarge);
    }
    const auto known = clients_.find(client.connection);
    if (client_limits_.max_queued > 0 && known != clients_.end() &&
        known->second.queued >= client_limits_.max_queued) {
      const int64_t pushback = PushbackMsLocked();
      return WithOutcome(
          WithRetryPushback(
              absl::ResourceExhaustedError(absl::StrCat(
                  "this client already has ", known->second.queued,
                  " jobs waiting for admission (--max_queued_per_client); retry after ",
                  pushback, " ms")),
              pushback),
          Outcome::kClientLimit);
    }
    if (static_cast<int>(queue_.size()) >= max_queue_ && !DisplaceLocked(client, &fired)) {
      const int64_t pushback = PushbackMsLocked();
      return WithOutcome(
          WithRetryPushback(absl::ResourceExhaustedError(absl::StrCat(
                                "admission queue is full (", max_queue_,
                                " jobs waiting, --max_queue) and this client has the most of "
                                "them; retry after ", pushback, " ms")),
                            pushback),
          Outcome::kQueueFull);
    }
    ticket = next_ticket_++;
    clients_[client.connection].queued++;
    hosts_[client.host].queued++;
    // Known by host and id (a group's parts come on several connections):
    // one client cannot take another's group's turn.
    std::string group_key =
        group.id.empty() ? std::string() : absl::StrCat(client.host, "\x1f", group.id);
    if (!group_key.empty()) groups_[group_key].queued++;
    queue_.push_back(Waiter{ticket, need, deadline, absl::Now(), std::move(cb), client.connection,
                            client.host, std::move(group_key), std::max(group.parts, 1)});
    PumpLocked(&fired);
    // The timer needs to hear of the job only when it still waits and its
    // deadline comes before the one the timer sleeps until: a job admitted
    // at once (most small jobs) wakes no thread.
    // (Still waiting: the last in the queue, where it was put above.)
    wake_timer = deadline < timer_next_ && !queue_.empty() && queue_.back().ticket == ticket;
    if (wake_timer) timer_next_ = deadline;
  }
  if (wake_timer) timer_cv_.notify_all();
  Run(fired);
  return ticket;
}

void Admission::PumpLocked(Fired* fired) {
  if (queue_.empty()) return;
  // Connections in turn: a waiter's rank is its connection's load, the jobs
  // it has admitted and waiting; lower ranks first, arrival order within. A
  // connection that keeps many jobs waiting (a backlog, or streams it
  // stalls) goes after those that keep few. Before all of them: the parts
  // of groups that have a part running.
  struct Entry {
    bool started_group;
    int rank;
    std::list<Waiter>::iterator it;
  };
  std::vector<Entry> order;
  order.reserve(queue_.size());
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    const ClientState& c = clients_[it->client];
    order.push_back({GroupStartedLocked(*it), c.running + c.queued, it});
  }
  std::stable_sort(order.begin(), order.end(),
                   [](const Entry& a, const Entry& b) {
                     if (a.started_group != b.started_group) return a.started_group;
                     return a.rank < b.rank;
                   });
  const absl::Time now = absl::Now();
  const Waiter* blocked_head = nullptr;
  std::vector<const Entry*> over_share;
  for (const Entry& e : order) {
    if (blocked_head != nullptr && now - blocked_head->enqueued >= max_head_wait_) break;
    Waiter& w = *e.it;
    if (!WithinShareLocked(clients_[w.client], hosts_[w.host], w.need)) {
      over_share.push_back(&e);  // waits behind every job within its share
      continue;
    }
    if (FitsLocked(w.need)) {
      fired->emplace_back(std::move(w.cb), TakeLocked(w));
      EraseLocked(e.it);
    } else if (blocked_head == nullptr) {
      blocked_head = &w;
    }
  }
  // Work-conserving: when no job within its share waits for room, the jobs
  // over their share take what fits, in the same order and under the same
  // head rule: a job behind an over-share head that does not fit passes it
  // only while that head is younger than max_head_wait_.
  if (blocked_head != nullptr) return;
  const Waiter* over_head = nullptr;
  for (const Entry* e : over_share) {
    if (over_head != nullptr && now - over_head->enqueued >= max_head_wait_) break;
    Waiter& w = *e->it;
    if (FitsLocked(w.need)) {
      fired->emplace_back(std::move(w.cb), TakeLocked(w));
      EraseLocked(e->it);
    } else if (over_head == nullptr) {
      over_head = &w;
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
        EraseLocked(it);
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

int64_t Admission::submitted() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(next_ticket_) - 1;
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
    while (!queue_.empty()) EraseLocked(queue_.begin());
  }
  Run(fired);
}

void Admission::Return(int64_t host_bytes, int device_pool, int64_t device_bytes,
                       const std::string& client, const std::string& host,
                       const std::string& group) {
  Fired fired;
  {
    std::lock_guard lock(mu_);
    if (auto g = groups_.find(group); !group.empty() && g != groups_.end()) {
      if (--g->second.running == 0 && g->second.queued == 0) groups_.erase(g);
    }
    pools_[0].reserved -= host_bytes;
    if (device_pool != 0) pools_[device_pool].reserved -= device_bytes;
    pools_[device_pool].running--;
    if (auto h = hosts_.find(host); h != hosts_.end()) {
      h->second.reserved[0] -= host_bytes;
      if (device_pool != 0) h->second.reserved[device_pool] -= device_bytes;
    }
    for (auto [map, key] : {std::pair{&clients_, &client}, std::pair{&hosts_, &host}}) {
      if (auto c = map->find(*key); c != map->end() &&
                                     --c->second.running == 0 && c->second.queued == 0) {
        map->erase(c);
      }
    }
    PumpLocked(&fired);
  }
  Run(fired);
}

void Admission::TimerLoop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    absl::Time next = absl::InfiniteFuture();
    for (const Waiter& w : queue_) next = std::min(next, w.deadline);
    timer_next_ = next;  // Submit wakes the timer only for an earlier deadline
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
        it = EraseLocked(it);
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
