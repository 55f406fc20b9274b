// The engine: owns the devices (the CPU and one executor per GPU), the
// admission budgets and the job workers. Handlers ask it to start a job from
// a validated header and get back, asynchronously, an ActiveJob to feed tiles
// to; they never see devices or budgets directly.
#ifndef DGMM_SERVICE_ENGINE_H_
#define DGMM_SERVICE_ENGINE_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/admission.h"
#include "service/device.h"
#include "service/regions/region_registry.h"
#include "service/validator.h"
#include "service/server_flags.h"
#include "util/flag_types.h"
#include "util/thread_pool.h"

namespace dgmm {

struct EngineOptions {
  // Where BACKEND_AUTO jobs run: auto (GPU if any, else CPU), cpu, cuda (GPU,
  // fastest kernel), cuda-kernel or cublas.
  ServerBackend backend = ServerBackend::kAuto;
  // Budgets: bytes or a percentage of the free memory at start.
  Budget host_memory_budget = Budget::Percent(50);
  Budget gpu_memory_budget = Budget::Percent(80);
  int max_queue = 64;
  absl::Duration max_head_wait = absl::Seconds(2);
  int job_threads = 0;  // 0: enough for every device's streams
  // What a request may be (dimensions, block and unary message sizes): the
  // validator, the footprints and GetServerInfo's limits use them.
  RequestLimits limits;
  // Fair share (docs/admission.md): most jobs one client may have admitted
  // and waiting at once; 0: no limit.
  ClientLimits client_limits{.max_running = 8, .max_queued = 16, .max_share_percent = 50};
};

// Job latency histogram buckets, in seconds (Prometheus convention).
inline constexpr double kLatencyBuckets[] = {0.001, 0.005, 0.01, 0.05, 0.1, 0.5,
                                             1, 5, 10, 60, 300};

struct LatencyHistogram {
  std::vector<int64_t> counts = std::vector<int64_t>(std::size(kLatencyBuckets) + 1);
  double sum_seconds = 0;
  int64_t count = 0;
};

class Engine;

// An admitted job: its reservation, its device state, its stats. Destroying
// it returns the reservation. Not thread-safe: one Process at a time.
class ActiveJob {
 public:
  ~ActiveJob();
  // Computes one tile on the job's device; adds stage times to stats().
  absl::Status Process(const Tile& tile, const CancelFn& cancelled);
  // Records the job's outcome for the counters and fills stats() totals.
  void End(const absl::Status& status);
  v1::JobStats& stats() { return stats_; }
  // Where this job's streamed blocks live on the host (its device's pool).
  HostBufferPool& block_buffers() { return device_->block_buffers(); }

 private:
  friend class Engine;
  ActiveJob() = default;
  Engine* engine_ = nullptr;
  Device* device_ = nullptr;
  int pool_ = 0;
  JobMode mode_ = JobMode::kWhole;
  absl::Time arrived_;
  absl::Time admitted_;
  Reservation reservation_;
  int64_t lines_ = 0;  // the job's lines (rows or columns), for its group's log line
  std::unique_ptr<JobContext> context_;
  StageTimes times_;
  v1::JobStats stats_;
  bool ended_ = false;
};

class Engine {
 public:
  // `gpus` may be empty. Fails when --backend needs a GPU and there is none,
  // or a budget flag does not parse.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(
      const EngineOptions& options, std::unique_ptr<Device> cpu,
      std::vector<std::unique_ptr<Device>> gpus);
  ~Engine();

  using StartCallback = std::function<void(absl::StatusOr<std::unique_ptr<ActiveJob>>)>;

