// Reconnecting after a server restart: 16 busy
// dgmm::Clients, each with its own channel and the default ClientOptions, run
// small jobs against a real dgmm-server on a fixed port; the server is
// SIGKILLed and started again on the same port 3 s later. Every client must
// complete a job within 2 s of the restarted server first answering a health
// check. gRPC's own reconnect defaults (1 s initial backoff growing 1.6x, 20 s
// minimum connect timeout) took 19-22 s in the report.
//
// DGMM_RECONNECT_BACKOFF_MS="initial,min,max" overrides the three reconnect
// options, to measure other settings (e.g. gRPC's 1000,20000,120000).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dgmm/client.h"
#include "gtest/gtest.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

constexpr int kClients = 16;
constexpr int kRows = 16, kCols = 16;
const absl::Duration kDowntime = absl::Seconds(3);
const absl::Duration kAllowed = absl::Seconds(2);
// How long after the restart the test waits for stragglers before failing.
const absl::Duration kGiveUp = absl::Seconds(25);

ClientOptions TestOptions() {
  ClientOptions options;  // The defaults are what is under test.
  if (const char* env = std::getenv("DGMM_RECONNECT_BACKOFF_MS"); env != nullptr && *env) {
    std::vector<std::string> parts = absl::StrSplit(env, ',');
    int64_t ms[3];
    if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &ms[0]) ||
        !absl::SimpleAtoi(parts[1], &ms[1]) || !absl::SimpleAtoi(parts[2], &ms[2])) {
      std::fprintf(stderr, "DGMM_RECONNECT_BACKOFF_MS must be initial,min,max in ms\n");
      std::abort();
    }
    options.initial_reconnect_backoff = absl::Milliseconds(ms[0]);
    options.min_reconnect_backoff = absl::Milliseconds(ms[1]);
    options.max_reconnect_backoff = absl::Milliseconds(ms[2]);
  }
  return options;
}

