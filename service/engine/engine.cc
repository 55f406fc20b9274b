#include "service/engine/engine.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/core/footprint.h"
#include "service/engine/job_log.h"
#include "util/flag_names.h"

namespace dgmm {
ActiveJob::~ActiveJob() {
  if (!ended_) End(absl::CancelledError("job abandoned"));
}

absl::Status ActiveJob::Process(const Tile& tile, const CancelFn& cancelled) {
  return context_->Process(tile, cancelled, &times_);
}

void ActiveJob::End(const absl::Status& status) {
  if (ended_) return;
  ended_ = true;
  if (gpu_here_ != nullptr) gpu_here_->fetch_sub(1);
  const absl::Time now = absl::Now();
  stats_.queue_wait_ns = (absl::ToInt64Nanoseconds(admitted_ - arrived_));
  stats_.h2d_ns = (absl::ToInt64Nanoseconds(times_.h2d));
  stats_.compute_ns = (absl::ToInt64Nanoseconds(times_.compute));
  stats_.d2h_ns = (absl::ToInt64Nanoseconds(times_.d2h));
  stats_.total_ns = (absl::ToInt64Nanoseconds(now - arrived_));
  engine_->admission_->RecordHoldTime(now - admitted_);
  engine_->JobEnded(this, status);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(
    const EngineOptions& options, std::unique_ptr<Device> cpu,
    std::vector<std::unique_ptr<Device>> gpus) {
  std::unique_ptr<Engine> e(new Engine());
  e->options_ = options;
  const ServerBackend b = options.backend;
  if (b != ServerBackend::kAuto && b != ServerBackend::kCpu && gpus.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--backend=", AbslUnparseFlag(b), " needs a GPU but none is usable on this host; use "
        "--backend=auto or --backend=cpu"));
  }
  e->gpu_default_ = b != ServerBackend::kCpu && !gpus.empty();
  if (b == ServerBackend::kCudaKernel) e->pinned_gpu_backend_ = BackendKind::kCudaKernel;
  if (b == ServerBackend::kCublas) e->pinned_gpu_backend_ = BackendKind::kCublas;

  std::vector<Admission::Pool> pools;
  pools.push_back({"cpu", options.host_memory_budget.Of(cpu->free_memory_at_start_bytes())});
  int streams = cpu->streams();
  for (const auto& g : gpus) {
    pools.push_back({absl::StrCat("cuda:", g->index()),
                     options.gpu_memory_budget.Of(g->free_memory_at_start_bytes())});
    streams += g->streams();
  }
  e->cpu_ = std::move(cpu);
  e->gpus_ = std::move(gpus);
  e->admission_ = std::make_unique<Admission>(std::move(pools), options.max_queue,
                                              options.max_head_wait, options.client_limits);
  e->metrics_ = std::make_unique<JobMetrics>(e->admission_.get());
  const int threads = options.job_threads > 0 ? options.job_threads : std::max(8, 2 * streams);
  e->workers_ = std::make_unique<ThreadPool>(threads);
  return e;
}

Engine::~Engine() {
  if (admission_ != nullptr) admission_->Close();  // null when Create failed
  workers_.reset();  // finish posted work while devices and budgets still exist
}

