#include "dgmm/client.h"

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <functional>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "dgmm/grpc_status.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "src/retry.h"
#include "src/stream_call.h"
#include "proto/wire.h"

namespace dgmm {
namespace {

constexpr char kMultiplyMethod[] = "/dgmm.v1.Dgmm/Multiply";

// A duration as a channel argument in ms (CheckClientOptions rejects those
// out of range; this only keeps the conversion defined for them).
int ChannelArgMs(absl::Duration d) {
  return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 1,
                                              std::numeric_limits<int>::max()));
}

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ClientOptions& options) {
  grpc::ChannelArguments args;
  // Responses are as large as the requests the server accepted; the server's
  // limits bound them, not the client's.
  args.SetMaxReceiveMessageSize(-1);
  // Its own connections: without this, Clients of one process that have the
  // same server and options share gRPC's global subchannel pool, so one lost
  // connection and one reconnect backoff serve all of them.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // See ClientOptions: how soon a restarted server is found again.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
              ChannelArgMs(options.initial_reconnect_backoff));
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, ChannelArgMs(options.min_reconnect_backoff));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ChannelArgMs(options.max_reconnect_backoff));
  if (!options.load_balancing_policy.empty()) {
    args.SetLoadBalancingPolicyName(options.load_balancing_policy);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (options.tls.has_value()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = options.tls->root_ca_pem;
    ssl.pem_cert_chain = options.tls->cert_chain_pem;
    ssl.pem_private_key = options.tls->private_key_pem;
    credentials = grpc::SslCredentials(ssl);
    if (!options.tls->server_name_override.empty()) {
      args.SetSslTargetNameOverride(options.tls->server_name_override);
    }
  } else if (options.credentials != nullptr) {
    credentials = options.credentials;
  }
  return grpc::CreateCustomChannel(target, credentials, args);
}

// Runs `attempt` until it succeeds or RetryDelay says stop; a final error
// after several attempts says how many.
template <typename AttemptFn>
absl::StatusOr<JobResult> WithRetries(const RetryPolicy& policy, absl::Time deadline,
                                      const std::function<absl::Status()>& await_connection,
                                      AttemptFn attempt) {
  for (int made = 1;; ++made) {
    if (made > 1) {
      // A retried attempt first waits for a connection; one that finds none
      // has waited its share and is not retried again.
      if (absl::Status connected = await_connection(); !connected.ok()) {
        return absl::Status(connected.code(), absl::StrCat(connected.message(), " (after ",
                                                           made, " attempts)"));
      }
    }
    auto [result, retryable, pushback] = attempt(/*retried=*/made > 1);
    if (result.ok()) {
      result->attempts = made;
      return result;
    }
    std::optional<absl::Duration> wait;
    if (retryable) {
      wait = RetryDelay(policy, made, result.status(), pushback, absl::Now(), deadline,
                        RandomJitter());
    }
    if (!wait.has_value()) {
      if (made == 1) return result.status();
      return absl::Status(result.status().code(),
                          absl::StrCat(result.status().message(), " (after ", made, " attempts)"));
    }
    absl::SleepFor(*wait);
  }
}

v1::JobHeader MakeHeader(const Job& job) {
  v1::JobHeader header;
  header.set_rows(job.matrix.rows);
  header.set_cols(job.matrix.cols);
  header.set_dtype(job.matrix.dtype);
  header.set_layout(job.matrix.layout);
  header.set_side(job.side);
  header.set_backend(job.backend);
  if (job.diagonal_bytes > 0) {
    header.set_diagonal(static_cast<const char*>(job.diagonal), job.diagonal_bytes);
  }
  return header;
}

