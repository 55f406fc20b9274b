// dgmm::Client's retries, against an in-process fake dgmm service whose
// failures the test scripts: which codes are retried, how long it waits, when
// it gives up, that a streamed job is not repeated once results arrived, and
// that the `dgmm-origin: server` trailer (which the real server puts on every
// error it makes) decides whether INTERNAL is final. Also RetryDelay, rule 3
// as a pure function: which code from which origin is retried, and the
// backoff arithmetic. Transport failures of the real server (an RST_STREAM
// from the network) are the conformance suite's (tests/conformance, cases
// rst_stream_*).
#include "src/retry.h"

#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>

#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "dgmm/client.h"
#include "dgmm/v1/dgmm.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;

// A Dgmm service for float32 row-major SIDE_RIGHT jobs. FailNext scripts the
// next calls' failures; a failing stream either refuses the job at once or,
// with after_first_block, sends StreamAccepted and one result line first.
// Each failure carries `dgmm-origin: server`, as the real server's do,
// unless `from_server` is false (a status as the transport would make it).
class FlakyDgmm final : public v1::Dgmm::Service {
 public:
  void FailNext(int calls, grpc::Status status, std::string pushback_ms = "",
                bool after_first_block = false, bool from_server = true) {
    absl::MutexLock lock(&mu_);
    failures_left_ = calls;
    failure_ = std::move(status);
    pushback_ms_ = std::move(pushback_ms);
    after_first_block_ = after_first_block;
    from_server_ = from_server;
  }
  // The next streams break the protocol: a result block before
  // StreamAccepted (kBlockFirst), or one line and then OK without stats
  // (kEndEarly).
  enum class Break { kNone, kBlockFirst, kEndEarly };
  void BreakStreams(Break how) {
    absl::MutexLock lock(&mu_);
    break_ = how;
  }
  int calls() const { return calls_.load(); }
  // Rows of each MultiplyStream header received, in order.
  std::vector<int64_t> stream_rows() {
    absl::MutexLock lock(&mu_);
    return stream_rows_;
  }
  std::string last_authorization() {
    absl::MutexLock lock(&mu_);
    return last_authorization_;
  }

  grpc::Status Multiply(grpc::ServerContext* context, const v1::MultiplyRequest* request,
                        v1::MultiplyResponse* response) override {
    if (std::optional<grpc::Status> failure = NextFailure(context, nullptr)) return *failure;
    *response->mutable_result() = Scale(request->header(), request->matrix());
    response->mutable_stats()->set_device("fake");
    return grpc::Status::OK;
  }

