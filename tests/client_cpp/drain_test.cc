// A server's drain never hangs a call. A real dgmm-server (CPU
// backend) is kept busy by kClients dgmm::Clients, each shared by kThreads
// threads running small jobs back to back with a 60 s deadline; it is sent
// SIGTERM and not restarted. Every call, and in particular every call sent
// into the drain window (between the SIGTERM and the server's exit), must end
// with OK or UNAVAILABLE within the reconnect limit (the default
// RetryPolicy::max_reconnect_wait, 5 s) plus 2 s: none may wait out its
// deadline.
//
// While the server drains it refuses jobs with UNAVAILABLE ("draining"), and
// the clients retry them: each retried attempt first waits for a connection
// (AwaitConnection, which finds the one still up), then is sent. Before the
// fix it was sent wait_for_ready, and one sent as the server exited (its
// connection closing under it) waited for a connection to a server that was
// gone until its deadline: DEADLINE_EXCEEDED after 60 s. That takes a retried
// attempt at the exit's moment, so half the clients retry every 1-4 ms
// (default max_reconnect_wait), and kRounds rounds run, each with a fresh
// server; with the wait_for_ready of before, 2 of 6 such rounds had a call
// that waited 60 s. A MultiplyStream call that never sends its header keeps
// the drain going for the server's whole shutdown grace (5 s). The one
// absolute time is the generous bound.
#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "dgmm/client.h"
#include "dgmm/v1/dgmm.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

constexpr int kClients = 4;
constexpr int kThreads = 16;  // per client, sharing its connection
constexpr int kRounds = 4;
constexpr int kRows = 16, kCols = 16;
const absl::Duration kDeadline = absl::Seconds(60);
// The reconnect limit (the default max_reconnect_wait) plus a margin.
const absl::Duration kBound = RetryPolicy().max_reconnect_wait + absl::Seconds(2);

struct Call {
  absl::Time start;
  absl::Time end;
  absl::Status status;
};

// One Client (its own channel and connection), shared by kThreads threads
// that run small jobs back to back; every call is recorded.
class Caller {
 public:
  Caller(const std::string& address, int seed) : client_(address, Options(seed % 2 == 1)) {
    for (int k = 0; k < kRows * kCols; ++k) a_[k] = static_cast<float>((k + seed) % 7) - 3;
    for (int j = 0; j < kCols; ++j) d_[j] = static_cast<float>(j % 5) + 0.5f;
  }
  void Start() {
    for (int t = 0; t < kThreads; ++t) threads_.emplace_back([this] { Loop(); });
  }
  // Asks the threads to stop after their current call; Join waits for that.
  void Stop() { stop_.store(true); }
  void Join() {
    stop_.store(true);
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }
  std::vector<Call> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  int successes() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(std::count_if(calls_.begin(), calls_.end(),
                                          [](const Call& c) { return c.status.ok(); }));
  }

 private:
  // Half the clients keep the default RetryPolicy; the other half retry
  // every 1-4 ms, up to 64 attempts, so that many retried attempts meet the
  // server's exit. All keep the default max_reconnect_wait.
  static ClientOptions Options(bool eager) {
    ClientOptions options;
    options.deadline = kDeadline;
    if (eager) {
      options.retry.max_attempts = 64;
      options.retry.initial_backoff = absl::Milliseconds(1);
      options.retry.max_backoff = absl::Milliseconds(4);
    }
    return options;
  }
  void Loop() {
    Job job;
    job.matrix = {a_, kRows, kCols, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR};
    job.diagonal = d_;
    job.diagonal_bytes = sizeof(d_);
    float c[kRows * kCols];
    while (!stop_.load()) {
      std::fill(std::begin(c), std::end(c), 0.0f);
      Call call;
      call.start = absl::Now();
      absl::StatusOr<JobResult> r = client_.Multiply(job, c, sizeof(c));
      call.end = absl::Now();
      call.status = r.status();
      for (int k = 0; r.ok() && k < kRows * kCols; ++k) {
        if (c[k] != a_[k] * d_[k % kCols]) {
          call.status = absl::DataLossError("wrong result");
          break;
        }
      }
      absl::MutexLock lock(&mu_);
      calls_.push_back(std::move(call));
    }
  }

  Client client_;
  float a_[kRows * kCols], d_[kCols];
  std::vector<std::thread> threads_;
  std::atomic<bool> stop_{false};
  absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