// Checks what the client itself relies on: a well-formed shape, a matrix
// pointer, and an output of exactly the matrix's size. The diagonal is left
// to the server's validator, the one authority on requests.
absl::StatusOr<size_t> CheckBuffers(const Job& job, const void* out, size_t out_bytes) {
  absl::StatusOr<size_t> bytes = MatrixBytes(job.matrix);
  if (!bytes.ok()) return bytes.status();
  if (job.matrix.data == nullptr) return absl::InvalidArgumentError("the job has no matrix data");
  if (out == nullptr || out_bytes != *bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the output buffer holds ", out_bytes, " bytes; the result needs ", *bytes));
  }
  return bytes;
}

}  // namespace

struct Client::Attempt {
  absl::StatusOr<JobResult> result;
  // False when the failure must not be retried whatever its code.
  bool retryable = true;
  std::optional<absl::Duration> pushback;
};

void ConfigureGrpcForQuickExit() { setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0); }

absl::Status CheckClientOptions(const ClientOptions& options) {
  if (options.deadline <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("ClientOptions.deadline must be positive (or infinite)");
  }
  if (options.max_unary_message_bytes < 1 || options.chunk_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions: max_unary_message_bytes (", options.max_unary_message_bytes,
                     ") and chunk_bytes (", options.chunk_bytes, ") must be at least 1"));
  }
  const RetryPolicy& retry = options.retry;
  if (retry.max_attempts < 1 || retry.initial_backoff <= absl::ZeroDuration() ||
      retry.max_backoff < retry.initial_backoff || !(retry.backoff_multiplier >= 1.0) ||
      retry.max_reconnect_wait <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        "ClientOptions.retry: max_attempts must be >= 1, initial_backoff > 0, max_backoff >= "
        "initial_backoff, backoff_multiplier >= 1 and max_reconnect_wait > 0");
  }
  const auto valid_ms = [](absl::Duration d) {
    return d >= absl::Milliseconds(1) && d <= absl::Milliseconds(std::numeric_limits<int>::max());
  };
  if (!valid_ms(options.initial_reconnect_backoff) || !valid_ms(options.min_reconnect_backoff) ||
      !valid_ms(options.max_reconnect_backoff) ||
      options.max_reconnect_backoff < options.initial_reconnect_backoff) {
    return absl::InvalidArgumentError(
        "ClientOptions: initial_reconnect_backoff, min_reconnect_backoff and "
        "max_reconnect_backoff must be from 1 ms to INT_MAX ms, and max_reconnect_backoff >= "
        "initial_reconnect_backoff");
  }
  if (options.tls.has_value()) {
    if (options.credentials != nullptr) {
      return absl::InvalidArgumentError(
          "ClientOptions: give tls or credentials, not both (tls builds the credentials)");
    }
    if (absl::Status tls = CheckTlsOptions(*options.tls); !tls.ok()) return tls;
  }
  if (!options.bearer_token.empty()) return CheckBearerToken(options.bearer_token);
  return absl::OkStatus();
}

size_t ElementSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_FLOAT64:
      return 8;
    default:
      return 0;
  }
}

const char* TransferModeName(TransferMode mode) {
  return mode == TransferMode::kUnary ? "unary" : "stream";
}

absl::StatusOr<size_t> MatrixBytes(const MatrixView& matrix) {
  const size_t element = ElementSize(matrix.dtype);
  if (element == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unsupported dtype ", v1::DType_Name(matrix.dtype), "; use float32 or float64"));
  }
  if (matrix.rows < 1 || matrix.cols < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("the matrix is ", matrix.rows, "x", matrix.cols, "; both must be >= 1"));
  }
  constexpr size_t kMax = std::numeric_limits<size_t>::max();
  const size_t rows = static_cast<size_t>(matrix.rows);
  const size_t cols = static_cast<size_t>(matrix.cols);
  if (rows > kMax / cols || rows * cols > kMax / element) {
    return absl::InvalidArgumentError(
        absl::StrCat("the matrix size ", matrix.rows, "x", matrix.cols, " overflows"));
  }
  return rows * cols * element;
}