  grpc::Status MultiplyStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::MultiplyStreamResponse, v1::MultiplyStreamRequest>* stream)
      override {
    v1::MultiplyStreamRequest request;
    if (!stream->Read(&request) || !request.has_header()) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no header");
    }
    const v1::JobHeader header = request.header();
    {
      absl::MutexLock lock(&mu_);
      stream_rows_.push_back(header.rows());
    }
    bool fail_after_block = false;
    if (std::optional<grpc::Status> failure = NextFailure(context, &fail_after_block);
        failure.has_value() && !fail_after_block) {
      return *failure;
    }
    std::string matrix;
    while (stream->Read(&request)) matrix += request.block().data();
    Break how;
    {
      absl::MutexLock lock(&mu_);
      how = break_;
    }
    if (how != Break::kNone) {
      v1::MultiplyStreamResponse response;
      if (how == Break::kEndEarly) {
        response.mutable_accepted()->set_job_id(1);
        stream->Write(response);
      }
      const std::string result = Scale(header, matrix);
      response.mutable_block()->set_first_line(0);
      response.mutable_block()->set_data(
          result.substr(0, static_cast<size_t>(header.cols()) * sizeof(float)));
      stream->Write(response);
      return grpc::Status::OK;
    }
    v1::MultiplyStreamResponse response;
    response.mutable_accepted()->set_job_id(1);
    stream->Write(response);
    const std::string result = Scale(header, matrix);
    const size_t line_bytes = static_cast<size_t>(header.cols()) * sizeof(float);
    const size_t first_block = fail_after_block ? line_bytes : result.size();
    response.mutable_block()->set_first_line(0);
    response.mutable_block()->set_data(result.substr(0, first_block));
    stream->Write(response);
    if (fail_after_block) return failure_copy();
    response.mutable_stats()->set_device("fake");
    stream->Write(response);
    return grpc::Status::OK;
  }

 private:
  // Counts the call and returns its scripted failure, if any (adding the
  // pushback trailer); *after_block says whether a stream fails late.
  std::optional<grpc::Status> NextFailure(grpc::ServerContext* context, bool* after_block) {
    calls_.fetch_add(1);
    absl::MutexLock lock(&mu_);
    const auto auth = context->client_metadata().find("authorization");
    last_authorization_ = auth == context->client_metadata().end()
                              ? ""
                              : std::string(auth->second.data(), auth->second.size());
    if (failures_left_ == 0) return std::nullopt;
    --failures_left_;
    if (!pushback_ms_.empty()) context->AddTrailingMetadata("grpc-retry-pushback-ms", pushback_ms_);
    if (from_server_) context->AddTrailingMetadata(kOriginTrailer, kOriginServer);
    if (after_block != nullptr) *after_block = after_first_block_;
    return failure_;
  }
  grpc::Status failure_copy() {
    absl::MutexLock lock(&mu_);
    return failure_;
  }
  static std::string Scale(const v1::JobHeader& header, const std::string& matrix) {
    std::vector<float> a(matrix.size() / sizeof(float)), d(header.diagonal().size() / 4);
    std::memcpy(a.data(), matrix.data(), matrix.size());
    std::memcpy(d.data(), header.diagonal().data(), header.diagonal().size());
    for (size_t k = 0; k < a.size(); ++k) a[k] *= d[k % d.size()];
    return std::string(reinterpret_cast<const char*>(a.data()), matrix.size());
  }

  std::atomic<int> calls_{0};
  absl::Mutex mu_;
  int failures_left_ ABSL_GUARDED_BY(mu_) = 0;
  grpc::Status failure_ ABSL_GUARDED_BY(mu_);
  std::string pushback_ms_ ABSL_GUARDED_BY(mu_);
  bool after_first_block_ ABSL_GUARDED_BY(mu_) = false;
  bool from_server_ ABSL_GUARDED_BY(mu_) = true;
  Break break_ ABSL_GUARDED_BY(mu_) = Break::kNone;
  std::string last_authorization_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> stream_rows_ ABSL_GUARDED_BY(mu_);
};

class RetryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    for (int k = 0; k < kRows * kCols; ++k) a_[k] = static_cast<float>(k % 5) + 1;
    for (int j = 0; j < kCols; ++j) d_[j] = static_cast<float>(j) - 1.5f;
  }
  void TearDown() override {
    if (server_) server_->Shutdown(std::chrono::system_clock::now());
  }

  ClientOptions FastRetries() const {
    ClientOptions options;
    options.deadline = absl::Seconds(20);
    options.retry.initial_backoff = absl::Milliseconds(5);
    options.retry.max_backoff = absl::Milliseconds(20);
    return options;
  }
  Job MakeJob() const {
    Job job;
    job.matrix = {a_, kRows, kCols, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR};
    job.diagonal = d_;
    job.diagonal_bytes = sizeof(d_);
    return job;
  }
  absl::StatusOr<JobResult> Run(Client& client, TransferMode mode) {
    std::fill(std::begin(c_), std::end(c_), -1.0f);
    return mode == TransferMode::kUnary ? client.MultiplyUnary(MakeJob(), c_, sizeof(c_))
                                        : client.MultiplyStream(MakeJob(), c_, sizeof(c_));
  }
  bool ResultIsRight() const {
    for (int k = 0; k < kRows * kCols; ++k) {
      if (c_[k] != a_[k] * d_[k % kCols]) return false;
    }
    return true;
  }

  static constexpr int kRows = 6, kCols = 4;
  FlakyDgmm service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
  float a_[kRows * kCols], d_[kCols], c_[kRows * kCols];
};