// A MultiplyStream call that sends nothing: the server waits for its header
// and counts it as a call in progress, so that its drain lasts the whole
// shutdown grace (5 s) and it exits with the call open.
class OpenStream {
 public:
  explicit OpenStream(const std::string& address)
      : stub_(v1::Dgmm::NewStub(
            grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
    context_.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    stream_ = stub_->MultiplyStream(&context_);
  }
  ~OpenStream() {
    context_.TryCancel();
    (void)stream_->Finish();
  }

 private:
  std::unique_ptr<v1::Dgmm::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>>
      stream_;
};

struct Round {
  absl::Time term;
  absl::Time exited;
  std::vector<std::vector<Call>> calls;  // per client
};

// Starts a server, keeps kClients callers busy, sends it SIGTERM (an
// OpenStream holding its drain open) and records every call until kBound +
// 1 s after it has exited.
void RunRound(int round, Round* out) {
  // No per-client queue limit: 16 calls at a time on one connection would
  // otherwise meet --max_queued_per_client (16) and, after 4 attempts with
  // its pushback, end RESOURCE_EXHAUSTED before the drain began.
  testing::ServerProcess server(
      {"--backend=cpu", "--threads=2", "--max_queue=1024", "--max_queued_per_client=0"});
  std::vector<std::unique_ptr<Caller>> callers;
  for (int i = 0; i < kClients; ++i) {
    callers.push_back(std::make_unique<Caller>(server.address(), round * kClients + i));
  }
  for (auto& c : callers) c->Start();
  const absl::Time warm_limit = absl::Now() + absl::Seconds(30);
  while (absl::Now() < warm_limit && std::any_of(callers.begin(), callers.end(), [](const auto& c) {
           return c->successes() < 3;
         })) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  bool warm = true;
  for (auto& c : callers) warm = warm && c->successes() >= 3;
  std::unique_ptr<OpenStream> open;
  if (warm) {
    open = std::make_unique<OpenStream>(server.address());
    out->term = absl::Now();
    server.Signal(SIGTERM, /*wait=*/false);
    const int exit_status = server.WaitForExit(40000);
    out->exited = absl::Now();
    EXPECT_NE(exit_status, -1) << "the server did not exit within 40 s of SIGTERM";
    // Every call begun before the exit has ended by now unless it hangs;
    // the calls begun since (on a server that is gone) show that too.
    absl::SleepFor(kBound + absl::Seconds(1));
  }
  for (auto& c : callers) c->Stop();
  for (auto& c : callers) c->Join();
  open.reset();
  ASSERT_TRUE(warm) << "not every client ran 3 jobs before the SIGTERM:\n" << server.Log();
  for (auto& c : callers) out->calls.push_back(c->calls());
}

// Checks one round: every call ended OK or UNAVAILABLE within kBound of its
// start, and nothing sent after the exit succeeded. Returns the calls sent
// into the drain window.
int CheckRound(const Round& r, int round) {
  int in_window = 0, in_window_ok = 0, after_exit = 0, caught = 0;
  absl::Duration longest;
  Call longest_call;
  for (size_t i = 0; i < r.calls.size(); ++i) {
    for (const Call& call : r.calls[i]) {
      const absl::Duration took = call.end - call.start;
      if (took > longest) {
        longest = took;
        longest_call = call;
      }
      const bool sent_in_window = call.start >= r.term && call.start < r.exited;
      in_window += sent_in_window ? 1 : 0;
      in_window_ok += sent_in_window && call.status.ok() ? 1 : 0;
      after_exit += call.start >= r.exited ? 1 : 0;
      caught += call.start < r.exited && call.end > r.exited ? 1 : 0;
      const std::string what = absl::StrCat(
          "client ", i, ", sent ", absl::FormatDuration(call.start - r.term),
          " after the SIGTERM (the server exited after ", absl::FormatDuration(r.exited - r.term),
          "), ended ", absl::FormatDuration(call.end - r.term), " after it: ",
          call.status.ToString());
      EXPECT_TRUE(call.status.ok() || call.status.code() == absl::StatusCode::kUnavailable)
          << what;
      EXPECT_LE(took, kBound) << what;
      if (call.start >= r.exited) {
        EXPECT_EQ(call.status.code(), absl::StatusCode::kUnavailable) << what;
      }
    }
  }
  std::printf(
      "round %d: drain window %s; %d calls sent into it (%d OK), %d caught by the exit, %d sent "
      "after it; longest call %s (sent %s after the SIGTERM: %s)\n",
      round, absl::FormatDuration(r.exited - r.term).c_str(), in_window, in_window_ok, caught,
      after_exit, absl::FormatDuration(longest).c_str(),
      absl::FormatDuration(longest_call.start - r.term).c_str(),
      longest_call.status.ToString().c_str());
  std::fflush(stdout);
  return in_window;
}

// Calls sent while the server drains are refused (UNAVAILABLE, "draining")
// and retried; those in flight or retrying when it exits must give up within
// the reconnect limit.
TEST(DrainTest, CallsSentIntoADrainEndWithinTheReconnectLimit) {
  int in_window = 0;
  for (int round = 0; round < kRounds; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    Round r;
    RunRound(round, &r);
    if (HasFatalFailure()) return;
    in_window += CheckRound(r, round);
  }
  // The window was exercised: calls were sent while the server drained.
  EXPECT_GE(in_window, kClients * kThreads * kRounds);
}

}  // namespace
}  // namespace dgmm