absl::StatusOr<std::unique_ptr<Client>> Client::Create(const std::string& target,
                                                       const ClientOptions& options) {
  if (absl::Status usable = CheckClientOptions(options); !usable.ok()) return usable;
  return std::make_unique<Client>(target, options);
}

Client::Client(const std::string& target, const ClientOptions& options)
    : Client(MakeChannel(target, options), options) {}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : options_(std::move(options)),
      options_status_(CheckClientOptions(options_)),
      channel_(std::move(channel)),
      stub_(v1::Dgmm::NewStub(channel_)),
      generic_stub_(channel_) {}

absl::Time Client::Deadline() const { return absl::Now() + options_.deadline; }

void Client::PrepareContext(grpc::ClientContext* context, absl::Time deadline,
                            bool wait_for_ready) const {
  if (deadline != absl::InfiniteFuture()) context->set_deadline(absl::ToChronoTime(deadline));
  if (wait_for_ready) context->set_wait_for_ready(true);
  if (!options_.bearer_token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.bearer_token));
  }
}

absl::Status Client::PrepareCall(grpc::ClientContext* context, absl::Time deadline) const {
  if (!options_status_.ok()) return options_status_;
  PrepareContext(context, deadline);
  return absl::OkStatus();
}

absl::Status Client::AwaitConnection(absl::Time deadline) {
  const absl::Time start = absl::Now();
  const absl::Duration wait = options_.retry.max_reconnect_wait;
  const bool deadline_first = deadline <= start + wait;
  const absl::Time until = deadline_first ? deadline : start + wait;
  if (channel_->WaitForConnected(absl::ToChronoTime(until))) return absl::OkStatus();
  const std::string waited =
      absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1)));
  // UNAVAILABLE either way: the server could not be reached, which is what
  // the caller needs to know (a deadline that passed without any call made
  // is not a slow job).
  return absl::UnavailableError(absl::StrCat(
      "no connection to the server within ", waited,
      deadline_first ? " (the job's deadline)" : " (RetryPolicy.max_reconnect_wait)"));
}

absl::StatusOr<JobResult> Client::Multiply(const Job& job, void* out, size_t out_bytes,
                                           const ProgressCallback& progress) {
  if (!options_status_.ok()) return options_status_;
  absl::StatusOr<size_t> bytes = CheckBuffers(job, out, out_bytes);
  if (!bytes.ok()) return bytes.status();
  const int64_t threshold =
      options_.streaming_threshold_bytes >= 0
          ? options_.streaming_threshold_bytes
          : std::min(options_.chunk_bytes, options_.max_unary_message_bytes / 8 * 7);
  const int64_t request_bytes = static_cast<int64_t>(*bytes + job.diagonal_bytes);
  if (request_bytes <= threshold) return MultiplyUnary(job, out, out_bytes, progress);
  return MultiplyStream(job, out, out_bytes, progress);
}

absl::StatusOr<JobResult> Client::MultiplyUnary(const Job& job, void* out, size_t out_bytes,
                                                const ProgressCallback& progress) {
  if (!options_status_.ok()) return options_status_;
  absl::StatusOr<size_t> bytes = CheckBuffers(job, out, out_bytes);
  if (!bytes.ok()) return bytes.status();
  const absl::Time deadline = Deadline();
  return WithRetries(options_.retry, deadline, [&] { return AwaitConnection(deadline); },
                     [&](bool retried) {
    return UnaryAttempt(job, *bytes, out, out_bytes, deadline, retried, progress);
  });
}