absl::StatusOr<Engine::Route> Engine::RouteJob(const JobRequest& job, JobMode mode) const {
  const Problem& p = job.problem;
  Route r;
  const bool small_on_cpu =
      options_.backend == ServerBackend::kAuto &&
      (mode == JobMode::kWhole || mode == JobMode::kStreamed || mode == JobMode::kHostRegion) &&
      p.matrix_bytes() <= options_.auto_cpu_max_bytes;
  const bool wants_gpu = job.backend.has_value()
                             ? *job.backend != BackendKind::kCpu
                             : (gpu_default_ && !small_on_cpu) || mode == JobMode::kDeviceRegion;
  if (mode == JobMode::kDeviceRegion && !wants_gpu) {
    return absl::InvalidArgumentError(
        "a job on CUDA IPC regions runs on their GPU: BACKEND_CPU cannot read GPU memory");
  }
  if (!wants_gpu) {
    r.device = cpu_.get();
    r.backend = BackendKind::kCpu;
  } else {
    if (gpus_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          job.backend.has_value() ? absl::StrCat("backend ", BackendName(*job.backend))
                                  : std::string("a job on GPU memory"),
          " needs a GPU but this server has none; available: BACKEND_AUTO, BACKEND_CPU"));
    }
    int best = -1;
    for (int i = 0; i < gpu_count(); ++i) {
      if (!gpus_[i]->in_service()) continue;
      if (job.gpu >= 0) {
        if (gpus_[i]->index() == job.gpu) best = i;
        continue;
      }
      if (best < 0 || admission_->free_bytes(i + 1) > admission_->free_bytes(best + 1)) best = i;
    }
    if (best < 0) {
      return absl::UnavailableError(
          "no GPU of this server is in service (a device error took them out); retry on "
          "another replica");
    }
    r.device = gpus_[best].get();
    r.pool = best + 1;
    r.backend = job.backend.has_value()        ? *job.backend
                : pinned_gpu_backend_.has_value() ? *pinned_gpu_backend_
                                                  : r.device->backends().front();
    if (!job.backend.has_value() && r.backend == BackendKind::kCublas && !CublasTakes(p)) {
      // --backend=cublas pins what BACKEND_AUTO means; a job cuBLAS has no
      // dgmm for (half types, a promoted diagonal, SIDE_BOTH) runs on the
      // kernel. A job that names BACKEND_CUBLAS was refused by the validator.
      r.backend = BackendKind::kCudaKernel;
    }
    r.need.device_pool = r.pool;
    r.need.device_bytes = r.device->Footprint(p, mode, options_.limits.max_block_bytes);
  }
  r.need.host_bytes = HostFootprint(p, mode, options_.limits.max_block_bytes);
  if (r.need.host_bytes > admission_->capacity(0) ||
      (r.pool != 0 && r.need.device_bytes > admission_->capacity(r.pool))) {
    const bool host_short = r.need.host_bytes > admission_->capacity(0);
    return TooLargeError(
        p, mode,
        {.host_short = host_short,
         .device = r.device,
         .need = host_short ? r.need.host_bytes : r.need.device_bytes,
         .capacity = admission_->capacity(host_short ? 0 : r.pool),
         .max_dim = options_.limits.max_dim,
         .max_block_bytes = options_.limits.max_block_bytes});
  }
  return r;
}

absl::StatusOr<Admission::Ticket> Engine::Start(const JobRequest& job, JobMode mode,
                                                absl::Time arrived, absl::Time deadline,
                                                StartCallback done_fn, const ClientId& client,
                                                std::unique_ptr<ActiveJob>* admitted_here) {
  if (draining_) {
    const absl::Status draining =
        absl::UnavailableError("server is draining; retry on another replica");
    Refused(0, draining, job);
    return draining;
  }
  auto route = RouteJob(job, mode);
  if (!route.ok()) {
    Refused(0, route.status(), job);
    return route.status();
  }
  const Problem problem = job.problem;
  const std::optional<JobGroup> group = job.group;
  const JobCall call = job.call;
  // Start's caller may run the job itself when admission admits it within
  // Submit below: the admission callback, run by Submit on this thread,
  // leaves the reservation here instead of posting the job. `here` is this
  // thread's marker for the length of Submit, so a callback run by any
  // other thread (one that freed room, the timer) or later still posts.
  struct Here {
    std::optional<Reservation> reservation;
  };
  std::shared_ptr<Here> here;
  auto done = std::make_shared<StartCallback>(std::move(done_fn));
  if (admitted_here != nullptr && RunsHere(*route, problem, mode)) here = std::make_shared<Here>();
  // A place among the GPU jobs that run on their caller's thread, held
  // until the job ends, or given back below if it does not run here.
  struct GpuPlace {
    std::atomic<int>* count = nullptr;
    ~GpuPlace() {
      if (count != nullptr) count->fetch_sub(1);
    }
  } gpu_place;
  if (admitted_here != nullptr && here == nullptr && RunsHereOnGpu(*route, problem, mode)) {
    if (gpu_here_.fetch_add(1) < kRunHereGpuMaxJobs) {
      gpu_place.count = &gpu_here_;
      here = std::make_shared<Here>();
    } else {
      gpu_here_.fetch_sub(1);
    }
  }
  thread_local const Here* submitting = nullptr;
  // The diagonals widened to C's compute type, once, for the device.
  std::string prepared = PrepareDiagonals(job.problem, job.diagonal, job.right_diagonal);
  auto on_admit = [this, r = *route, problem, mode, arrived, diag = prepared, group, call, done,
                   here](absl::StatusOr<Reservation> res) mutable {
    if (here != nullptr && submitting == here.get() && res.ok()) {
      here->reservation = std::move(*res);
      return;
    }
    // Never run the job on the thread that freed the room (or inside Start).
    auto held = std::make_shared<absl::StatusOr<Reservation>>(std::move(res));
    Post([this, r, problem, mode, arrived, diag = std::move(diag), group, call, done,
          held]() mutable {
      (*done)(Activate(r, problem, mode, arrived, diag, group, call, std::move(*held)));
    });
  };
  GroupRef group_ref;
  if (job.group.has_value()) group_ref = {job.group->id, job.group->parts};
  submitting = here.get();
  auto ticket =
      admission_->Submit(route->need, deadline, std::move(on_admit), client, group_ref);
  submitting = nullptr;
  if (!ticket.ok()) {
    Refused(route->pool, ticket.status(), job);
    return ticket;
  }
  if (here != nullptr && here->reservation.has_value()) {
    absl::StatusOr<std::unique_ptr<ActiveJob>> active =
        Activate(*route, problem, mode, arrived, prepared, group, call,
                 std::move(*here->reservation));
    if (active.ok()) {
      (*active)->gpu_here_ = std::exchange(gpu_place.count, nullptr);
      *admitted_here = std::move(*active);
    } else {
      // Begin failed (counted by Activate): the caller hears it as it would
      // have, from a worker.
      Post([done, failed = active.status()] { (*done)(failed); });
    }
  }
  return ticket;
}

