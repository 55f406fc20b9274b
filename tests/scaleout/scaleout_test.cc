// Scale-out: several dgmm-server processes serve one client. Client-side
// round_robin over three servers, then an nginx grpc_pass front over two.
// Every job's result is checked against a float64 reference; every server
// must take a share; one server is killed mid-run (stopped first, so that
// jobs are certainly in flight on it when it dies) and the client's retries
// must carry its jobs to the others: nothing lost, nothing wrong.
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "dgmm/client.h"
#include "gtest/gtest.h"
#include "tests/support/files.h"
#include "tests/support/operands.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using testing::Operands;
using testing::ServerProcess;

constexpr int kThreads = 4;

// What a batch of jobs came to.
struct Tally {
  std::atomic<int> finished{0};
  std::atomic<int> ok{0};
  std::atomic<int> lost{0};   // the client returned an error
  std::atomic<int> wrong{0};  // a result that differs from the reference
  std::atomic<int> retried{0};
  absl::Mutex mu;
  std::vector<std::string> errors ABSL_GUARDED_BY(mu);

  void Error(std::string what) {
    absl::MutexLock lock(&mu);
    if (errors.size() < 5) errors.push_back(std::move(what));
  }
  std::string Errors() {
    absl::MutexLock lock(&mu);
    return absl::StrJoin(errors, "\n");
  }
};

// Job `id`: a random shape up to 96x96, dtype, layout and side, values in
// [-4, 4); the result checked against a float64 reference.
template <typename T>
void RunTypedJob(Client& client, std::mt19937_64& rng, Tally* tally) {
  std::uniform_int_distribution<int64_t> dim(1, 96);
  const int64_t rows = dim(rng), cols = dim(rng);
  const v1::Layout layout = rng() % 2 ? v1::LAYOUT_ROW_MAJOR : v1::LAYOUT_COL_MAJOR;
  const v1::Side side = rng() % 2 ? v1::SIDE_RIGHT : v1::SIDE_LEFT;
  const Operands<T> ops(rows, cols, layout, side, rng());
  std::vector<T> c = ops.NanOutput();
  absl::StatusOr<JobResult> result = client.Multiply(ops.MakeJob(), c.data(), c.size() * sizeof(T));
  tally->finished.fetch_add(1);
  if (!result.ok()) {
    tally->lost.fetch_add(1);
    tally->Error(result.status().ToString());
    return;
  }
  if (result->attempts > 1) tally->retried.fetch_add(1);
  const double tolerance = sizeof(T) == 4 ? 1e-6 : 1e-15;
  if (const double err = ops.MaxRelativeError(c); !(err <= tolerance)) {
    tally->wrong.fetch_add(1);
    tally->Error(absl::StrCat("wrong result of a ", rows, "x", cols, " job: relative error ", err));
    return;
  }
  tally->ok.fetch_add(1);
}

