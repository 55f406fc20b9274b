// The engine: owns the devices (the CPU and one executor per GPU), the
// admission budgets and the job workers. It routes a validated job to a
// device, reserves its footprint (service/core/footprint.h) and hands back,
// asynchronously, an ActiveJob to feed tiles to; callers (service/job) never
// see devices or budgets directly. gRPC-free (tests/layering).
#ifndef DGMM_SERVICE_ENGINE_ENGINE_H_
#define DGMM_SERVICE_ENGINE_ENGINE_H_

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
#include "service/core/device.h"
#include "service/engine/job_metrics.h"
#include "service/engine/admission.h"
#include "service/core/validator.h"
#include "service/engine/server_backend.h"
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
  int max_queue = 1024;
  absl::Duration max_head_wait = absl::Seconds(2);
  int job_threads = 0;  // 0: enough for every device's streams
  // What a request may be (dimensions, block and unary message sizes): the
  // validator, the footprints and GetServerInfo's limits use them.
  RequestLimits limits;
  // Fair share (docs/admission.md): most jobs one client may have admitted
  // and waiting at once; 0: no limit.
  ClientLimits client_limits{.max_running = 8, .max_queued = 0, .max_share_percent = 50};
  // BACKEND_AUTO socket jobs (JobMode::kWhole and streamed ones) and host
  // region jobs whose matrix has at most this many bytes run on the CPU even
  // when AUTO means a GPU (--backend=auto with a GPU): the GPU path's fixed
  // cost per job is more than such a job. 0: never.
  // (Limits.auto_cpu_max_bytes.)
  int64_t auto_cpu_max_bytes = 0;
  // A log line for every job that ends or is refused once its header is
  // valid (service/engine/job_log.h; --log_jobs); off: only the parts of
  // striped jobs.
  bool log_jobs = false;
};

class Engine;
class AdmittedBatch;

// An admitted job: its reservation, its device state, its stats. Destroying
// it returns the reservation. Not thread-safe: one Process at a time.
class ActiveJob {
 public:
  ~ActiveJob();
  // Computes one tile on the job's device; adds stage times to stats().
  absl::Status Process(const Tile& tile, const CancelFn& cancelled);
  // Records the job's outcome for the counters and fills stats() totals.
  void End(const absl::Status& status);
  JobStats& stats() { return stats_; }
  // Where this job's streamed blocks live on the host (its device's pool).
  HostBufferPool& block_buffers() { return device_->block_buffers(); }

 private:
  friend class Engine;
  ActiveJob() = default;
  Engine* engine_ = nullptr;
  Device* device_ = nullptr;
  // Set for a GPU job that runs on Start's caller's thread: the count of
  // such jobs, decremented when this one ends.
  std::atomic<int>* gpu_here_ = nullptr;
  int pool_ = 0;
  JobMode mode_ = JobMode::kWhole;
  absl::Time arrived_;
  absl::Time admitted_;
  Reservation reservation_;
  int64_t lines_ = 0;  // the job's lines (rows or columns), for its group's log line
  JobCall call_;       // who asked, for its log line
  std::unique_ptr<JobContext> context_;
  StageTimes times_;
  JobStats stats_;
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
  //
  // `admitted_here` (null: never): the caller offers to run the job on its
  // own thread. When the job is small (RunsHere: on the CPU, whole or on
  // host regions, a matrix of at most kRunHereMaxMatrixBytes; or on a GPU,
  // on host regions, at most kRunHereGpuMaxMatrixBytes and
  // kRunHereGpuMaxJobs such jobs at once) and admission
  // admits it
  // within this call, Start returns with the admitted job in
  // *admitted_here and `done` never runs. The caller runs it once Start has
  // returned and it holds no lock Start might need. A job admitted later,
  // or any other job, goes to a job worker as above: a job never runs on
  // the thread that freed its room, nor inside Start.
  absl::StatusOr<Admission::Ticket> Start(const JobRequest& job, JobMode mode,
                                          absl::Time arrived, absl::Time deadline,
                                          StartCallback done, const ClientId& client = {},
                                          std::unique_ptr<ActiveJob>* admitted_here = nullptr);

  // A MultiplyBatch's valid jobs (each whole, each passed the intake),
  // admitted together: one reservation of the sum of their host footprints
  // (every result is held until the batch's reply is sent) plus a fixed
  // kBatchResultOverheadBytes per job for its framing and stats, and, for
  // jobs that run on a GPU, that GPU's largest footprint of them (they run
  // one after another on one GPU, each through a pinned block buffer of its
  // matrix's size, and one of its result's size when C is wider than A,
  // whose largest the host need adds too). Errors at once
  // as Start's (too_large worded for the batch: the bytes it needs and the
  // budget); a refusal is counted once for each job. `done` runs once on a
  // job worker, with the batch or why it was not admitted. With
  // `admitted_here`: a batch whose jobs all run on the CPU, with at most
  // kRunHereMaxBatchJobs jobs and kRunHereMaxMatrixBytes of matrices in all,
  // admitted within this call, is returned there instead (as Start's).
  using BatchCallback = std::function<void(absl::StatusOr<std::unique_ptr<AdmittedBatch>>)>;
  absl::StatusOr<Admission::Ticket> StartBatch(
      const std::vector<const JobRequest*>& jobs, absl::Time arrived, absl::Time deadline,
      BatchCallback done, const ClientId& client = {},
      std::unique_ptr<AdmittedBatch>* admitted_here = nullptr);
  static constexpr int64_t kBatchResultOverheadBytes = 256;
  // A batch that runs on the caller's thread has at most this many jobs
  // (and kRunHereMaxMatrixBytes of matrices): about 1 us each for 1x1 jobs
  // on the 2-core build machine, so a few hundred us on gRPC's callback
  // thread at most; larger batches take one hop to a worker, which their
  // jobs share.
  static constexpr int kRunHereMaxBatchJobs = 256;