absl::StatusOr<std::unique_ptr<ActiveJob>> Engine::Activate(
    const Route& r, const Problem& problem, JobMode mode, absl::Time arrived,
    const std::string& diag, const std::optional<JobGroup>& group, const JobCall& call,
    absl::StatusOr<Reservation> res) {
  if (!res.ok()) {
    metrics_->Refused(r.pool, res.status(), group.has_value() ? &*group : nullptr,
                      problem.lines());
    LogJob({.call = &call, .group = &group, .lines = problem.lines(), .status = res.status()},
           options_.log_jobs);
    return res.status();
  }
  std::unique_ptr<ActiveJob> active(new ActiveJob());
  active->engine_ = this;
  active->device_ = r.device;
  active->pool_ = r.pool;
  active->mode_ = mode;
  active->arrived_ = arrived;
  active->admitted_ = absl::Now();
  active->reservation_ = std::move(*res);
  active->stats_.job_id = next_job_id_++;
  active->stats_.backend = r.backend;
  active->stats_.device = r.device->index() < 0
                                ? r.device->name()
                                : absl::StrCat("cuda:", r.device->index(), " ", r.device->name());
  active->stats_.device_index = r.device->index();
  active->stats_.group = group;
  active->stats_.trace = call.trace;
  active->call_ = call;
  active->lines_ = problem.lines();
  auto context = r.device->Begin(problem, r.backend,
                                 reinterpret_cast<const std::byte*>(diag.data()), mode,
                                 options_.limits.max_block_bytes);
  if (!context.ok()) {
    active->End(context.status());
    return context.status();
  }
  active->context_ = std::move(*context);
  return active;
}