// One busy client: its own Client (and so its own channel and connection),
// running small jobs back to back and recording when each one succeeded.
class BusyClient {
 public:
  BusyClient(const std::string& address, int seed) : client_(address, TestOptions()) {
    for (int k = 0; k < kRows * kCols; ++k) a_[k] = static_cast<float>((k + seed) % 7) - 3;
    for (int j = 0; j < kCols; ++j) d_[j] = static_cast<float>(j % 5) + 0.5f;
  }
  void Start() {
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  std::vector<absl::Time> successes() {
    absl::MutexLock lock(&mu_);
    return successes_;
  }
  int failures() {
    absl::MutexLock lock(&mu_);
    return failures_;
  }
  std::string last_error() {
    absl::MutexLock lock(&mu_);
    return last_error_;
  }
  // The first success at or after `t`, if any.
  std::optional<absl::Time> FirstSuccessAfter(absl::Time t) {
    absl::MutexLock lock(&mu_);
    for (absl::Time s : successes_) {
      if (s >= t) return s;
    }
    return std::nullopt;
  }
  // When the first job that was sent at or after `t` completed, if one did.
  std::optional<absl::Time> FirstSuccessSentAfter(absl::Time t) {
    absl::MutexLock lock(&mu_);
    for (size_t i = 0; i < successes_.size(); ++i) {
      if (sent_[i] >= t) return successes_[i];
    }
    return std::nullopt;
  }

 private:
  void Loop() {
    Job job;
    job.matrix = {a_, kRows, kCols, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR};
    job.diagonal = d_;
    job.diagonal_bytes = sizeof(d_);
    while (!stop_.load()) {
      std::fill(std::begin(c_), std::end(c_), 0.0f);
      const absl::Time sent = absl::Now();
      absl::StatusOr<JobResult> r = client_.Multiply(job, c_, sizeof(c_));
      const absl::Time now = absl::Now();
      bool right = r.ok();
      for (int k = 0; right && k < kRows * kCols; ++k) right = c_[k] == a_[k] * d_[k % kCols];
      {
        absl::MutexLock lock(&mu_);
        if (right) {
          successes_.push_back(now);
          sent_.push_back(sent);
        } else {
          ++failures_;
          last_error_ = r.ok() ? "wrong result" : r.status().ToString();
        }
      }
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  Client client_;
  float a_[kRows * kCols], d_[kCols], c_[kRows * kCols];
  std::thread thread_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<absl::Time> successes_ ABSL_GUARDED_BY(mu_);
  std::vector<absl::Time> sent_ ABSL_GUARDED_BY(mu_);  // when each success was sent
  int failures_ ABSL_GUARDED_BY(mu_) = 0;
  std::string last_error_ ABSL_GUARDED_BY(mu_);
};

// A health check through a fresh channel (so that no backoff of an earlier
// probe delays it): true when the server at `address` answers SERVING.
bool AnswersHealth(const std::string& address) {
  ClientOptions options;
  options.deadline = absl::Milliseconds(500);
  Client probe(address, options);
  absl::StatusOr<HealthState> state = probe.Health();
  return state.ok() && *state == grpc::health::v1::HealthCheckResponse::SERVING;
}

// No server at all: the first attempt fails at once, and a retried attempt
// waits for a connection only as long as max_reconnect_wait.
TEST(ReconnectTest, DeadServerFailsFastWithoutRetriesAndAfterTheReconnectWaitWithThem) {
  const std::string address = "127.0.0.1:" + std::to_string(testing::FreeLoopbackPort());
  float a[4] = {1, 2, 3, 4}, d[2] = {1, 1}, c[4];
  Job job;
  job.matrix = {a, 2, 2, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR};
  job.diagonal = d;
  job.diagonal_bytes = sizeof(d);

  ClientOptions once;
  once.retry.max_attempts = 1;
  Client fail_fast(address, once);
  absl::Time start = absl::Now();
  absl::StatusOr<JobResult> r = fail_fast.Multiply(job, c, sizeof(c));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));

  ClientOptions short_wait;
  short_wait.retry.max_reconnect_wait = absl::Milliseconds(500);
  Client waiting(address, short_wait);
  start = absl::Now();
  r = waiting.Multiply(job, c, sizeof(c));
  const absl::Duration took = absl::Now() - start;
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("no connection to the server within"), std::string::npos)
      << r.status();
  EXPECT_NE(r.status().message().find("(after 2 attempts)"), std::string::npos) << r.status();
  EXPECT_GE(took, absl::Milliseconds(500));
  EXPECT_LT(took, absl::Seconds(3));

  // With a deadline shorter than the reconnect wait, the deadline ends it;
  // still UNAVAILABLE, as nothing could be reached.
  ClientOptions deadline;
  deadline.deadline = absl::Milliseconds(700);
  Client bounded(address, deadline);
  start = absl::Now();
  r = bounded.Multiply(job, c, sizeof(c));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_NE(r.status().message().find("(the job's deadline)"), std::string::npos) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(2));
}

TEST(ReconnectTest, UnusableReconnectBackoffIsRefusedNamingIt) {
  ClientOptions zero;
  zero.min_reconnect_backoff = absl::ZeroDuration();
  EXPECT_EQ(CheckClientOptions(zero).code(), absl::StatusCode::kInvalidArgument);
  ClientOptions inverted;
  inverted.initial_reconnect_backoff = absl::Seconds(5);
  inverted.max_reconnect_backoff = absl::Seconds(1);
  absl::Status s = CheckClientOptions(inverted);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("max_reconnect_backoff"), std::string::npos) << s;
  ClientOptions no_wait;
  no_wait.retry.max_reconnect_wait = absl::ZeroDuration();
  EXPECT_NE(CheckClientOptions(no_wait).message().find("max_reconnect_wait"), std::string::npos);
  EXPECT_TRUE(CheckClientOptions(ClientOptions()).ok());
}

