// Admission under memory budgets: reserves a job's footprint before any of
// its payload is read, queues what fits the capacity but not the free budget,
// and rejects at once what could never fit.
//
// Budgets ("pools"): pool 0 is host memory (--host-memory-budget); pools
// 1..n are GPUs (--gpu-memory-budget each). A job needs bytes from the host
// pool and, when it runs on a GPU, from that GPU's pool too; it is admitted
// when both fit, atomically.
//
// Queue policy (docs/admission.md), work-conserving: a fair share orders
// the queue and never turns into a refusal while there is room.
//
// Every job belongs to a client at two levels (ClientId): its connection,
// the unit that takes turns, and its host (a bearer token, or the peer's
// address), the ceiling over that host's connections. The queue is ordered
// by each connection's load, its jobs admitted and waiting, fewest first,
// arrival order breaking ties: a connection with a backlog (or many stalled
// streams) never stands in front of one with a job or two. A job
// is within its share while its connection has fewer than
// `max_running_per_client` jobs admitted and its host, once it has a job
// running, holds at most `max_share_percent` of a budget with it. Jobs
// within their share are admitted first; a job over its share waits behind
// them and is admitted, when it fits, as soon as no job within its share is
// waiting for room (nobody else needs the room).
//
// Over that order: a job behind the head may be admitted first when it fits
// the free budget now ("backfill"), so that small jobs do not wait behind a
// huge one, but only while the head has waited less than `max_head_wait`;
// after that nothing passes the head until it is admitted, so that a huge
// job does not wait forever behind a stream of small ones. Job groups (the
// parts of one striped job, JobHeader.group, known by host and id): once a
// part of a group is admitted and running, the group's queued parts go ahead
// of every other waiter, still under the shares and the head-wait rule, so
// that a started group is not left half-run behind other groups. A group
// counts as started from its first admitted part until none of its parts
// runs or waits.
//
// The queue holds at most `max_queue` jobs. When it is full, a new job takes
// the place of the newest job of the client that has the most waiting (the
// host with the most, then its connection with the most), which is refused
// with RESOURCE_EXHAUSTED and a retry pushback; only when the newcomer's own
// client has the most is the newcomer refused. A client that queues little
// is never refused for a full queue while another queues more.
// `max_queued_per_client` (off by default) is a hard cap per connection.
// Thread-safe.
#ifndef DGMM_SERVICE_ENGINE_ADMISSION_H_
#define DGMM_SERVICE_ENGINE_ADMISSION_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/core/outcome.h"

namespace dgmm {

class Admission;

// Bytes held by one admitted job. Move-only; returns its bytes (and admits
// queued jobs that now fit) when destroyed.
class Reservation {
 public:
  Reservation() = default;
  Reservation(Reservation&& other) noexcept { *this = std::move(other); }
  Reservation& operator=(Reservation&& other) noexcept;
  ~Reservation() { Release(); }

  void Release();
  int device_pool() const { return device_pool_; }

 private:
  friend class Admission;
  Admission* owner_ = nullptr;
  int64_t host_bytes_ = 0;
  int device_pool_ = 0;  // 0: host only
  int64_t device_bytes_ = 0;
  std::string client_;  // its connection
  std::string host_;
  std::string group_;  // Admission's key of the job's group; empty: none
};

// Who a job belongs to, for the fair share (see the top of this file): its
// connection and the host (or token) above it. A lone string names a client
// with one connection.
struct ClientId {
  ClientId() = default;
  ClientId(std::string one) : connection(one), host(std::move(one)) {}  // NOLINT
  ClientId(const char* one) : ClientId(std::string(one)) {}             // NOLINT
  ClientId(std::string connection_key, std::string host_key)
      : connection(std::move(connection_key)), host(std::move(host_key)) {}
  std::string connection;
  std::string host;
};

// Which job group a job belongs to (JobHeader.group): its id and its number
// of parts. An empty id: no group.
struct GroupRef {
  std::string id;
  int parts = 1;
};

// What a job needs: host bytes, and device bytes from pool `device_pool`
// (0 when it runs on the CPU, whose memory is the host pool).
struct Need {
  int64_t host_bytes = 0;
  int device_pool = 0;
  int64_t device_bytes = 0;
};

// Per-client limits of the admission queue (docs/admission.md).
struct ClientLimits {
  // Admitted jobs per connection within its share; more wait until nobody
  // within their share needs the room. 0: no limit.
  int max_running = 0;
  int max_queued = 0;  // waiting jobs per connection, a hard cap; 0: no limit
  // Most of each budget one host may hold within its share, in percent, once
  // it has a job running: a host with nothing running may always start one
  // job that fits, however large. 100: no limit.
  int max_share_percent = 100;
};

struct PoolStats {
  std::string name;
  int64_t capacity = 0;
  int64_t reserved = 0;
  int64_t queued = 0;
  int64_t running = 0;
  int64_t completed = 0;
  std::map<std::string, int64_t> rejected;
};

class Admission {
 public:
  struct Pool {
    std::string name;
    int64_t capacity = 0;
  };
  // Called exactly once per queued job: with a reservation when admitted, or
  // DEADLINE_EXCEEDED / CANCELLED / UNAVAILABLE. Runs on the thread that made
  // room (a Release, Cancel, the deadline timer, or Submit itself), never
  // with Admission's lock held.
  using Callback = std::function<void(absl::StatusOr<Reservation>)>;
  using Ticket = uint64_t;

  Admission(std::vector<Pool> pools, int max_queue, absl::Duration max_head_wait,
            ClientLimits client_limits = {});
  ~Admission();

