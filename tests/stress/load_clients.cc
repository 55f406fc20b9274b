#include "tests/stress/load_clients.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "tests/integration/rpc_util.h"

extern char** environ;

namespace dgmm::stress {
namespace {

using StreamPtr = std::unique_ptr<
    grpc::ClientReaderWriter<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>>;

std::optional<absl::Duration> Pushback(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  const auto found = trailers.find("grpc-retry-pushback-ms");
  int64_t ms = 0;
  if (found == trailers.end() ||
      !absl::SimpleAtoi(absl::string_view(found->second.data(), found->second.size()), &ms) ||
      ms < 0) {
    return std::nullopt;
  }
  return absl::Milliseconds(ms);
}

// How long to wait before retrying after `status`, or nullopt if the job
// must not be retried.
std::optional<absl::Duration> RetryWait(const grpc::Status& status,
                                        const grpc::ClientContext& context, int attempt,
                                        const RetryPolicy& policy, std::mt19937_64* rng) {
  const double jitter = std::uniform_real_distribution<double>(0.8, 1.2)(*rng);
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    const absl::Duration backoff = std::min(
        policy.initial_backoff * std::pow(2.0, std::min(attempt - 1, 20)), policy.max_backoff);
    return backoff * jitter;
  }
  if (status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
    const std::optional<absl::Duration> pushback = Pushback(context);
    if (!pushback) return std::nullopt;  // too large: retrying cannot help
    return *pushback * (jitter + 0.2);   // never sooner than the server asked
  }
  return std::nullopt;
}

std::string CancelMidStream(v1::Dgmm::Stub* stub, const JobSpec& spec, std::mt19937_64* rng) {
  const testing::RandomJob job = MakePayload(spec);
  // 0: cancel after a few milliseconds, queued or not; else after that many result blocks.
  const int after_blocks = std::uniform_int_distribution<int>(0, 3)(*rng);
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  StreamPtr stream = stub->MultiplyStream(&ctx);
  std::thread writer([&] { testing::WriteJob(stream.get(), job, spec.block_lines); });
  if (after_blocks == 0) {
    absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(0, 20)(*rng)));
    ctx.TryCancel();
  }
  v1::MultiplyStreamResponse resp;
  int blocks = 0;
  while (stream->Read(&resp)) {
    if (resp.has_block() && ++blocks == after_blocks) ctx.TryCancel();
  }
  writer.join();
  return CodeName(stream->Finish().error_code());
}

std::string MissDeadline(v1::Dgmm::Stub* stub, const JobSpec& spec, std::mt19937_64* rng) {
  const testing::RandomJob job = MakePayload(spec);
  grpc::ClientContext ctx;
  const int ms = std::uniform_int_distribution<int>(20, 300)(*rng);
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(ms)));
  std::string result;
  return CodeName(
      testing::StreamJob(stub, job, spec.block_lines, &result, nullptr, &ctx).error_code());
}

std::string DisconnectInChild(const std::string& address, uint64_t seed, int64_t max_n,
                              int64_t max_block_bytes) {
  std::vector<std::string> args = {"/proc/self/exe",
                                   "--abandon_child",
                                   "--address=" + address,
                                   absl::StrCat("--seed=", seed),
                                   absl::StrCat("--max_n=", max_n),
                                   absl::StrCat("--abandon_max_block_bytes=", max_block_bytes)};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    return "child failed";
  }
  int status = 0;
  const absl::Time end = absl::Now() + absl::Seconds(60);
  while (waitpid(pid, &status, WNOHANG) != pid) {
    if (absl::Now() > end) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return "child failed";
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (!WIFEXITED(status)) return "child failed";
  return WEXITSTATUS(status) == 0   ? "disconnected"
         : WEXITSTATUS(status) == 3 ? "ended first"
                                    : "child failed";
}

}  // namespace