TEST_F(RetryTest, UnavailableIsRetriedUntilTheJobSucceedsInBothModes) {
  Client client(address_, FastRetries());
  for (TransferMode mode : {TransferMode::kUnary, TransferMode::kStream}) {
    const int before = service_.calls();
    service_.FailNext(2, grpc::Status(grpc::StatusCode::UNAVAILABLE, "draining"));
    absl::StatusOr<JobResult> r = Run(client, mode);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->attempts, 3);
    EXPECT_EQ(service_.calls() - before, 3);
    EXPECT_TRUE(ResultIsRight());
  }
}

TEST_F(RetryTest, GivesUpAfterMaxAttemptsAndSaysHowMany) {
  ClientOptions options = FastRetries();
  options.retry.max_attempts = 3;
  Client client(address_, options);
  service_.FailNext(100, grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"));
  absl::StatusOr<JobResult> r = Run(client, TransferMode::kUnary);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr("down (after 3 attempts)"));
  EXPECT_EQ(service_.calls(), 3);
}

TEST_F(RetryTest, OneAttemptTurnsRetriesOff) {
  ClientOptions options = FastRetries();
  options.retry.max_attempts = 1;
  Client client(address_, options);
  service_.FailNext(1, grpc::Status(grpc::StatusCode::UNAVAILABLE, "down"));
  EXPECT_EQ(Run(client, TransferMode::kUnary).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(service_.calls(), 1);
}

TEST_F(RetryTest, FullQueueWithPushbackIsRetriedAfterTheHintedWait) {
  Client client(address_, FastRetries());
  for (TransferMode mode : {TransferMode::kUnary, TransferMode::kStream}) {
    service_.FailNext(1, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"), "300");
    const absl::Time start = absl::Now();
    absl::StatusOr<JobResult> r = Run(client, mode);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_GE(absl::Now() - start, absl::Milliseconds(300));
    EXPECT_EQ(r->attempts, 2);
    EXPECT_TRUE(ResultIsRight());
  }
}

TEST_F(RetryTest, ResourceExhaustedWithoutPushbackIsFinal) {
  Client client(address_, FastRetries());
  service_.FailNext(1, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "over the budget"));
  absl::StatusOr<JobResult> r = Run(client, TransferMode::kUnary);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(r.status().message(), "over the budget");
  EXPECT_EQ(service_.calls(), 1);
}

TEST_F(RetryTest, PushbackPastTheDeadlineIsNotWaitedFor) {
  ClientOptions options = FastRetries();
  options.deadline = absl::Seconds(1);
  Client client(address_, options);
  service_.FailNext(1, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"), "5000");
  const absl::Time start = absl::Now();
  EXPECT_EQ(Run(client, TransferMode::kUnary).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_LT(absl::Now() - start, absl::Seconds(1));
  EXPECT_EQ(service_.calls(), 1);
}

// CancelToken: a job waiting out a 10 s pushback (no call in flight) ends
// CANCELLED as soon as its token is cancelled; a token cancelled before the
// job starts ends it at once, with no call made.
TEST_F(RetryTest, ACancelTokenEndsAJobWaitingBetweenAttempts) {
  Client client(address_, FastRetries());
  for (TransferMode mode : {TransferMode::kUnary, TransferMode::kStream}) {
    const int before = service_.calls();
    service_.FailNext(1, grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, "queue full"),
                      "10000");
    CancelToken cancel;
    std::thread canceller([&] {
      while (service_.calls() == before) absl::SleepFor(absl::Milliseconds(1));
      absl::SleepFor(absl::Milliseconds(100));  // the job is in its 10 s wait now
      cancel.Cancel();
    });
    std::fill(std::begin(c_), std::end(c_), -1.0f);
    const absl::Time start = absl::Now();
    absl::StatusOr<JobResult> r =
        mode == TransferMode::kUnary
            ? client.MultiplyUnary(MakeJob(), c_, sizeof(c_), nullptr, &cancel)
            : client.MultiplyStream(MakeJob(), c_, sizeof(c_), nullptr, &cancel);
    canceller.join();
    EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
    EXPECT_LT(absl::Now() - start, absl::Seconds(5)) << "the wait was not ended";
    EXPECT_EQ(service_.calls() - before, 1);
  }
}

TEST_F(RetryTest, AJobWhoseTokenWasCancelledBeforeItStartsMakesNoCall) {
  Client client(address_, FastRetries());
  CancelToken cancel;
  cancel.Cancel();
  EXPECT_TRUE(cancel.cancelled());
  absl::StatusOr<JobResult> r = client.Multiply(MakeJob(), c_, sizeof(c_), nullptr, &cancel);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(service_.calls(), 0);
}

// A retried attempt waiting for a connection (none: nothing listens) ends
// as soon as the token is cancelled, not after max_reconnect_wait (30 s).
TEST(CancelTokenTest, EndsAWaitForAConnection) {
  ClientOptions options;
  options.deadline = absl::Seconds(60);
  options.retry.initial_backoff = absl::Milliseconds(5);
  options.retry.max_backoff = absl::Milliseconds(20);
  options.retry.max_reconnect_wait = absl::Seconds(30);
  const int port = testing::FreeLoopbackPort();  // nothing listens there
  Client client("127.0.0.1:" + std::to_string(port), options);
  float a[4] = {1, 2, 3, 4}, d[2] = {1, 2}, c[4];
  Job job;
  job.matrix = {a, 2, 2, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR};
  job.diagonal = d;
  job.diagonal_bytes = sizeof(d);
  CancelToken cancel;
  std::thread canceller([&] {
    absl::SleepFor(absl::Milliseconds(500));
    cancel.Cancel();
  });
  const absl::Time start = absl::Now();
  absl::StatusOr<JobResult> r = client.Multiply(job, c, sizeof(c), nullptr, &cancel);
  canceller.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << r.status();
}

TEST_F(RetryTest, OtherCodesAreFinal) {
  Client client(address_, FastRetries());
  for (grpc::StatusCode code : {grpc::StatusCode::INVALID_ARGUMENT, grpc::StatusCode::INTERNAL,
                                grpc::StatusCode::UNAUTHENTICATED}) {
    const int before = service_.calls();
    service_.FailNext(1, grpc::Status(code, "no"));
    EXPECT_EQ(static_cast<int>(Run(client, TransferMode::kUnary).status().code()),
              static_cast<int>(code));
    EXPECT_EQ(service_.calls() - before, 1);
  }
}

// The same codes without `dgmm-origin: server` are the transport's
// and retried with the UNAVAILABLE backoff; with it they stay final (above).
TEST_F(RetryTest, InternalUnknownAndExhaustedWithoutTheOriginTrailerAreRetried) {
  Client client(address_, FastRetries());
  for (TransferMode mode : {TransferMode::kUnary, TransferMode::kStream}) {
    for (grpc::StatusCode code : {grpc::StatusCode::INTERNAL, grpc::StatusCode::UNKNOWN,
                                  grpc::StatusCode::RESOURCE_EXHAUSTED}) {
      const int before = service_.calls();
      service_.FailNext(1, grpc::Status(code, "Received RST_STREAM with error code 1"), "",
                        /*after_first_block=*/false, /*from_server=*/false);
      absl::StatusOr<JobResult> r = Run(client, mode);
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->attempts, 2);
      EXPECT_EQ(service_.calls() - before, 2);
      EXPECT_TRUE(ResultIsRight());
    }
  }
}

TEST_F(RetryTest, CancelledAndDeadlineExceededWithoutTheOriginTrailerAreFinal) {
  Client client(address_, FastRetries());
  for (grpc::StatusCode code :
       {grpc::StatusCode::CANCELLED, grpc::StatusCode::DEADLINE_EXCEEDED}) {
    const int before = service_.calls();
    service_.FailNext(1, grpc::Status(code, "no"), "", false, /*from_server=*/false);
    EXPECT_EQ(static_cast<int>(Run(client, TransferMode::kUnary).status().code()),
              static_cast<int>(code));
    EXPECT_EQ(service_.calls() - before, 1);
  }
}

// The client's own INTERNAL for a server that broke the stream protocol is
// final, though no `dgmm-origin: server` came with it.
TEST_F(RetryTest, AServerThatBreaksTheStreamProtocolIsNotRetried) {
  Client client(address_, FastRetries());
  for (FlakyDgmm::Break how : {FlakyDgmm::Break::kBlockFirst, FlakyDgmm::Break::kEndEarly}) {
    service_.BreakStreams(how);
    const int before = service_.calls();
    absl::StatusOr<JobResult> r = Run(client, TransferMode::kStream);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr("broke the MultiplyStream protocol"));
    EXPECT_EQ(service_.calls() - before, 1);
  }
}

