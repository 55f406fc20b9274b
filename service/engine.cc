#include "service/engine.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/pipeline/block_pipeline.h"
#include "service/util/log.h"
#include "util/flag_names.h"

namespace dgmm {
namespace {

v1::Backend ToWire(BackendKind b) {
  switch (b) {
    case BackendKind::kCpu:
      return v1::BACKEND_CPU;
    case BackendKind::kCudaKernel:
      return v1::BACKEND_CUDA_KERNEL;
    case BackendKind::kCublas:
      return v1::BACKEND_CUBLAS;
  }
  return v1::BACKEND_AUTO;
}

absl::string_view ModeName(JobMode m) {
  switch (m) {
    case JobMode::kWhole:
      return "unary";
    case JobMode::kStreamed:
      return "streamed";
    case JobMode::kHostRegion:
      return "host-region";
    case JobMode::kDeviceRegion:
      return "cuda-ipc-region";
  }
  return "?";
}

int LatencyIndex(JobMode m) {
  return m == JobMode::kWhole ? 0 : m == JobMode::kStreamed ? 1 : 2;
}

}  // namespace

ActiveJob::~ActiveJob() {
  if (!ended_) End(absl::CancelledError("job abandoned"));
}

absl::Status ActiveJob::Process(const Tile& tile, const CancelFn& cancelled) {
  return context_->Process(tile, cancelled, &times_);
}

void ActiveJob::End(const absl::Status& status) {
  if (ended_) return;
  ended_ = true;
  const absl::Time now = absl::Now();
  stats_.set_queue_wait_ns(absl::ToInt64Nanoseconds(admitted_ - arrived_));
  stats_.set_h2d_ns(absl::ToInt64Nanoseconds(times_.h2d));
  stats_.set_compute_ns(absl::ToInt64Nanoseconds(times_.compute));
  stats_.set_d2h_ns(absl::ToInt64Nanoseconds(times_.d2h));
  stats_.set_total_ns(absl::ToInt64Nanoseconds(now - arrived_));
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
  const bool wants_gpu = job.backend.has_value() ? *job.backend != BackendKind::kCpu
                                                 : gpu_default_ || mode == JobMode::kDeviceRegion;
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
    r.need.device_pool = r.pool;
    r.need.device_bytes = r.device->Footprint(p, mode, options_.limits.max_block_bytes);
  }
  r.need.host_bytes = HostFootprint(p, mode, options_.limits.max_block_bytes);
  if (r.need.host_bytes > admission_->capacity(0) ||
      (r.pool != 0 && r.need.device_bytes > admission_->capacity(r.pool))) {
    return TooLarge(p, mode, r);
  }
  return r;
}

absl::Status Engine::TooLarge(const Problem& p, JobMode mode, const Route& r) const {
  const bool host_short = r.need.host_bytes > admission_->capacity(0);
  const Device& dev = host_short ? *cpu_ : *r.device;
  const int pool = host_short ? 0 : r.pool;
  const int64_t need = host_short ? r.need.host_bytes : r.need.device_bytes;
  const int64_t capacity = admission_->capacity(pool);
  const int64_t max_block = options_.limits.max_block_bytes;

  auto largest_n = [&](JobMode m) {
    int64_t hi = options_.limits.max_dim;
    if (m == JobMode::kStreamed) hi = std::min<int64_t>(hi, max_block / p.elem_size());
    int64_t lo = 0;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo + 1) / 2;
      Problem sq = p;
      sq.rows = sq.cols = mid;
      const int64_t fp = host_short ? HostFootprint(sq, m, max_block) : dev.Footprint(sq, m, max_block);
      if (fp <= capacity) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    return lo;
  };
  std::string msg = absl::StrFormat(
      "job needs %d bytes of %s memory (%s %s %dx%d: %s) but the %s budget's capacity is %d "
      "bytes (%s); the largest square %s matrix that fits %s is N=%d.",
      need, host_short ? "host" : "GPU", ModeName(mode), DTypeName(p.dtype), p.rows, p.cols,
      mode == JobMode::kWhole ? "input and output matrices plus diagonal"
                              : "streaming window plus diagonal",
      host_short ? "host" : absl::StrCat("GPU ", dev.index()), capacity,
      host_short ? "--host_memory_budget" : "--gpu_memory_budget", DTypeName(p.dtype),
      ModeName(mode), largest_n(mode));
  if (mode == JobMode::kWhole) {
    const int64_t streamed = host_short ? HostFootprint(p, JobMode::kStreamed, max_block)
                                        : dev.Footprint(p, JobMode::kStreamed, max_block);
    if (streamed <= capacity && p.line_bytes() <= max_block) {
      absl::StrAppendFormat(&msg,
                            " Streamed, this job needs only %d bytes and fits: use "
                            "MultiplyStream (dgmm-cli and the dgmm clients stream large "
                            "matrices on their own).",
                            streamed);
    }
  }
  return WithOutcome(absl::ResourceExhaustedError(msg), Outcome::kTooLarge);
}