absl::StatusOr<Admission::Ticket> Engine::StartBatch(
    const std::vector<const JobRequest*>& jobs, absl::Time arrived, absl::Time deadline,
    BatchCallback done_fn, const ClientId& client, std::unique_ptr<AdmittedBatch>* admitted_here) {
  // Each job is counted once when the batch is refused.
  auto refuse_all = [&](int pool, const absl::Status& s) {
    for (const JobRequest* job : jobs) Refused(pool, s, *job);
    return s;
  };
  if (draining_) {
    return refuse_all(0, absl::UnavailableError("server is draining; retry on another replica"));
  }
  auto batch = std::make_shared<std::unique_ptr<AdmittedBatch>>(new AdmittedBatch());
  AdmittedBatch& b = **batch;
  b.engine_ = this;
  b.arrived_ = arrived;
  b.jobs_.reserve(jobs.size());
  Need need;
  int gpu = -1;  // the GPU the batch's GPU jobs run on, one after another
  // The largest block buffers one job of the batch holds beside the
  // request and the reply (the jobs run one after another).
  int64_t largest_block_bytes = 0;
  int64_t matrix_bytes = 0;
  bool all_cpu = true;
  for (const JobRequest* job : jobs) {
    JobRequest routed = *job;
    if (gpu >= 0) routed.gpu = gpu;  // the batch's GPU jobs share the first one's GPU
    auto route = RouteJob(routed, JobMode::kWhole);
    if (!route.ok()) return refuse_all(0, route.status());
    const Problem& jp = job->problem;
    const bool wider = jp.out_elem_size() != jp.elem_size();
    if (route->pool != 0) {
      all_cpu = false;
      gpu = route->device->index();
      need.device_pool = route->pool;
      need.device_bytes = std::max(need.device_bytes, route->need.device_bytes);
      // Its block buffer of A's size, and one of C's when C is wider.
      largest_block_bytes =
          std::max(largest_block_bytes, jp.matrix_bytes() + (wider ? jp.out_matrix_bytes() : 0));
    } else if (wider) {
      // A CPU job with a wider C computes from a block buffer of A's size
      // into the reply (BatchJob): held one job at a time, like a GPU job's.
      largest_block_bytes = std::max(largest_block_bytes, jp.matrix_bytes());
    }
    need.host_bytes += route->need.host_bytes + kBatchResultOverheadBytes;
    matrix_bytes += job->problem.matrix_bytes();
    b.jobs_.push_back({*route, job->problem,
                       PrepareDiagonals(job->problem, job->diagonal, job->right_diagonal),
                       job->group, job->call});
  }
  need.host_bytes += largest_block_bytes;
  if (need.host_bytes > admission_->capacity(0) ||
      (need.device_pool != 0 && need.device_bytes > admission_->capacity(need.device_pool))) {
    const bool host_short = need.host_bytes > admission_->capacity(0);
    const int pool = host_short ? 0 : need.device_pool;
    return refuse_all(
        pool,
        WithOutcome(
            absl::ResourceExhaustedError(absl::StrFormat(
                "batch of %d jobs needs %d bytes of %s memory together (each job's input and "
                "output matrices plus diagonal, held until the batch's reply is sent) but the "
                "%s budget's capacity is %d bytes (%s); send fewer or smaller jobs per batch",
                jobs.size(), host_short ? need.host_bytes : need.device_bytes,
                host_short ? "host" : "GPU", host_short ? "host" : absl::StrCat("GPU ", gpu),
                admission_->capacity(pool),
                host_short ? "--host_memory_budget" : "--gpu_memory_budget")),
            Outcome::kTooLarge));
  }
  struct Here {
    std::optional<Reservation> reservation;
  };
  std::shared_ptr<Here> here;
  if (admitted_here != nullptr && all_cpu && matrix_bytes <= kRunHereMaxMatrixBytes &&
      jobs.size() <= static_cast<size_t>(kRunHereMaxBatchJobs)) {
    here = std::make_shared<Here>();
  }
  thread_local const Here* submitting = nullptr;
  auto done = std::make_shared<BatchCallback>(std::move(done_fn));
  auto on_admit = [this, batch, done, here](absl::StatusOr<Reservation> res) {
    if (here != nullptr && submitting == here.get() && res.ok()) {
      here->reservation = std::move(*res);
      return;
    }
    // Never run the batch on the thread that freed the room.
    auto held = std::make_shared<absl::StatusOr<Reservation>>(std::move(res));
    Post([this, batch, done, held] {
      if (!held->ok()) {
        for (const AdmittedBatch::Job& j : (*batch)->jobs_) {
          metrics_->Refused(j.route.pool, held->status(), j.group.has_value() ? &*j.group : nullptr,
                            j.problem.lines());
          LogJob({.call = &j.call, .group = &j.group, .lines = j.problem.lines(),
                  .status = held->status()},
                 options_.log_jobs);
        }
        (*done)(held->status());
        return;
      }
      (*batch)->reservation_ = std::move(**held);
      (*done)(std::move(*batch));
    });
  };
  const int pool = need.device_pool;
  submitting = here.get();
  auto ticket = admission_->Submit(need, deadline, std::move(on_admit), client);
  submitting = nullptr;
  if (!ticket.ok()) return refuse_all(pool, ticket.status());
  if (here != nullptr && here->reservation.has_value()) {
    (*batch)->reservation_ = std::move(*here->reservation);
    *admitted_here = std::move(*batch);
  }
  return ticket;
}