// A stream reset by the transport after some result lines is resumed like
// one lost with UNAVAILABLE.
TEST_F(RetryTest, StreamResetByTheTransportIsResumedAfterTheLinesReceived) {
  Client client(address_, FastRetries());
  service_.FailNext(1, grpc::Status(grpc::StatusCode::INTERNAL, "reset"), "",
                    /*after_first_block=*/true, /*from_server=*/false);
  absl::StatusOr<JobResult> r = Run(client, TransferMode::kStream);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(r->resumed, 1);
  EXPECT_THAT(service_.stream_rows(), ::testing::ElementsAre(kRows, kRows - 1));
  EXPECT_EQ(r->received_bytes, static_cast<int64_t>(sizeof(c_)));
  EXPECT_TRUE(ResultIsRight());
}

// The striping policy (docs/protocol.md): a stream lost after some result
// lines arrived is resumed with only the lines not yet received.
TEST_F(RetryTest, StreamIsResumedAfterTheLinesReceived) {
  Client client(address_, FastRetries());
  service_.FailNext(1, grpc::Status(grpc::StatusCode::UNAVAILABLE, "lost"), "",
                    /*after_first_block=*/true);
  absl::StatusOr<JobResult> r = Run(client, TransferMode::kStream);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(service_.calls(), 2);
  EXPECT_EQ(r->attempts, 2);
  EXPECT_EQ(r->resumed, 1);
  // The first call delivered line 0; the second carried the other 5 only.
  EXPECT_THAT(service_.stream_rows(), ::testing::ElementsAre(kRows, kRows - 1));
  EXPECT_EQ(r->received_bytes, static_cast<int64_t>(sizeof(c_)));
  EXPECT_TRUE(ResultIsRight());
}

