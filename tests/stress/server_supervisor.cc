#include "tests/stress/server_supervisor.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "tests/support/files.h"
#include "tests/support/server_process.h"

namespace dgmm::stress {

ServerSupervisor::ServerSupervisor(std::string binary, std::vector<std::string> flags)
    : binary_(std::move(binary)), flags_(std::move(flags)) {
  address_ = absl::StrCat("127.0.0.1:", testing::FreeLoopbackPort());
  char tmpl[] = "/tmp/dgmm-load-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("load_test: mkdtemp");
    std::abort();
  }
  dir_ = tmpl;
}

ServerSupervisor::~ServerSupervisor() {
  if (pid_ > 0) Stop(absl::Seconds(30));
  if (!keep_logs_) {
    std::error_code ignored;
    std::filesystem::remove_all(dir_, ignored);
  }
}

std::string ServerSupervisor::LogPath() const {
  return absl::StrCat(dir_, "/server-", starts_, ".log");
}

absl::Status ServerSupervisor::Start(absl::Duration timeout) {
  if (pid_ > 0) return absl::FailedPreconditionError("the server is already running");
  ++starts_;
  const std::string port_file = dir_ + "/port";
  std::remove(port_file.c_str());
  std::vector<std::string> args = {binary_, "--listen=" + address_, "--port_file=" + port_file};
  // The load runs over the gRPC socket unless the flags ask for regions.
  const std::vector<std::string> flags = testing::RegionsOffUnlessAsked(flags_);
  args.insert(args.end(), flags.begin(), flags.end());
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const std::string log = LogPath();
  const pid_t parent = getpid();
  pid_ = fork();
  if (pid_ == 0) {
    // Only async-signal-safe calls until exec: the parent has many threads.
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (pid_ < 0) return absl::InternalError("fork failed");
  const absl::Time end = absl::Now() + timeout;
  while (absl::Now() < end) {
    const std::string port = testing::ReadFile(port_file).value_or("");
    if (!port.empty() && port.back() == '\n') return absl::OkStatus();
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(
          absl::StrCat(binary_, " exited (status ", status, ") before serving:\n", LogTail(4000)));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      binary_, " did not serve within ", absl::FormatDuration(timeout), ":\n", LogTail(4000)));
}

int64_t ServerSupervisor::Kill() {
  if (pid_ <= 0) return -1;
  const int64_t peak = PeakRssBytes();
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return peak;
}

std::optional<int> ServerSupervisor::Stop(absl::Duration timeout) {
  if (pid_ <= 0) return std::nullopt;
  kill(pid_, SIGTERM);
  const absl::Time end = absl::Now() + timeout;
  int status = 0;
  while (absl::Now() < end) {
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  kill(pid_, SIGKILL);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
  return std::nullopt;
}

std::optional<int> ServerSupervisor::ExitedUnexpectedly() {
  if (pid_ <= 0) return std::nullopt;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return std::nullopt;
  pid_ = -1;
  return status;
}

int64_t ServerSupervisor::PeakRssBytes() const {
  if (pid_ <= 0) return -1;
  std::ifstream f(absl::StrCat("/proc/", pid_, "/status"));
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  }
  return -1;
}

std::string ServerSupervisor::LogTail(std::size_t max_bytes) const {
  const std::string log = testing::ReadFile(LogPath()).value_or("");
  return log.size() <= max_bytes ? log : log.substr(log.size() - max_bytes);
}

}  // namespace dgmm::stress