Client::Attempt Client::UnaryAttempt(const Job& job, size_t matrix_bytes, void* out,
                                     size_t out_bytes, absl::Time deadline, bool retried,
                                     const ProgressCallback& progress) {
  Attempt attempt;
  const v1::JobHeader header = MakeHeader(job);
  JobResult result;
  result.mode = TransferMode::kUnary;
  absl::Status outcome;
  // Declared first so that it outlives the context and buffers holding its slices.
  wire::SliceLoans loans;
  {
    grpc::ClientContext context;
    PrepareContext(&context, deadline, /*wait_for_ready=*/retried);
    grpc::ByteBuffer request =
        wire::EncodeMultiplyRequest(header, job.matrix.data, matrix_bytes, &loans);
    grpc::ByteBuffer response;
    absl::Mutex mu;
    bool done = false;
    grpc::Status status;
    generic_stub_.UnaryCall(&context, kMultiplyMethod, grpc::StubOptions(), &request, &response,
                            [&](grpc::Status s) {
                              absl::MutexLock lock(&mu);
                              status = std::move(s);
                              done = true;
                            });
    mu.LockWhen(absl::Condition(&done));
    mu.Unlock();
    request.Clear();
    if (status.ok()) {
      outcome = wire::DecodeMultiplyResponse(&response, out, out_bytes, &result.stats);
      // A response that does not decode came from a server that works: final.
      attempt.retryable = false;
    } else {
      outcome = FromGrpcStatus(status);
      attempt.pushback = RetryPushback(context);
    }
  }
  loans.WaitUntilReturned();
  if (!outcome.ok()) {
    attempt.result = outcome;
    return attempt;
  }
  if (progress) {
    const int64_t total = static_cast<int64_t>(matrix_bytes);
    progress(total, total, total);
  }
  attempt.result = result;
  return attempt;
}

absl::StatusOr<JobResult> Client::MultiplyStream(const Job& job, void* out, size_t out_bytes,
                                                 const ProgressCallback& progress) {
  if (!options_status_.ok()) return options_status_;
  absl::StatusOr<size_t> bytes = CheckBuffers(job, out, out_bytes);
  if (!bytes.ok()) return bytes.status();
  const absl::Time deadline = Deadline();
  return WithRetries(options_.retry, deadline, [&] { return AwaitConnection(deadline); },
                     [&](bool retried) {
    return StreamAttempt(job, *bytes, out, deadline, retried, progress);
  });
}

Client::Attempt Client::StreamAttempt(const Job& job, size_t matrix_bytes, void* out,
                                      absl::Time deadline, bool retried,
                                      const ProgressCallback& progress) {
  Attempt attempt;
  const v1::JobHeader header = MakeHeader(job);
  const StreamPlan plan = PlanStream(job.matrix, matrix_bytes, options_.chunk_bytes);
  absl::StatusOr<v1::JobStats> stats;
  // Declared first so that it outlives the context and buffers holding its slices.
  wire::SliceLoans loans;
  {
    grpc::ClientContext context;
    PrepareContext(&context, deadline, /*wait_for_ready=*/retried);
    StreamCall call(header, static_cast<const char*>(job.matrix.data), static_cast<char*>(out),
                    plan, progress, &loans);
    stats = call.Run(&generic_stub_, &context);
    // Once part of the result has been delivered the job is not repeated.
    attempt.retryable = !call.ReceivedResultBlock();
    if (!stats.ok()) attempt.pushback = RetryPushback(context);
  }
  loans.WaitUntilReturned();
  if (!stats.ok()) {
    attempt.result = stats.status();
    return attempt;
  }
  JobResult result;
  result.mode = TransferMode::kStream;
  result.stats = *std::move(stats);
  attempt.result = std::move(result);
  return attempt;
}

absl::StatusOr<v1::GetServerInfoResponse> Client::GetServerInfo() {
  if (!options_status_.ok()) return options_status_;
  grpc::ClientContext context;
  PrepareContext(&context, Deadline());
  v1::GetServerInfoResponse response;
  grpc::Status status = stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<HealthState> Client::Health(const std::string& service) {
  if (!options_status_.ok()) return options_status_;
  grpc::ClientContext context;
  PrepareContext(&context, Deadline());
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status =
      grpc::health::v1::Health::NewStub(channel_)->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status();
}

}  // namespace dgmm
