// Runs dgmm-server as a child process on one fixed loopback port so that it
// can be SIGKILLed and restarted where its clients expect it.
#ifndef DGMM_TESTS_STRESS_SERVER_SUPERVISOR_H_
#define DGMM_TESTS_STRESS_SERVER_SUPERVISOR_H_

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace dgmm::stress {

class ServerSupervisor {
 public:
  // Picks a free loopback port (binds port 0, reads it, closes) and a
  // directory for logs; starts nothing yet. `flags` are passed to every
  // start, after --listen and --port_file (and --allow_regions=false unless
  // they name --allow_regions: the load goes over the gRPC socket).
  ServerSupervisor(std::string binary, std::vector<std::string> flags);
  // Stops a running server (SIGTERM, then SIGKILL after 30 s) and removes
  // the log directory unless KeepLogs() was called.
  ~ServerSupervisor();
  ServerSupervisor(const ServerSupervisor&) = delete;
  ServerSupervisor& operator=(const ServerSupervisor&) = delete;

  // Launches the server and waits until it serves (it writes --port_file
  // once listening), up to `timeout`. The child dies with the thread that
  // started it (PR_SET_PDEATHSIG): call Start from the main thread.
  absl::Status Start(absl::Duration timeout);
  // SIGKILLs the server and reaps it. Returns its VmHWM sampled just before.
  int64_t Kill();
  // SIGTERM (drain), then waits up to `timeout` for the exit. Returns the
  // waitpid status, or nullopt if it had to be SIGKILLed.
  std::optional<int> Stop(absl::Duration timeout);
  // The waitpid status if the server exited without being told to.
  std::optional<int> ExitedUnexpectedly();

  // Peak resident set (VmHWM) of the running server in bytes, -1 if none.
  int64_t PeakRssBytes() const;
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  int starts() const { return starts_; }
  // Log of the current (last) server process.
  std::string LogTail(std::size_t max_bytes) const;
  const std::string& log_dir() const { return dir_; }
  void KeepLogs() { keep_logs_ = true; }

 private:
  std::string LogPath() const;

  std::string binary_;
  std::vector<std::string> flags_;
  std::string address_;
  std::string dir_;
  pid_t pid_ = -1;
  int starts_ = 0;
  bool keep_logs_ = false;
};

}  // namespace dgmm::stress

#endif  // DGMM_TESTS_STRESS_SERVER_SUPERVISOR_H_
