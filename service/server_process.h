// The process around the server: the allocator and signal set-up, the
// devices and the engine, the connection cap, the idle memory trimmer, the
// start log, the port file and the bounded shutdown. main.cc strings them
// together.
#ifndef DGMM_SERVICE_SERVER_PROCESS_H_
#define DGMM_SERVICE_SERVER_PROCESS_H_

#include <signal.h>

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/engine/engine.h"
#include "service/flags.h"
#include "service/server.h"

namespace dgmm {

// Allocator and lock settings for a long-running server (glibc arenas capped
// at two unless MALLOC_ARENA_MAX is set; Abseil's deadlock detection off).
void TuneProcess();

// Blocks SIGINT and SIGTERM in this thread and every thread started after
// it, so that WaitForStopSignal alone takes them.
sigset_t BlockStopSignals();
int WaitForStopSignal(const sigset_t& signals);

// The CPU device and, unless --backend=cpu, every usable GPU, in an engine.
// INVALID_ARGUMENT for a bad --cuda_* value or a budget the engine refuses; a
// missing or failing GPU is logged and the engine runs on the CPU.
absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const ServerConfig& config);

// Caps connections by the descriptors they take (service/conn_guard.h): the
// server's own plus --max_connections, never within 64 of the open-files
// limit, which `open_files` is (RaiseOpenFileLimit). Logs the cap.
void GuardConnections(const ServerConfig& config, int64_t open_files, int64_t transport_bytes);

// Gives freed memory back while the server idles: malloc_trim every 2 s with
// nothing reserved, and the CPU backend's cached block buffers once two ticks
// in a row saw nothing reserved and no job submitted. Stops when destroyed.
class IdleTrimmer {
 public:
  explicit IdleTrimmer(Engine* engine);
  ~IdleTrimmer();
  IdleTrimmer(const IdleTrimmer&) = delete;
  IdleTrimmer& operator=(const IdleTrimmer&) = delete;

 private:
  void Run();
  Engine* const engine_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

// The start log: devices and budgets, where jobs run, the address, TLS and
// auth, the metrics endpoint. Then the port file, if asked for.
void AnnounceServing(const ServerConfig& config, const Engine& engine, const Server& server);

// Ends the process if the shutdown has not finished within `drain` plus 10 s
// (a call that never finishes must not keep it alive).
void ArmShutdownWatchdog(absl::Duration drain);

}  // namespace dgmm

#endif  // DGMM_SERVICE_SERVER_PROCESS_H_