  // RESOURCE_EXHAUSTED at once when the need exceeds a pool's capacity (the
  // caller words that message, it knows the job), the queue is full and
  // `client` has the most jobs waiting, or `client` already has
  // max_queued jobs waiting (both with a retry pushback). Otherwise returns
  // a ticket (a full queue's newest job of the client with the most waiting
  // then gives way: its callback runs with RESOURCE_EXHAUSTED); `cb` runs when the job is
  // admitted, its deadline passes while queued, or it is cancelled.
  // `group`: the job group the job is a part of (see the top of this file);
  // a group is known by its client and id together, so that one client
  // cannot jump the queue with another's group id. Its parts are put ahead
  // once one of them has been admitted, for at most 2 x parts admissions
  // (room for a retried part each), so that a group cannot keep the front
  // for ever.
  absl::StatusOr<Ticket> Submit(const Need& need, absl::Time deadline, Callback cb,
                                const ClientId& client = {}, const GroupRef& group = {});

  // Ends a queued job with `why` (CANCELLED, or DEADLINE_EXCEEDED when the
  // caller's deadline is what ended it); no effect if it was already admitted
  // or ended.
  void Cancel(Ticket t, absl::Status why = absl::CancelledError(
                            "job cancelled by the client while queued"));

  // Refuses new jobs with UNAVAILABLE; queued ones stay queued (drain).
  void StopAccepting();
  // Fails every queued job with UNAVAILABLE and refuses new ones.
  void Close();
  int64_t queued() const;

  // Counts a finished job against `pool` (the device it ran or would run on).
  void RecordOutcome(int pool, Outcome o);
  // Feeds the retry-pushback estimate with how long a job held its bytes.
  void RecordHoldTime(absl::Duration d);
  std::vector<PoolStats> Stats() const;
  int64_t free_bytes(int pool) const;
  int64_t capacity(int pool) const;
  int pool_count() const { return static_cast<int>(pools_.size()); }
  // Total bytes reserved over every pool; 0 once every job has ended.
  int64_t total_reserved() const;
  // Jobs admitted and not yet released.
  int64_t running() const;
  // Jobs submitted so far (each Submit that got a ticket).
  int64_t submitted() const;

 private:
  struct Waiter {
    Ticket ticket;
    Need need;
    absl::Time deadline;
    absl::Time enqueued;
    Callback cb;
    std::string client;  // connection
    std::string host;
    std::string group;  // key in groups_, empty for none
    int parts = 1;
  };
  // A group with a part running or waiting; forgotten when it has neither.
  struct GroupState {
    int running = 0;       // parts admitted and not released
    int queued = 0;        // parts waiting
    int64_t admitted = 0;  // parts admitted since the group was last idle
  };
  struct ClientState {  // a connection, or a host
    int running = 0;
    int queued = 0;
    std::map<int, int64_t> reserved;  // a host's bytes held, by pool (the share's ceiling)
  };
  struct PoolState {
    Pool config;
    int64_t reserved = 0;
    int64_t running = 0;
    int64_t completed = 0;
    std::map<std::string, int64_t> rejected;
  };
  using Fired = std::vector<std::pair<Callback, absl::StatusOr<Reservation>>>;

  friend class Reservation;
  void Return(int64_t host_bytes, int device_pool, int64_t device_bytes,
              const std::string& client, const std::string& host, const std::string& group);
  // Whether a waiter's group has started (a part admitted since it was last
  // idle) and may still go first.
  bool GroupStartedLocked(const Waiter& w) const;
  bool FitsLocked(const Need& n) const;
  // Whether a connection and its host may take `n` within their share now.
  bool WithinShareLocked(const ClientState& connection, const ClientState& host,
                         const Need& n) const;
  Reservation TakeLocked(const Waiter& w);
  // When the queue is full: makes room for `client`'s job by refusing the
  // newest job of the client with the most waiting, into *fired; false when
  // `client` itself has the most (the newcomer is refused).
  bool DisplaceLocked(const ClientId& client, Fired* fired);
  int64_t PushbackMsLocked() const;
  // Removes a waiter from the queue and from its client's count.
  std::list<Waiter>::iterator EraseLocked(std::list<Waiter>::iterator it);
  // Admits what the policy allows; moves the callbacks to run into *fired.
  void PumpLocked(Fired* fired);
  void TimerLoop();
  static void Run(Fired& fired);

  mutable std::mutex mu_;
  std::condition_variable timer_cv_;
  std::vector<PoolState> pools_ ABSL_GUARDED_BY(mu_);
  std::list<Waiter> queue_ ABSL_GUARDED_BY(mu_);
  // Connections and hosts with a job running or queued.
  std::map<std::string, ClientState> clients_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ClientState> hosts_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, GroupState> groups_ ABSL_GUARDED_BY(mu_);  // groups with a part running or queued
  const int max_queue_;
  const ClientLimits client_limits_;
  const absl::Duration max_head_wait_;
  Ticket next_ticket_ = 1 ABSL_GUARDED_BY(mu_);
  double ewma_hold_ms_ = 50 ABSL_GUARDED_BY(mu_);
  bool closed_ = false ABSL_GUARDED_BY(mu_);
  bool stopping_ = false ABSL_GUARDED_BY(mu_);
  // The earliest deadline the timer thread sleeps until (InfiniteFuture:
  // none); Submit notifies it only for an earlier one.
  absl::Time timer_next_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  std::thread timer_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_ENGINE_ADMISSION_H_