TEST_F(RetryTest, BearerTokenTravelsWithEveryAttempt) {
  ClientOptions options = FastRetries();
  options.bearer_token = "tok-123";
  Client client(address_, options);
  service_.FailNext(1, grpc::Status(grpc::StatusCode::UNAVAILABLE, "once"));
  ASSERT_TRUE(Run(client, TransferMode::kStream).ok());
  EXPECT_EQ(service_.last_authorization(), "Bearer tok-123");
  ASSERT_TRUE(Run(client, TransferMode::kUnary).ok());
  EXPECT_EQ(service_.last_authorization(), "Bearer tok-123");
}

TEST(RetryDelayTest, BackoffGrowsByTheMultiplierUpToTheCapWithBoundedJitter) {
  RetryPolicy policy;
  policy.max_attempts = 10;
  policy.initial_backoff = absl::Milliseconds(100);
  policy.max_backoff = absl::Milliseconds(350);
  policy.backoff_multiplier = 2;
  const absl::Time now = absl::Now();
  // In ms; -1 for no retry.
  auto delay = [&](int made, double jitter) {
    std::optional<absl::Duration> wait =
        RetryDelay(policy, made, absl::StatusCode::kUnavailable, FailureOrigin::kServer,
                   std::nullopt, now, absl::InfiniteFuture(), jitter);
    return wait.has_value() ? absl::ToDoubleMilliseconds(*wait) : -1.0;
  };
  EXPECT_NEAR(delay(1, 0), 100, 1e-6);
  EXPECT_NEAR(delay(2, 0), 200, 1e-6);
  EXPECT_NEAR(delay(3, 0), 350, 1e-6);
  EXPECT_NEAR(delay(9, 0), 350, 1e-6);
  EXPECT_NEAR(delay(1, 1), 120, 1e-6);
  EXPECT_NEAR(delay(1, -1), 80, 1e-6);
  EXPECT_NEAR(delay(3, 1), 420, 1e-6);
  EXPECT_EQ(delay(10, 0), -1);  // no attempts left
}

