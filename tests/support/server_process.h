// Starts a real dgmm-server process on an ephemeral loopback port for a test
// and stops it (SIGTERM, then SIGKILL) when destroyed.
#ifndef DGMM_TESTS_SUPPORT_SERVER_PROCESS_H_
#define DGMM_TESTS_SUPPORT_SERVER_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace dgmm::testing {

// Path of the built dgmm-server (from the DGMM_SERVER_BIN compile definition
// or the environment variable of the same name).
std::string ServerBinary();
// Path of the built dgmm-cli (DGMM_CLI_BIN likewise).
std::string CliBinary();

class ServerProcess {
 public:
  // What the server is started with besides the test's flags.
  enum class Regions {
    // --allow_regions=false unless `extra_flags` name --allow_regions: the
    // server's default is on, and a client on this host then takes the
    // same-host path, so tests of the gRPC socket (unary, stream, stripes,
    // retries, drain...) say that they want the socket.
    kOffUnlessAsked,
    // Nothing added: the server's own default (tests of the defaults).
    kServerDefault,
  };

  // Launches dgmm-server with `--listen=127.0.0.1:0 --port_file=...` plus
  // `extra_flags`, and waits (up to 30 s) until it has written its port.
  // Aborts the test binary if the server does not come up.
  // With `open_files_limit` > 0, the server starts with RLIMIT_NOFILE (soft
  // and hard) at that value.
  explicit ServerProcess(std::vector<std::string> extra_flags = {}, int open_files_limit = 0,
                         Regions regions = Regions::kOffUnlessAsked);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  // "127.0.0.1:PORT".
  const std::string& address() const { return address_; }
  pid_t pid() const { return pid_; }
  // Sends `sig`; with wait, reaps the process and returns its exit status
  // as from waitpid (or -1).
  int Signal(int sig, bool wait);
  // Waits up to `timeout_ms` for the process to exit by itself; returns its
  // waitpid status, or -1 if it is still running.
  int WaitForExit(int timeout_ms);
  // Server's stderr so far (it is redirected to a file).
  std::string Log() const;
  // Peak resident set of the process so far, in bytes (VmHWM).
  long PeakRssBytes() const;

 private:
  pid_t pid_ = -1;
  std::string address_;
  std::string dir_;
};

// `flags` after --allow_regions=false, unless they name --allow_regions: the
// server's default serves regions, and a client on this host then takes
// the same-host path, so a server for tests of the gRPC socket keeps the
// socket unless the test asks for regions.
std::vector<std::string> RegionsOffUnlessAsked(std::vector<std::string> flags);

// A loopback port that was free a moment ago (bound, read, released). A
// server binds it with SO_REUSEADDR, so it gets it back after a SIGKILL too.
int FreeLoopbackPort();

// Runs a command line through /bin/sh, returns its exit code, and stores
// stdout+stderr in *output.
int RunCommand(const std::string& command, std::string* output);

}  // namespace dgmm::testing

#endif  // DGMM_TESTS_SUPPORT_SERVER_PROCESS_H_