TEST(ReconnectTest, BusyClientsResumeWithinTwoSecondsOfARestartOnTheSamePort) {
  const int port = testing::FreeLoopbackPort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  const std::vector<std::string> flags = {"--listen=" + address, "--backend=cpu", "--threads=2"};
  auto server = std::make_unique<testing::ServerProcess>(flags);
  ASSERT_EQ(server->address(), address) << server->Log();

  std::vector<std::unique_ptr<BusyClient>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(std::make_unique<BusyClient>(address, i));
  for (auto& c : clients) c->Start();
  struct StopAll {
    std::vector<std::unique_ptr<BusyClient>>* clients;
    ~StopAll() {
      for (auto& c : *clients) c->Stop();
    }
  } stop_all{&clients};

  // Every client connected and busy before the kill.
  const absl::Time warm_deadline = absl::Now() + absl::Seconds(20);
  auto all_have = [&](absl::Time since, int count) {
    for (auto& c : clients) {
      const std::vector<absl::Time> s = c->successes();
      if (std::count_if(s.begin(), s.end(), [&](absl::Time t) { return t >= since; }) < count) {
        return false;
      }
    }
    return true;
  };
  while (!all_have(absl::InfinitePast(), 3) && absl::Now() < warm_deadline) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_TRUE(all_have(absl::InfinitePast(), 3)) << "not every client ran 3 jobs before the kill";

  const pid_t old_pid = server->pid();
  const int status = server->Signal(SIGKILL, /*wait=*/true);
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "dgmm-server " << old_pid << " was not killed by SIGKILL (status " << status << ")";
  server.reset();
  ASSERT_EQ(kill(old_pid, 0), -1) << "the killed server still exists";
  // Nothing answers while the server is down.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_FALSE(AnswersHealth(address)) << "something still answers on " << address;

  absl::SleepFor(killed + kDowntime - absl::Now());
  const absl::Time restart = absl::Now();
  server = std::make_unique<testing::ServerProcess>(flags);
  ASSERT_EQ(server->address(), address) << server->Log();
  ASSERT_NE(server->pid(), old_pid);
  while (!AnswersHealth(address)) {
    ASSERT_LT(absl::Now(), restart + absl::Seconds(20)) << "the restarted server never answered";
    absl::SleepFor(absl::Milliseconds(5));
  }
  const absl::Time up = absl::Now();

  // No job sent while no server was running can have succeeded before the
  // restart. (A reply the server wrote before it died can be read, and its
  // job counted, a moment after `killed`: that job was sent before.)
  for (int i = 0; i < kClients; ++i) {
    const std::optional<absl::Time> done = clients[i]->FirstSuccessSentAfter(killed);
    EXPECT_FALSE(done.has_value() && *done < restart)
        << "client " << i << " completed a job sent while the server was down";
  }

  while (!all_have(up, 1) && absl::Now() < up + kGiveUp) absl::SleepFor(absl::Milliseconds(10));
  for (auto& c : clients) c->Stop();

  std::printf("server down %.0f ms (SIGKILL to restart), up %.0f ms after the restart\n",
              absl::ToDoubleMilliseconds(restart - killed),
              absl::ToDoubleMilliseconds(up - restart));
  std::printf("client  first job done after the restarted server answered health (ms)\n");
  double worst = 0;
  for (int i = 0; i < kClients; ++i) {
    // A job in flight when health first answered can finish a moment later:
    // measured from `up` it may also be slightly negative (the client got
    // there before the probe).
    std::optional<absl::Time> first = clients[i]->FirstSuccessAfter(restart);
    if (first.has_value()) {
      const double ms = absl::ToDoubleMilliseconds(*first - up);
      worst = std::max(worst, ms);
      std::printf("%6d  %8.1f   (%d failed jobs in all; last error: %s)\n", i, ms,
                  clients[i]->failures(), clients[i]->last_error().c_str());
    } else {
      std::printf("%6d  none within %.0f s (%d failed jobs; last error: %s)\n", i,
                  absl::ToDoubleSeconds(kGiveUp), clients[i]->failures(),
                  clients[i]->last_error().c_str());
    }
  }
  std::printf("worst %.1f ms (allowed %.0f ms)\n", worst, absl::ToDoubleMilliseconds(kAllowed));
  std::fflush(stdout);

  for (int i = 0; i < kClients; ++i) {
    std::optional<absl::Time> first = clients[i]->FirstSuccessAfter(restart);
    ASSERT_TRUE(first.has_value()) << "client " << i << " never completed a job after the restart";
    EXPECT_LE(*first - up, kAllowed) << "client " << i;
  }
}

}  // namespace
}  // namespace dgmm