TEST(RetryDelayTest, RuleThreeByCodeAndOrigin) {
  RetryPolicy policy;
  policy.max_attempts = 10;
  const absl::Time now = absl::Now();
  const absl::Time never = absl::InfiniteFuture();
  using C = absl::StatusCode;
  const FailureOrigin server = FailureOrigin::kServer;
  const FailureOrigin transport = FailureOrigin::kTransport;
  auto delay = [&](C code, FailureOrigin origin, std::optional<absl::Duration> pushback,
                   int made = 1) {
    return RetryDelay(policy, made, code, origin, pushback, now, never, 0);
  };
  const absl::Duration first = absl::Milliseconds(100);
  const absl::Duration third = absl::Milliseconds(400);
  // UNAVAILABLE: the backoff, whoever made it.
  EXPECT_EQ(delay(C::kUnavailable, server, std::nullopt), first);
  EXPECT_EQ(delay(C::kUnavailable, transport, std::nullopt), first);
  // The transport's INTERNAL, UNKNOWN and RESOURCE_EXHAUSTED: the same backoff.
  for (C code : {C::kInternal, C::kUnknown, C::kResourceExhausted}) {
    EXPECT_EQ(delay(code, transport, std::nullopt), first) << code;
    EXPECT_EQ(delay(code, transport, std::nullopt, 3), third) << code;
  }
  // dgmm's own INTERNAL, UNKNOWN and RESOURCE_EXHAUSTED without a pushback: final.
  for (C code : {C::kInternal, C::kUnknown, C::kResourceExhausted}) {
    EXPECT_EQ(delay(code, server, std::nullopt), std::nullopt) << code;
  }
  // A pushback is waited for, whoever sent it.
  EXPECT_EQ(delay(C::kResourceExhausted, server, absl::Milliseconds(42)), absl::Milliseconds(42));
  EXPECT_EQ(delay(C::kResourceExhausted, transport, absl::Milliseconds(42)),
            absl::Milliseconds(42));
  // Never: the caller's cancellation, the deadline, verdicts on the request.
  for (C code : {C::kCancelled, C::kDeadlineExceeded, C::kInvalidArgument, C::kNotFound,
                 C::kUnauthenticated, C::kPermissionDenied, C::kUnimplemented,
                 C::kFailedPrecondition, C::kAborted, C::kOutOfRange, C::kDataLoss,
                 C::kAlreadyExists}) {
    for (FailureOrigin origin : {server, transport}) {
      EXPECT_EQ(delay(code, origin, std::nullopt), std::nullopt) << code;
      EXPECT_EQ(delay(code, origin, absl::Milliseconds(5)), std::nullopt) << code;
    }
  }
  // The attempt limit and the deadline bound the transport's retries too.
  EXPECT_EQ(delay(C::kInternal, transport, std::nullopt, 10), std::nullopt);
  EXPECT_EQ(RetryDelay(policy, 1, C::kInternal, transport, std::nullopt, now,
                       now + absl::Milliseconds(50), 0),
            std::nullopt);
  EXPECT_EQ(RetryDelay(policy, 1, C::kUnavailable, server, std::nullopt, now,
                       now + absl::Milliseconds(50), 0),
            std::nullopt);  // the wait would pass the deadline
}

TEST(ClientOptionsTest, CreateRejectsUnusableOptionsNamingThem) {
  ClientOptions cert_without_key;
  TlsOptions tls;  // (built apart: GCC 12 warns of a bogus uninitialized read otherwise)
  tls.cert_chain_pem = "-----BEGIN CERTIFICATE-----";
  cert_without_key.tls = std::move(tls);
  absl::StatusOr<std::unique_ptr<Client>> c = Client::Create("127.0.0.1:1", cert_without_key);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(c.status().message(), HasSubstr("private key"));

  ClientOptions spaced_token;
  spaced_token.bearer_token = "two words";
  EXPECT_THAT(Client::Create("127.0.0.1:1", spaced_token).status().message(),
              HasSubstr("visible ASCII"));

  ClientOptions no_attempts;
  no_attempts.retry.max_attempts = 0;
  EXPECT_THAT(Client::Create("127.0.0.1:1", no_attempts).status().message(),
              HasSubstr("max_attempts"));
  // The constructor defers the same error to every call.
  Client deferred("127.0.0.1:1", no_attempts);
  EXPECT_EQ(deferred.GetServerInfo().status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dgmm