std::string CodeName(grpc::StatusCode code) {
  // gRPC's codes are absl's, number for number.
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

std::unique_ptr<v1::Dgmm::Stub> ConnectOwn(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  return v1::Dgmm::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

bool FetchInfo(v1::Dgmm::Stub* stub, absl::Duration timeout, v1::GetServerInfoResponse* info) {
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  ctx.set_wait_for_ready(true);
  return stub->GetServerInfo(&ctx, {}, info).ok();
}

void Connection::Reopen() { stub_ = ConnectOwn(address_); }

JobResult RunJob(Connection* connection, const JobSpec& spec, const RetryPolicy& policy,
                 std::mt19937_64* rng) {
  JobResult r;
  const testing::RandomJob job = MakePayload(spec);
  const absl::Time start = absl::Now();
  for (int attempt = 1;; ++attempt) {
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + policy.attempt_timeout));
    grpc::Status status;
    std::string result;
    v1::JobStats stats;
    v1::Dgmm::Stub* stub = connection->stub();
    if (spec.streamed) {
      status = testing::StreamJob(stub, job, spec.block_lines, &result, &stats, &ctx);
    } else {
      v1::MultiplyResponse resp;
      status = testing::UnaryJob(stub, job, &resp, &ctx);
      result = std::move(*resp.mutable_result());
      stats = resp.stats();
    }
    r.code = status.error_code();
    r.message = status.error_message();
    if (status.ok()) {
      r.latency = absl::Now() - start;
      r.max_rel_error = stress::MaxRelError(job, result);
      r.verdict = r.max_rel_error <= Tolerance(spec.dtype) ? JobResult::Verdict::kCorrect
                                                           : JobResult::Verdict::kWrong;
      r.backend = stats.backend();
      r.bytes_moved = static_cast<int64_t>(job.matrix.size() + result.size());
      return r;
    }
    const std::optional<absl::Duration> pause = RetryWait(status, ctx, attempt, policy, rng);
    if (!pause || attempt >= policy.max_attempts || absl::Now() + *pause > start + policy.window) {
      r.latency = absl::Now() - start;
      r.verdict = JobResult::Verdict::kLost;
      return r;
    }
    ++(status.error_code() == grpc::StatusCode::UNAVAILABLE ? r.unavailable_retries
                                                            : r.pushback_retries);
    absl::SleepFor(*pause);
    // A fresh channel connects at once; the old one would wait out gRPC's
    // reconnect backoff, which grows while the server is down.
    if (status.error_code() == grpc::StatusCode::UNAVAILABLE) connection->Reopen();
  }
}

const char* AbandonName(Abandon kind) {
  switch (kind) {
    case Abandon::kCancel:
      return "cancel mid-stream";
    case Abandon::kDeadline:
      return "deadline mid-stream";
    case Abandon::kDisconnect:
      return "disconnect mid-stream (client process exits)";
  }
  return "?";
}

JobSpec AbandonSpec(uint64_t seed, int64_t max_n, int64_t max_block_bytes) {
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution coin(0.5);
  const double lo = std::log(static_cast<double>(std::max<int64_t>(16, max_n / 8)));
  const double hi = std::log(static_cast<double>(std::max<int64_t>(16, max_n / 2)));
  std::uniform_real_distribution<double> side(lo, hi);
  JobSpec s;
  s.rows = static_cast<int64_t>(std::exp(side(rng)));
  s.cols = static_cast<int64_t>(std::exp(side(rng)));
  s.dtype = coin(rng) ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT64;
  s.layout = coin(rng) ? v1::LAYOUT_ROW_MAJOR : v1::LAYOUT_COL_MAJOR;
  s.side = coin(rng) ? v1::SIDE_RIGHT : v1::SIDE_LEFT;
  s.streamed = true;
  const bool row_major = s.layout == v1::LAYOUT_ROW_MAJOR;
  const int64_t line_bytes = (row_major ? s.cols : s.rows) * s.ElementBytes();
  s.block_lines = std::clamp<int64_t>((row_major ? s.rows : s.cols) / 16, 1,
                                      std::max<int64_t>(1, max_block_bytes / line_bytes));
  s.payload_seed = rng();
  return s;
}

std::string AbandonJob(Abandon kind, const std::string& address, v1::Dgmm::Stub* stub,
                       uint64_t seed, int64_t max_n, int64_t max_block_bytes) {
  std::mt19937_64 rng(seed ^ 0x5eed);
  switch (kind) {
    case Abandon::kCancel:
      return CancelMidStream(stub, AbandonSpec(seed, max_n, max_block_bytes), &rng);
    case Abandon::kDeadline:
      return MissDeadline(stub, AbandonSpec(seed, max_n, max_block_bytes), &rng);
    case Abandon::kDisconnect:
      return DisconnectInChild(address, seed, max_n, max_block_bytes);
  }
  return "?";
}

int AbandonChildMain(const std::string& address, uint64_t seed, int64_t max_n,
                     int64_t max_block_bytes) {
  alarm(30);  // never outlive a stuck server by long
  const JobSpec spec = AbandonSpec(seed, max_n, max_block_bytes);
  const testing::RandomJob job = MakePayload(spec);
  std::mt19937_64 rng(seed ^ 0xc1d);
  const int leave_after = std::uniform_int_distribution<int>(1, 3)(rng);
  std::unique_ptr<v1::Dgmm::Stub> stub = ConnectOwn(address);
  grpc::ClientContext ctx;
  StreamPtr stream = stub->MultiplyStream(&ctx);
  std::thread([&] { testing::WriteJob(stream.get(), job, spec.block_lines); }).detach();
  v1::MultiplyStreamResponse resp;
  int blocks = 0;
  while (stream->Read(&resp)) {
    // No Finish, no cancel, no goodbye: the kernel closes the socket.
    if (resp.has_block() && ++blocks == leave_after) _exit(0);
  }
  _exit(3);
}

}  // namespace dgmm::stress