// Runs jobs [first, first + count) from kThreads threads.
void RunJobs(Client& client, int first, int count, Tally* tally) {
  std::atomic<int> next{first};
  std::vector<std::thread> workers;
  workers.reserve(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&] {
      for (int id = next++; id < first + count; id = next++) {
        std::mt19937_64 rng(static_cast<uint64_t>(id));
        if (rng() % 2) {
          RunTypedJob<float>(client, rng, tally);
        } else {
          RunTypedJob<double>(client, rng, tally);
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
}

// Jobs completed on the server at `address`, from its own GetServerInfo.
int64_t CompletedJobs(const std::string& address) {
  ClientOptions options;
  options.deadline = absl::Seconds(10);
  absl::StatusOr<v1::GetServerInfoResponse> info = Client(address, options).GetServerInfo();
  EXPECT_TRUE(info.ok()) << address << ": " << info.status();
  int64_t completed = 0;
  if (info.ok()) {
    for (const v1::DeviceInfo& device : info->devices()) completed += device.completed_jobs();
  }
  return completed;
}

// Client options for jobs that must survive a server's death.
ClientOptions ResilientOptions() {
  ClientOptions options;
  options.deadline = absl::Seconds(20);
  options.retry.max_attempts = 6;
  options.retry.initial_backoff = absl::Milliseconds(20);
  options.retry.max_backoff = absl::Milliseconds(500);
  return options;
}

// Once `tally` has `after` jobs finished, stops `victim` (calls to it hang),
// lets jobs pile onto it, then SIGKILLs it. Join before reading `killed_at`.
std::thread KillWhenFinished(ServerProcess* victim, Tally* tally, int after,
                             std::atomic<int>* killed_at) {
  return std::thread([=] {
    while (tally->finished.load() < after) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    victim->Signal(SIGSTOP, false);
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    killed_at->store(tally->finished.load());
    victim->Signal(SIGKILL, true);
  });
}

void ExpectNothingLostOrWrong(Tally& tally, int jobs) {
  EXPECT_EQ(tally.finished.load(), jobs);
  EXPECT_EQ(tally.lost.load(), 0) << tally.Errors();
  EXPECT_EQ(tally.wrong.load(), 0) << tally.Errors();
  EXPECT_EQ(tally.ok.load(), jobs);
}

TEST(ScaleOutTest, RoundRobinSpreadsJobsOverThreeServersAndRetriesAroundAKilledOne) {
  std::vector<std::unique_ptr<ServerProcess>> servers;
  std::vector<std::string> addresses;
  for (int s = 0; s < 3; ++s) {
    servers.push_back(std::make_unique<ServerProcess>(std::vector<std::string>{"--threads=1"}));
    addresses.push_back(servers.back()->address());
  }
  ClientOptions options = ResilientOptions();
  options.load_balancing_policy = "round_robin";
  Client client("ipv4:" + absl::StrJoin(addresses, ","), options);

  Tally before_kill;
  RunJobs(client, 0, 90, &before_kill);
  ExpectNothingLostOrWrong(before_kill, 90);
  EXPECT_EQ(before_kill.retried.load(), 0) << "no server has failed yet";
  std::vector<int64_t> shares;
  for (const std::string& address : addresses) {
    shares.push_back(CompletedJobs(address));
    EXPECT_GT(shares.back(), 0) << address << " got no jobs from round_robin";
  }

  Tally around_kill;
  std::atomic<int> killed_at{0};
  std::thread killer = KillWhenFinished(servers[1].get(), &around_kill, 60, &killed_at);
  RunJobs(client, 90, 210, &around_kill);
  killer.join();
  ExpectNothingLostOrWrong(around_kill, 210);
  EXPECT_GE(around_kill.retried.load(), 1) << "jobs in flight on the killed server";
  EXPECT_LT(killed_at.load(), 210) << "the kill came after the last job";
  for (int s : {0, 2}) {
    EXPECT_GT(CompletedJobs(addresses[s]), shares[s]) << addresses[s] << " took no more jobs";
  }
  std::printf(
      "round_robin: first 90 jobs split %s; server 2 killed after %d of 210 more, %d "
      "jobs retried\n",
      absl::StrJoin(shares, "/").c_str(), killed_at.load(), around_kill.retried.load());
}

// Where nginx is installed, or "" (DGMM_NGINX overrides).
std::string NginxBinary() {
  if (const char* env = std::getenv("DGMM_NGINX"); env != nullptr && *env != '\0') return env;
  for (const char* path : {"/usr/sbin/nginx", "/usr/local/sbin/nginx",
                           "/usr/local/nginx/sbin/nginx", "/usr/bin/nginx"}) {
    if (access(path, X_OK) == 0) return path;
  }
  return "";
}

int FreeLoopbackPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), len) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

bool Accepts(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  const bool connected = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  close(fd);
  return connected;
}

// nginx in the foreground, one process, with a grpc_pass front on a loopback
// port balancing `backends`; everything it writes stays in a temp dir. Killed
// with the test process if that dies first.
class NginxFront {
 public:
  NginxFront(const std::string& binary, const std::vector<std::string>& backends) {
    char dir[] = "/tmp/dgmm-nginx-XXXXXX";
    dir_ = mkdtemp(dir);
    port_ = FreeLoopbackPort();
    std::string upstreams;
    for (const std::string& backend : backends) upstreams += "    server " + backend + ";\n";
    std::ofstream(dir_ + "/nginx.conf") << "daemon off;\n"
                                        << "master_process off;\n"
                                        << "pid " << dir_ << "/nginx.pid;\n"
                                        << "error_log " << dir_ << "/error.log info;\n"
                                        << "events { worker_connections 256; }\n"
                                        << "http {\n"
                                        << "  access_log off;\n"
                                        << "  client_body_temp_path " << dir_ << "/body;\n"
                                        << "  proxy_temp_path " << dir_ << "/proxy;\n"
                                        << "  fastcgi_temp_path " << dir_ << "/fastcgi;\n"
                                        << "  uwsgi_temp_path " << dir_ << "/uwsgi;\n"
                                        << "  scgi_temp_path " << dir_ << "/scgi;\n"
                                        << "  upstream dgmm {\n"
                                        << upstreams << "  }\n"
                                        << "  server {\n"
                                        << "    listen 127.0.0.1:" << port_ << " http2;\n"
                                        << "    client_max_body_size 0;\n"
                                        << "    client_body_buffer_size 1m;\n"
                                        << "    grpc_buffer_size 1m;\n"
                                        << "    grpc_read_timeout 60s;\n"
                                        << "    grpc_send_timeout 60s;\n"
                                        << "    location / { grpc_pass grpc://dgmm; }\n"
                                        << "  }\n"
                                        << "}\n";
    // Everything the child needs is made before fork: it may not allocate.
    const std::string conf = dir_ + "/nginx.conf", prefix = dir_ + "/",
                      error_log = dir_ + "/error.log", stderr_log = dir_ + "/stderr.log";
    const pid_t parent = getpid();
    pid_ = fork();
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(1);
      const int fd = open(stderr_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) dup2(fd, STDERR_FILENO);
      execl(binary.c_str(), binary.c_str(), "-c", conf.c_str(), "-p", prefix.c_str(), "-e",
            error_log.c_str(), static_cast<char*>(nullptr));
      _exit(127);
    }
    for (int waited_ms = 0; waited_ms < 10000; waited_ms += 20) {
      if (Accepts(port_)) {
        ready_ = true;
        return;
      }
      if (waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~NginxFront() {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      for (int i = 0; i < 100 && waitpid(pid_, nullptr, WNOHANG) != pid_; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        if (i == 99) {
          kill(pid_, SIGKILL);
          waitpid(pid_, nullptr, 0);
        }
      }
    }
    std::filesystem::remove_all(dir_);
  }
  NginxFront(const NginxFront&) = delete;
  NginxFront& operator=(const NginxFront&) = delete;

  bool ready() const { return ready_; }
  std::string address() const { return "127.0.0.1:" + std::to_string(port_); }
  std::string Log() const {
    std::string text;
    for (const char* name : {"/error.log", "/stderr.log"}) {
      text += testing::ReadFile(dir_ + name).value_or("");
    }
    return text;
  }

 private:
  std::string dir_;
  int port_ = -1;
  pid_t pid_ = -1;
  bool ready_ = false;
};

TEST(ScaleOutTest, NginxGrpcPassBalancesTwoServersAndRetriesAroundAKilledOne) {
  const std::string nginx = NginxBinary();
  if (nginx.empty()) GTEST_SKIP() << "nginx is not installed (Debian: apt-get install nginx-light)";
  ServerProcess first({"--threads=1"}), second({"--threads=1"});
  NginxFront front(nginx, {first.address(), second.address()});
  ASSERT_TRUE(front.ready()) << "nginx did not start:\n" << front.Log();
  Client client(front.address(), ResilientOptions());

  Tally before_kill;
  RunJobs(client, 1000, 60, &before_kill);
  ExpectNothingLostOrWrong(before_kill, 60);
  const int64_t first_share = CompletedJobs(first.address());
  const int64_t second_share = CompletedJobs(second.address());
  EXPECT_GT(first_share, 0) << "nginx sent no jobs to " << first.address();
  EXPECT_GT(second_share, 0) << "nginx sent no jobs to " << second.address();

  // Larger messages through the proxy: a 4 MiB job in one message and streamed.
  std::vector<float> a(size_t{1024} * 1024), d(1024), c(a.size());
  for (size_t k = 0; k < a.size(); ++k) a[k] = static_cast<float>(k % 13) - 6;
  for (size_t j = 0; j < d.size(); ++j) d[j] = 0.25f * static_cast<float>(j % 9);
  Job big;
  big.matrix = {a.data(), 1024, 1024, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR};
  big.diagonal = d.data();
  big.diagonal_bytes = d.size() * sizeof(float);
  for (bool stream : {false, true}) {
    std::fill(c.begin(), c.end(), -1.0f);
    absl::StatusOr<JobResult> r = stream ? client.MultiplyStream(big, c.data(), c.size() * 4)
                                         : client.MultiplyUnary(big, c.data(), c.size() * 4);
    ASSERT_TRUE(r.ok()) << (stream ? "stream: " : "unary: ") << r.status() << "\n" << front.Log();
    for (size_t k = 0; k < c.size(); k += 4099) {
      ASSERT_EQ(c[k], a[k] * d[k % 1024]) << "element " << k;
    }
  }

  Tally around_kill;
  std::atomic<int> killed_at{0};
  std::thread killer = KillWhenFinished(&second, &around_kill, 40, &killed_at);
  RunJobs(client, 2000, 140, &around_kill);
  killer.join();
  ExpectNothingLostOrWrong(around_kill, 140);
  EXPECT_GE(around_kill.retried.load(), 1) << "jobs in flight on the killed server";
  EXPECT_LT(killed_at.load(), 140) << "the kill came after the last job";
  EXPECT_GT(CompletedJobs(first.address()), first_share) << "the survivor took no more jobs";
  std::printf(
      "nginx: first 60 jobs split %lld/%lld; backend 2 killed after %d of 140 more, %d "
      "jobs retried\n",
      static_cast<long long>(first_share), static_cast<long long>(second_share), killed_at.load(),
      around_kill.retried.load());
}

}  // namespace
}  // namespace dgmm