  // Small jobs may run on the caller's thread (Start's `admitted_here`): a
  // matrix of at most 64 KiB (a 128x128 float32 one), some microseconds of
  // copy and compute on the CPU against the hundreds an RPC costs, and
  // below the CPU backend's grain (one chunk, no pool thread;
  // cpu_device.cc). Measured: a hop to a worker and back cost more than
  // the job itself.
  static constexpr int64_t kRunHereMaxMatrixBytes = int64_t{64} << 10;
  // A GPU job on a host region of at most this size also runs on the
  // caller's thread when admitted at once, one such job at a time (it
  // waits on the device, for a few hundred us at this size, and must not
  // hold more than one of gRPC's threads): on the H200 the hop to a worker
  // took 124-230 us of such a job's 0.8-1 ms
  // (bench/results/user_path/h200_552b227/).
  static constexpr int64_t kRunHereGpuMaxMatrixBytes = int64_t{16} << 20;
  static constexpr int kRunHereGpuMaxJobs = 1;
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

  // The counters of jobs' ends and refusals (one place: job_metrics.h).
  JobMetrics& metrics() { return *metrics_; }
  // A job refused before Start (the intake, a protocol error) once its
  // header was valid: counted (metrics().Refused) and logged (job_log.h).
  void Refused(int pool, const absl::Status& s, const JobRequest& job);
  const JobMetrics& metrics() const { return *metrics_; }

  // One device as GetServerInfo and the metrics report it (the reply itself
  // is written in service/rpc/server_info.cc).
  struct DeviceState {
    int index = -1;  // -1: the CPU
    std::string name;
    int64_t total_memory_bytes = 0;
    int streams = 0;
    bool in_service = true;
    std::vector<BackendKind> backends;
    PoolStats budget;  // its budget, reservations and job counters
  };
  struct State {
    std::vector<DeviceState> devices;  // the CPU, then each GPU
    BackendKind default_backend = BackendKind::kCpu;
    // Limits.auto_cpu_max_bytes: 0 unless AUTO jobs go to a GPU.
    int64_t auto_cpu_max_bytes = 0;
  };
  // Devices, budgets and counters now.
  State Snapshot() const;

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
  // Jobs submitted for admission so far (a count that moves while jobs come).
  int64_t jobs_submitted() const { return admission_->submitted(); }
  const EngineOptions& options() const { return options_; }
  // The CPU's block buffers, for streams that run no job (the Echo bench).
  HostBufferPool& host_block_buffers() { return cpu_->block_buffers(); }
  const Device& cpu() const { return *cpu_; }
  int gpu_count() const { return static_cast<int>(gpus_.size()); }
  // GPU `i` of gpu_count() (for what the region registry needs of them).
  Device& gpu(int i) { return *gpus_[i]; }

 private:
  friend class ActiveJob;
  friend class AdmittedBatch;
  struct Route {
    Device* device = nullptr;
    int pool = 0;
    BackendKind backend = BackendKind::kCpu;
    Need need;
  };
  Engine() = default;
  absl::StatusOr<Route> RouteJob(const JobRequest& job, JobMode mode) const;
  // Whether a routed job may run on Start's caller's thread (see Start).
  bool RunsHere(const Route& r, const Problem& p, JobMode mode) const;
  // Whether a routed GPU job may, if one of the kRunHereGpuMaxJobs places
  // is free (gpu_here_).
  bool RunsHereOnGpu(const Route& r, const Problem& p, JobMode mode) const;
  // The admitted job on its device (ActiveJob and Device::Begin), or the
  // error it ended with (counted).
  absl::StatusOr<std::unique_ptr<ActiveJob>> Activate(const Route& r, const Problem& problem,
                                                      JobMode mode, absl::Time arrived,
                                                      const std::string& diag,
                                                      const std::optional<JobGroup>& group,
                                                      const JobCall& call,
                                                      absl::StatusOr<Reservation> res);
  void JobEnded(ActiveJob* job, const absl::Status& status);
  void NotifyServing();

  EngineOptions options_;
  std::unique_ptr<Device> cpu_;
  std::vector<std::unique_ptr<Device>> gpus_;
  bool gpu_default_ = false;  // AUTO jobs go to a GPU
  std::optional<BackendKind> pinned_gpu_backend_;
  std::unique_ptr<Admission> admission_;
  std::unique_ptr<JobMetrics> metrics_;
  std::unique_ptr<ThreadPool> workers_;
  std::atomic<uint64_t> next_job_id_{1};
  std::atomic<int> gpu_here_{0};  // GPU jobs running on a caller's thread
  std::atomic<bool> draining_{false};
  std::function<void(bool)> serving_listener_;
};

// A batch of jobs admitted together (Engine::StartBatch): the batch's one
// reservation, held until this is destroyed (after its reply is sent), and
// its jobs, each made an ActiveJob of its own (its job id, stats, outcome)
// when it runs, reserving nothing more. Not thread-safe.
class AdmittedBatch {
 public:
  // Job `i` of StartBatch's `jobs` on its device, or the error its device's
  // Begin ended it with (counted).
  absl::StatusOr<std::unique_ptr<ActiveJob>> Activate(size_t i);
  size_t size() const { return jobs_.size(); }

 private:
  friend class Engine;
  struct Job {
    Engine::Route route;
    Problem problem;
    std::string diagonal;
    std::optional<JobGroup> group;
    JobCall call;
  };
  Engine* engine_ = nullptr;
  absl::Time arrived_;
  std::vector<Job> jobs_;
  Reservation reservation_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_ENGINE_ENGINE_H_