absl::StatusOr<Admission::Ticket> Engine::Start(const JobRequest& job, JobMode mode,
                                                absl::Time arrived, absl::Time deadline,
                                                StartCallback done, const std::string& client) {
  if (draining_) {
    admission_->RecordOutcome(0, Outcome::kUnavailable);
    const absl::Status draining =
        absl::UnavailableError("server is draining; retry on another replica");
    if (job.group.has_value()) GroupPartEnded(*job.group, job.problem.lines(), 0, draining);
    return draining;
  }
  auto route = RouteJob(job, mode);
  if (!route.ok()) {
    admission_->RecordOutcome(0, OutcomeOf(route.status()));
    if (job.group.has_value()) {
      GroupPartEnded(*job.group, job.problem.lines(), 0, route.status());
    }
    return route.status();
  }
  const Problem problem = job.problem;
  const std::optional<v1::JobGroup> group = job.group;
  auto on_admit = [this, r = *route, problem, mode, arrived, diag = std::string(job.diagonal),
                   group, done = std::move(done)](absl::StatusOr<Reservation> res) mutable {
    // Never run the job on the thread that freed the room (or inside Start).
    auto held = std::make_shared<absl::StatusOr<Reservation>>(std::move(res));
    Post([this, r, problem, mode, arrived, diag = std::move(diag), group,
          done = std::move(done), held]() mutable {
      absl::StatusOr<Reservation>& res = *held;
      if (!res.ok()) {
        admission_->RecordOutcome(r.pool, OutcomeOf(res.status()));
        if (group.has_value()) GroupPartEnded(*group, problem.lines(), 0, res.status());
        done(res.status());
        return;
      }
      std::unique_ptr<ActiveJob> active(new ActiveJob());
      active->engine_ = this;
      active->device_ = r.device;
      active->pool_ = r.pool;
      active->mode_ = mode;
      active->arrived_ = arrived;
      active->admitted_ = absl::Now();
      active->reservation_ = std::move(*res);
      active->stats_.set_job_id(next_job_id_++);
      active->stats_.set_backend(ToWire(r.backend));
      active->stats_.set_device(r.device->index() < 0
                                    ? r.device->name()
                                    : absl::StrCat("cuda:", r.device->index(), " ",
                                                   r.device->name()));
      active->stats_.set_device_index(r.device->index());
      if (group.has_value()) *active->stats_.mutable_group() = *group;
      active->lines_ = problem.lines();
      auto context = r.device->Begin(problem, r.backend,
                                     reinterpret_cast<const std::byte*>(diag.data()), mode,
                                     options_.limits.max_block_bytes);
      if (!context.ok()) {
        active->End(context.status());
        done(context.status());
        return;
      }
      active->context_ = std::move(*context);
      done(std::move(active));
    });
  };
  GroupRef group_ref;
  if (job.group.has_value()) group_ref = {job.group->id(), job.group->parts()};
  auto ticket =
      admission_->Submit(route->need, deadline, std::move(on_admit), client, group_ref);
  if (!ticket.ok()) {
    admission_->RecordOutcome(route->pool, OutcomeOf(ticket.status()));
    if (job.group.has_value()) GroupPartEnded(*job.group, problem.lines(), 0, ticket.status());
  }
  return ticket;
}

void Engine::RecordRejected(const absl::Status& s) { admission_->RecordOutcome(0, OutcomeOf(s)); }

