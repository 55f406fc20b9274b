#include "service/server_process.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "service/backends/cpu/cpu_device.h"
#include "service/conn_guard.h"
#include "service/core/log.h"
#include "service/engine/server_backend.h"
#ifdef DGMM_HAVE_CUDA
#include "service/backends/cuda/cuda_devices.h"
#endif

namespace dgmm {

void TuneProcess() {
  // Stream blocks are multi-MiB strings allocated and freed on gRPC and job
  // threads; glibc's per-thread arenas keep freed blocks and let RSS drift up
  // over a long stream (176-440 MiB peak at N=40000 without this, 155-165
  // MiB with it).
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, 2);
  // Debian's Abseil is built with mutex deadlock detection on: every
  // absl::Mutex lock -- gRPC's own included -- then updates a global lock
  // graph (0.5-1.2% of the server's samples on the 2-core build machine). It
  // is a debugging aid; off here.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

sigset_t BlockStopSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  return signals;
}

int WaitForStopSignal(const sigset_t& signals) {
  int sig = 0;
  sigwait(&signals, &sig);
  return sig;
}

absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const ServerConfig& config) {
  std::vector<std::unique_ptr<Device>> gpus;
  if (config.engine.backend != ServerBackend::kCpu) {
#ifdef DGMM_HAVE_CUDA
    CudaOptions co;
    co.streams = config.cuda_streams;
    co.tile_bytes = config.cuda_tile_bytes;
    co.pieces_in_flight = config.cuda_pieces_in_flight;
    std::string why_none;
    auto found = CreateCudaDevices(co, &why_none);
    if (!found.ok() && absl::IsInvalidArgument(found.status())) {
      // A bad --cuda_* value, not a missing GPU: not a reason to fall back.
      return found.status();
    } else if (!found.ok()) {
      LogInfo("GPU initialisation failed: ", found.status().message());
    } else {
      gpus = std::move(*found);
      if (gpus.empty()) LogInfo("no usable GPU: ", why_none);
    }
#else
    LogInfo("this dgmm-server was built without CUDA");
#endif
  }
  return Engine::Create(config.engine, std::make_unique<CpuDevice>(config.cpu_threads),
                        std::move(gpus));
}

void GuardConnections(const ServerConfig& config, int64_t open_files, int64_t transport_bytes) {
  const int own_fds = LowestFreeFd();
  const int64_t ceiling = std::min<int64_t>(
      {open_files - 64, static_cast<int64_t>(own_fds) + config.max_connections, INT32_MAX});
  ArmConnGuard(static_cast<int>(std::max<int64_t>(ceiling, own_fds + 1)));
  LogInfo("open files: limit ", open_files, ", connections refused beyond descriptor ",
          GetConnGuardStats().ceiling, "; gRPC transport memory ", transport_bytes, " bytes");
}

IdleTrimmer::IdleTrimmer(Engine* engine) : engine_(engine), thread_([this] { Run(); }) {}

IdleTrimmer::~IdleTrimmer() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void IdleTrimmer::Run() {
  std::unique_lock lock(mu_);
  int idle_ticks = 0;
  int64_t jobs_seen = engine_->jobs_submitted();
  while (!cv_.wait_for(lock, std::chrono::seconds(2), [&] { return stop_; })) {
    const int64_t jobs = engine_->jobs_submitted();
    const bool quiet = jobs == jobs_seen;
    jobs_seen = jobs;
    if (engine_->total_reserved() != 0 || !quiet) {
      idle_ticks = 0;
      if (engine_->total_reserved() == 0) malloc_trim(0);
      continue;
    }
    if (++idle_ticks == 2) engine_->host_block_buffers().ReleaseCached();
    malloc_trim(0);
  }
}

void AnnounceServing(const ServerConfig& config, const Engine& engine, const Server& server) {
  if (!config.from_environment.empty()) {
    LogInfo("flags from environment: ", absl::StrJoin(config.from_environment, ", "));
  }
  for (const Engine::DeviceState& d : engine.Snapshot().devices) {
    LogInfo("device ", d.index < 0 ? std::string("cpu") : absl::StrCat("cuda:", d.index), ": ",
            d.name, ", budget ", d.budget.capacity, " bytes of ", d.total_memory_bytes);
  }
  LogInfo(engine.gpu_count() > 0 && config.engine.backend != ServerBackend::kCpu
              ? "jobs run on the GPU by default"
              : "jobs run on the CPU backend (no GPU in use)");
  const ServerOptions& so = config.server;
  LogInfo("dgmm-server ", DGMM_VERSION, " listening on ", so.listen, " (port ", server.port(),
          ", ",
          so.tls_cert_file.empty()        ? "plaintext"
          : so.tls_client_ca_file.empty() ? "TLS"
                                          : "mutual TLS",
          so.auth_token_file.empty() ? "" : ", bearer token required", ")");
  if (server.metrics_port() != 0) {
    LogInfo("metrics at http://", so.metrics_listen, "/metrics (port ", server.metrics_port(),
            ")");
  }
  if (!config.port_file.empty()) {
    const std::string tmp = config.port_file + ".tmp";
    std::ofstream(tmp) << server.port() << "\n";
    std::rename(tmp.c_str(), config.port_file.c_str());
  }
}

void ArmShutdownWatchdog(absl::Duration drain) {
  std::thread([drain] {
    absl::SleepFor(drain + absl::Seconds(10));
    LogInfo("shutdown did not finish within the drain timeout plus 10s; exiting");
    std::_Exit(1);
  }).detach();
}

}  // namespace dgmm
