#include "tests/support/server_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "tests/support/files.h"

namespace dgmm::testing {
namespace {

std::string FromEnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr && *v != '\0' ? v : fallback;
}

}  // namespace

std::vector<std::string> RegionsOffUnlessAsked(std::vector<std::string> flags) {
  const bool named = std::any_of(flags.begin(), flags.end(), [](const std::string& f) {
    return f.rfind("--allow_regions", 0) == 0 || f.rfind("--noallow_regions", 0) == 0;
  });
  if (!named) flags.insert(flags.begin(), "--allow_regions=false");
  return flags;
}

std::string ServerBinary() { return FromEnvOr("DGMM_SERVER_BIN", DGMM_SERVER_BIN); }
std::string CliBinary() { return FromEnvOr("DGMM_CLI_BIN", DGMM_CLI_BIN); }

ServerProcess::ServerProcess(std::vector<std::string> extra_flags, int open_files_limit,
                             Regions regions) {
  char tmpl[] = "/tmp/dgmm-test-XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    std::perror("mkdtemp");
    std::abort();
  }
  dir_ = tmpl;
  const std::string port_file = dir_ + "/port";
  const std::string log_file = dir_ + "/server.log";
  std::vector<std::string> args = {ServerBinary(), "--listen=127.0.0.1:0",
                                   "--port_file=" + port_file};
  if (regions == Regions::kOffUnlessAsked) extra_flags = RegionsOffUnlessAsked(extra_flags);
  args.insert(args.end(), extra_flags.begin(), extra_flags.end());

  pid_ = fork();
  if (pid_ == 0) {
    int fd = open(log_file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
    }
    if (open_files_limit > 0) {
      const rlimit limit{static_cast<rlim_t>(open_files_limit),
                         static_cast<rlim_t>(open_files_limit)};
      setrlimit(RLIMIT_NOFILE, &limit);
    }
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    std::perror("execv dgmm-server");
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    std::string port = ReadFile(port_file).value_or("");
    if (!port.empty() && port.back() == '\n') {
      port.pop_back();
      address_ = "127.0.0.1:" + port;
      return;
    }
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      std::fprintf(stderr, "dgmm-server exited early:\n%s\n", Log().c_str());
      std::abort();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  std::fprintf(stderr, "dgmm-server did not start within 30 s:\n%s\n", Log().c_str());
  std::abort();
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGTERM);
    for (int i = 0; i < 200; ++i) {
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
  }
  std::string cmd = "rm -rf '" + dir_ + "'";
  [[maybe_unused]] int rc = std::system(cmd.c_str());
}

int ServerProcess::Signal(int sig, bool wait) {
  if (pid_ <= 0) return -1;
  kill(pid_, sig);
  if (!wait) return 0;
  int status = -1;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

int ServerProcess::WaitForExit(int timeout_ms) {
  if (pid_ <= 0) return -1;
  for (int waited = 0; waited <= timeout_ms; waited += 20) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      pid_ = -1;
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return -1;
}

std::string ServerProcess::Log() const { return ReadFile(dir_ + "/server.log").value_or(""); }

long ServerProcess::PeakRssBytes() const {
  std::ifstream f("/proc/" + std::to_string(pid_) + "/status");
  std::string line;
  while (std::getline(f, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6)) * 1024;
  }
  return -1;
}

int RunCommand(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  std::size_t n;
  output->clear();
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output->append(buf, n);
  int status = pclose(p);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::perror("FreeLoopbackPort");
    std::abort();
  }
  close(fd);
  return ntohs(addr.sin_port);
}

}  // namespace dgmm::testing