void Engine::GroupPartEnded(const v1::JobGroup& group, int64_t lines, uint64_t job_id,
                            const absl::Status& status) {
  const std::string outcome =
      status.ok() ? "completed" : std::string(OutcomeName(OutcomeOf(status)));
  {
    std::lock_guard lock(latency_mu_);
    group_parts_[outcome]++;
  }
  // One line per part, so that an operator (and the fault test) can follow a
  // logical job's line ranges over the replicas.
  LogInfo("job ", job_id, " group ", group.id(), " lines [", group.first_line(), ",",
          group.first_line() + lines, ") of ", group.total_lines(), " (", group.parts(),
          " parts): ", outcome,
          status.ok() ? std::string()
                      : absl::StrCat(" (", absl::StatusCodeToString(status.code()), ": ",
                                     status.message(), ")"));
}

std::map<std::string, int64_t> Engine::GroupParts() const {
  std::lock_guard lock(latency_mu_);
  return group_parts_;
}

void Engine::JobEnded(ActiveJob* job, const absl::Status& status) {
  admission_->RecordOutcome(job->pool_, OutcomeOf(status));
  if (job->stats_.has_group()) {
    GroupPartEnded(job->stats_.group(), job->lines_, job->stats_.job_id(), status);
  }
  if (status.ok()) {
    const double seconds = static_cast<double>(job->stats_.total_ns()) * 1e-9;
    std::lock_guard lock(latency_mu_);
    LatencyHistogram& h = latency_[LatencyIndex(job->mode_)];
    std::size_t b = 0;
    while (b < std::size(kLatencyBuckets) && seconds > kLatencyBuckets[b]) ++b;
    h.counts[b]++;
    h.sum_seconds += seconds;
    h.count++;
  }
  // A device error may have taken the device out of service.
  if (status.code() == absl::StatusCode::kInternal ||
      status.code() == absl::StatusCode::kUnavailable) {
    NotifyServing();
  }
}

LatencyHistogram Engine::Latency(JobMode mode) const {
  std::lock_guard lock(latency_mu_);
  return latency_[LatencyIndex(mode)];
}

RegionMemoryOps Engine::RegionOps() {
  RegionMemoryOps ops;
  if (gpus_.empty()) return ops;
  Device* first = gpus_.front().get();
  ops.pin_host = [first](void* p, int64_t bytes) { return first->PinHostMemory(p, bytes); };
  ops.open_ipc = [this](int device,
                        absl::string_view handle) -> absl::StatusOr<RegionMemoryOps::IpcMemory> {
    for (const auto& g : gpus_) {
      if (g->index() != device) continue;
      auto m = g->OpenIpcMemory(handle);
      if (!m.ok()) return m.status();
      return RegionMemoryOps::IpcMemory{.base = m->base, .bytes = m->bytes,
                                         .close = std::move(m->close)};
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "this server has no GPU ", device, " in use (GetServerInfo lists its GPUs)"));
  };
  return ops;
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

v1::GetServerInfoResponse Engine::Info() const {
  v1::GetServerInfoResponse info;
  info.set_version(DGMM_VERSION);
  const std::vector<PoolStats> stats = admission_->Stats();
  for (int pool = 0; pool < admission_->pool_count(); ++pool) {
    const Device& dev = pool == 0 ? *cpu_ : *gpus_[pool - 1];
    const PoolStats& s = stats[pool];
    v1::DeviceInfo* d = info.add_devices();
    d->set_index(dev.index());
    d->set_name(dev.name());
    d->set_total_memory_bytes(dev.total_memory_bytes());
    d->set_budget_bytes(s.capacity);
    d->set_reserved_bytes(s.reserved);
    d->set_streams(dev.streams());
    d->set_queued_jobs(s.queued);
    d->set_running_jobs(s.running);
    d->set_completed_jobs(s.completed);
    for (const auto& [reason, n] : s.rejected) (*d->mutable_rejected_jobs())[reason] = n;
    d->set_in_service(dev.in_service());
    for (BackendKind b : dev.backends()) d->add_backends(ToWire(b));
  }
  v1::Limits* l = info.mutable_limits();
  l->set_max_unary_message_bytes(options_.limits.max_unary_message_bytes);
  l->set_max_block_bytes(options_.limits.max_block_bytes);
  l->set_max_dim(options_.limits.max_dim);
  l->set_max_queue(options_.max_queue);
  info.add_dtypes(v1::DTYPE_FLOAT32);
  info.add_dtypes(v1::DTYPE_FLOAT64);
  info.set_default_backend(
      !gpu_default_ ? v1::BACKEND_CPU
                    : ToWire(pinned_gpu_backend_.value_or(gpus_.front()->backends().front())));
  return info;
}

}  // namespace dgmm
