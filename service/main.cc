// dgmm-server: serves C = A·diag(d) and C = diag(d)·A over gRPC.
//
// Reads the flags (service/flags.cc), builds the engine on the host's
// devices, starts the server, and serves until SIGINT or SIGTERM; then
// drains: health turns NOT_SERVING, new jobs get UNAVAILABLE, and jobs in
// flight get --drain_timeout_s to finish.
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "service/conn_guard.h"
#include "service/core/log.h"
#include "service/flags.h"
#include "service/server.h"
#include "service/server_process.h"

namespace {

// Bad flags and the like: exit status 2, as a usage error.
int UsageError(const absl::Status& s) {
  std::fprintf(stderr, "dgmm-server: %s\n", std::string(s.message()).c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  dgmm::TuneProcess();
  absl::StatusOr<dgmm::ServerConfig> config = dgmm::ReadFlags(argc, argv);
  if (!config.ok()) return UsageError(config.status());
  // Before any thread starts, so that every thread inherits the mask.
  const sigset_t stop_signals = dgmm::BlockStopSignals();

  auto engine = dgmm::MakeEngine(*config);
  if (!engine.ok()) return UsageError(engine.status());
  dgmm::Engine* e = engine->get();
  auto transport_bytes = dgmm::TransportMemoryBytes(*config, e->Snapshot().devices[0].budget.capacity);
  if (!transport_bytes.ok()) return UsageError(transport_bytes.status());
  config->server.transport_memory_bytes = *transport_bytes;
  const int64_t open_files = dgmm::RaiseOpenFileLimit();

  auto server = dgmm::Server::Start(config->server, std::move(*engine));
  if (!server.ok()) {
    std::fprintf(stderr, "dgmm-server: %s\n", std::string(server.status().message()).c_str());
    return 1;
  }
  dgmm::GuardConnections(*config, open_files, *transport_bytes);
  auto trimmer = std::make_unique<dgmm::IdleTrimmer>(e);
  dgmm::AnnounceServing(*config, *e, **server);

  const int sig = dgmm::WaitForStopSignal(stop_signals);
  dgmm::LogInfo("signal ", sig, ": draining (health NOT_SERVING, new jobs UNAVAILABLE, up to ",
                absl::FormatDuration(config->drain_timeout), " for jobs in flight)");
  dgmm::ArmShutdownWatchdog(config->drain_timeout);
  trimmer.reset();
  const bool clean = (*server)->Drain(config->drain_timeout);
  dgmm::LogInfo(clean ? "drained; every job finished" : "drain timeout; unfinished jobs were ended");
  dgmm::LogInfo("stopped");
  // Exit with the connections still open (Server::Drain says why): the
  // kernel closes them, and a call caught in flight fails with UNAVAILABLE.
  std::fflush(nullptr);
  std::_Exit(0);
}