  // Routes the job to a device, checks its footprint against the budgets and
  // queues it. Errors at once (nothing allocated): RESOURCE_EXHAUSTED when it
  // can never fit (the message names bytes needed, capacity, the largest N and
  // whether streaming fits) or the queue is full; INVALID_ARGUMENT for a
  // backend this server lacks; UNAVAILABLE when draining. Otherwise `done`
  // runs once on a job worker: with the job, or DEADLINE_EXCEEDED, CANCELLED,
  // UNAVAILABLE, INTERNAL. Use the returned ticket to Cancel while queued.
  // `client` names who asked (a token or a peer address), for the fair
  // share of the queue.
  absl::StatusOr<Admission::Ticket> Start(const JobRequest& job, JobMode mode,
                                          absl::Time arrived, absl::Time deadline,
                                          StartCallback done, const std::string& client = "");
  // The footprint check of Start alone: OK if the job could ever fit, else
  // RESOURCE_EXHAUSTED (too_large) worded as Start words it. Lets a handler
  // answer "too large" before looking at a payload.
  absl::Status CheckFits(const JobRequest& job, JobMode mode) const {
    return RouteJob(job, mode).status();
  }
  void Cancel(Admission::Ticket ticket, absl::Status why) {
    admission_->Cancel(ticket, std::move(why));
  }

  // Runs fn on a job worker thread (for work that blocks: compute, copies).
  void Post(std::function<void()> fn) { workers_->Post(std::move(fn)); }

  // Counts a job refused before it was routed (validation, limits), under
  // the outcome `s` is tagged with (service/outcome.h) or its code implies.
  void RecordRejected(const absl::Status& s);

  // Server info: devices, budgets, counters, limits.
  v1::GetServerInfoResponse Info() const;
  // What the region registry needs from the devices (pinning host memory,
  // opening CUDA IPC handles); empty functions where there is no GPU.
  RegionMemoryOps RegionOps();

  // Latency histogram of completed jobs, per mode ("unary", "stream",
  // "region": both region modes).
  LatencyHistogram Latency(JobMode mode) const;
  // Parts of job groups (JobHeader.group) that ended, by outcome
  // ("completed" or an Outcome name); no per-group label (unbounded).
  std::map<std::string, int64_t> GroupParts() const;

  // True once Drain has begun.
  bool draining() const { return draining_; }
  // True while the engine accepts jobs and has a device in service.
  bool serving() const;
  // Called whenever serving() may have changed (a device fell out, drain).
  void set_serving_listener(std::function<void(bool)> fn) { serving_listener_ = std::move(fn); }

  // Refuses new jobs, lets queued and running ones finish until `timeout`,
  // then fails what is still queued. Returns true if everything finished.
  bool Drain(absl::Duration timeout);

  int64_t total_reserved() const { return admission_->total_reserved(); }
  const EngineOptions& options() const { return options_; }
  // The CPU's block buffers, for streams that run no job (the Echo bench).
  HostBufferPool& host_block_buffers() { return cpu_->block_buffers(); }
  const Device& cpu() const { return *cpu_; }
  int gpu_count() const { return static_cast<int>(gpus_.size()); }

 private:
  friend class ActiveJob;
  struct Route {
    Device* device = nullptr;
    int pool = 0;
    BackendKind backend = BackendKind::kCpu;
    Need need;
  };
  Engine() = default;
  absl::StatusOr<Route> RouteJob(const JobRequest& job, JobMode mode) const;
  absl::Status TooLarge(const Problem& p, JobMode mode, const Route& r) const;
  void JobEnded(ActiveJob* job, const absl::Status& status);
  // Counts and logs the end of one part of a job group (job_id 0: it ended
  // before admission).
  void GroupPartEnded(const v1::JobGroup& group, int64_t lines, uint64_t job_id,
                      const absl::Status& status);
  void NotifyServing();

  EngineOptions options_;
  std::unique_ptr<Device> cpu_;
  std::vector<std::unique_ptr<Device>> gpus_;
  bool gpu_default_ = false;  // AUTO jobs go to a GPU
  std::optional<BackendKind> pinned_gpu_backend_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<ThreadPool> workers_;
  std::atomic<uint64_t> next_job_id_{1};
  std::atomic<bool> draining_{false};
  std::function<void(bool)> serving_listener_;
  mutable std::mutex latency_mu_;
  LatencyHistogram latency_[3];
  std::map<std::string, int64_t> group_parts_;  // guarded by latency_mu_
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_ENGINE_H_