absl::StatusOr<std::unique_ptr<ActiveJob>> AdmittedBatch::Activate(size_t i) {
  const Job& j = jobs_[i];
  // The batch's reservation covers the job: it reserves nothing of its own.
  return engine_->Activate(j.route, j.problem, JobMode::kWhole, arrived_, j.diagonal, j.group,
                           j.call, Reservation());
}

bool Engine::RunsHere(const Route& r, const Problem& p, JobMode mode) const {
  // The GPU path keeps its worker here: Process waits on the device (copies,
  // kernel, a sticky error), which must not hold transport threads (one
  // small GPU region job at a time may: RunsHereOnGpu). A host
  // region job is one tile between the client's memory (a mapped region or
  // the process's own, read and written with process_vm_readv/writev): as
  // short as a whole job's copy and compute at this size.
  return r.device == cpu_.get() && (mode == JobMode::kWhole || mode == JobMode::kHostRegion) &&
         p.matrix_bytes() <= kRunHereMaxMatrixBytes;
}

bool Engine::RunsHereOnGpu(const Route& r, const Problem& p, JobMode mode) const {
  return r.device != cpu_.get() && mode == JobMode::kHostRegion &&
         p.matrix_bytes() <= kRunHereGpuMaxMatrixBytes;
}

void Engine::JobEnded(ActiveJob* job, const absl::Status& status) {
  metrics_->Ended(job->pool_, job->mode_, job->stats_, job->lines_, status);
  LogJob({.call = &job->call_, .group = &job->stats_.group, .lines = job->lines_,
          .stats = &job->stats_, .status = status},
         options_.log_jobs);
  // A device error may have taken the device out of service.
  if (status.code() == absl::StatusCode::kInternal ||
      status.code() == absl::StatusCode::kUnavailable) {
    NotifyServing();
  }
}

void Engine::Refused(int pool, const absl::Status& s, const JobRequest& job) {
  metrics_->Refused(pool, s, job);
  LogJob({.call = &job.call, .group = &job.group, .lines = job.problem.lines(), .status = s},
         options_.log_jobs);
}

bool Engine::serving() const {
  if (draining_) return false;
  if (!gpu_default_) return true;
  for (const auto& g : gpus_) {
    if (g->in_service()) return true;
  }
  return false;
}

void Engine::NotifyServing() {
  if (serving_listener_) serving_listener_(serving());
}

bool Engine::Drain(absl::Duration timeout) {
  draining_ = true;
  admission_->StopAccepting();
  NotifyServing();
  const absl::Time deadline = absl::Now() + timeout;
  while (absl::Now() < deadline) {
    if (admission_->queued() == 0 && admission_->running() == 0) return true;
    absl::SleepFor(absl::Milliseconds(20));
  }
  admission_->Close();
  return false;
}

Engine::State Engine::Snapshot() const {
  State state;
  const std::vector<PoolStats> stats = admission_->Stats();
  for (int pool = 0; pool < admission_->pool_count(); ++pool) {
    const Device& dev = pool == 0 ? *cpu_ : *gpus_[pool - 1];
    state.devices.push_back(DeviceState{.index = dev.index(),
                                        .name = dev.name(),
                                        .total_memory_bytes = dev.total_memory_bytes(),
                                        .streams = dev.streams(),
                                        .in_service = dev.in_service(),
                                        .backends = dev.backends(),
                                        .budget = stats[pool]});
  }
  state.default_backend = !gpu_default_ ? BackendKind::kCpu
                                        : pinned_gpu_backend_.value_or(gpus_.front()->backends().front());
  state.auto_cpu_max_bytes =
      gpu_default_ && options_.backend == ServerBackend::kAuto ? options_.auto_cpu_max_bytes : 0;
  return state;
}

}  // namespace dgmm
