#include "dgmm/client.h"

#include <grpc/grpc.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "dgmm/grpc_status.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "src/job_lines.h"
#include "src/retry.h"
#include "src/stream_call.h"
#include "src/trace_headers.h"
#include "proto/wire.h"

namespace dgmm {
namespace {

constexpr char kMultiplyMethod[] = "/dgmm.v1.Dgmm/Multiply";
// The same, made once (PrepareUnaryCall takes a std::string).
const std::string& MultiplyMethod() {
  static const std::string* const method = new std::string(kMultiplyMethod);
  return *method;
}
// Small jobs (a request of at most kMaxSmallMessageBytes): a plain unary
// method, cheaper per call on the server than Multiply (the proto).
constexpr size_t kMaxSmallMessageBytes = size_t{256} << 10;
const std::string& MultiplySmallMethod() {
  static const std::string* const method = new std::string("/dgmm.v1.Dgmm/MultiplySmall");
  return *method;
}
const std::string& MultiplyBatchMethod() {
  static const std::string* const method = new std::string("/dgmm.v1.Dgmm/MultiplyBatch");
  return *method;
}
// One unary call of `method`, completed on this thread: it polls a
// completion queue of its own, as a synchronous call does, instead of
// waiting for gRPC's callback thread to wake it (two thread switches per
// call, which cost more than a small job's RPC itself). A cancel
// (JobRun::Fail, the CancelToken) or the deadline still ends the wait: the
// call then completes with its status.
grpc::Status UnaryCallOnThisThread(grpc::GenericStub* stub, grpc::ClientContext* context,
                                   const std::string& method, const grpc::ByteBuffer& request,
                                   grpc::ByteBuffer* response) {
  grpc::Status status;
  grpc::CompletionQueue cq;
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub->PrepareUnaryCall(context, method, request, &cq);
  call->StartCall();
  call->Finish(response, &status, &cq);
  void* tag = nullptr;
  bool ok = false;
  // The one event this queue ever gets: the call's end.
  const bool got = cq.Next(&tag, &ok);
  cq.Shutdown();
  for (void* t; cq.Next(&t, &ok);) {
  }
  if (!got) status = grpc::Status(grpc::StatusCode::INTERNAL, "completion queue shut down");
  return status;
}

// The status payload that carries a failed job's attempts (AttemptsOf).
constexpr char kAttemptsPayload[] = "type.dgmm.dev/dgmm.client.attempts";

// `status` with the pushback of the call that ended it, when it had one.
absl::Status WithPushback(absl::Status status, std::optional<absl::Duration> pushback) {
  if (pushback.has_value()) SetRetryAfter(&status, *pushback);
  return status;
}

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
  for (const auto& [key, value] : wire::ExtraChannelArgs()) args.SetInt(key, value);
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

// The channel of stripe lane `i`: the target and the options' load-balancing
// policy. A fresh round_robin channel sends its first calls to the first of
// its replicas to connect (gRPC 1.51), so K fresh round_robin channels tend
// to put every part on one replica. For an "ipv4:"/"ipv6:" address list
// under round_robin, lane i therefore uses pick_first over the list rotated
// by i: it connects to replica i mod n, and when that one is down, to the
// next. Other targets (a DNS name) keep round_robin on each lane's channel.
std::pair<std::string, std::string> StripeLaneTarget(const std::string& target,
                                                     const std::string& lb_policy, int i) {
  if (lb_policy != "round_robin") return {target, lb_policy};
  const size_t colon = target.find(':');
  if (colon == std::string::npos) return {target, lb_policy};
  const std::string scheme = target.substr(0, colon);
  if (scheme != "ipv4" && scheme != "ipv6") return {target, lb_policy};
  std::vector<std::string> addresses = absl::StrSplit(target.substr(colon + 1), ',');
  if (addresses.size() < 2) return {target, lb_policy};
  std::rotate(addresses.begin(), addresses.begin() + static_cast<long>(i % addresses.size()),
              addresses.end());
  return {absl::StrCat(scheme, ":", absl::StrJoin(addresses, ",")), "pick_first"};
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
  if (job.right_diagonal_bytes > 0) {
    header.set_right_diagonal(static_cast<const char*>(job.right_diagonal),
                              job.right_diagonal_bytes);
  }
  header.set_diagonal_dtype(job.diagonal_dtype);
  header.set_result_dtype(job.result_dtype);
  return header;
}

// Checks what the client itself relies on: a well-formed shape, a matrix
// pointer, and an output of exactly the result's size (ResultBytes). The
// diagonal is left to the server's validator, the one authority on
// requests. Returns the matrix's size.
absl::StatusOr<size_t> CheckBuffers(const Job& job, const void* out, size_t out_bytes) {
  absl::StatusOr<size_t> bytes = MatrixBytes(job.matrix);
  if (!bytes.ok()) return bytes.status();
  if (job.matrix.data == nullptr) return absl::InvalidArgumentError("the job has no matrix data");
  absl::StatusOr<size_t> result = ResultBytes(job);
  if (!result.ok()) return result.status();
  if (out == nullptr || out_bytes != *result) {
    return absl::InvalidArgumentError(
        absl::StrCat("the output buffer holds ", out_bytes, " bytes; the result needs ", *result,
                     ResultDType(job) == job.matrix.dtype
                         ? ""
                         : absl::StrCat(" (", v1::DType_Name(ResultDType(job)), ")")));
  }
  // In place (out == A) works where C has A's size: result block k lands on
  // A's block k, sent already. A wider C would land on lines of A not yet
  // sent (streams overlap sending and receiving, stripes run at once): any
  // overlap of out with A is refused then, as any partial one always is.
  const char* a = static_cast<const char*>(job.matrix.data);
  const char* c = static_cast<const char*>(out);
  const bool overlaps = c < a + *bytes && a < c + out_bytes;
  if (overlaps && !(c == a && out_bytes == *bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the output buffer overlaps the matrix", c == a ? " and the result (" : " (",
                     c == a ? absl::StrCat(v1::DType_Name(ResultDType(job)), ", ", out_bytes,
                                           " bytes) is wider than it: give C a buffer of its own")
                            : "not exactly in place)"));
  }
  return bytes;
}

}  // namespace

struct Client::Attempt {
  absl::StatusOr<JobResult> result;
  // False when the failure must not be retried whatever its code.
  bool retryable = true;
  // Who ended the failed call (FailureOriginOf) and its pushback trailer.
  FailureOrigin origin = FailureOrigin::kTransport;
  std::optional<absl::Duration> pushback;
  // Result lines received (and placed) from the attempt's first line.
  int64_t lines_received = 0;
  // Result payload bytes that arrived in this attempt, counted as they came
  // (JobResult::received_bytes adds them up: a line received twice shows).
  int64_t result_bytes = 0;
};

// What the parts of one logical job share: the job, the first final error
// (which cancels the other parts), the calls in flight, and progress. Its
// locks are std::mutex, which the thread sanitizer can see.
struct Client::JobRun {
  const Job* job = nullptr;
  char* out = nullptr;
  absl::Time deadline;
  std::optional<TransferMode> mode;  // nullopt: rule 1 per part
  int stripes = 1;
  std::string group_id;  // empty when stripes == 1
  internal::JobLines cut;  // the job's lines (cut.lines in all)
  size_t line_bytes = 0;
  size_t matrix_bytes = 0;
  // C's line (more than A's for a result of a wider dtype).
  size_t out_line_bytes = 0;

  std::mutex mu;
  std::condition_variable failed_cv;
  bool failed = false;                    // guarded by mu
  absl::Status first_error;               // guarded by mu
  std::vector<grpc::ClientContext*> live;  // guarded by mu
  // Per part (each written by its own part's thread, read after the join):
  // the attempts made and its final stats.
  std::vector<int> attempts;
  std::vector<v1::JobStats> stats;
  std::atomic<int64_t> received_bytes{0};
  std::atomic<int> resumed{0};
  // Whether any attempt of any part went over MultiplyStream (JobResult::mode).
  std::atomic<bool> any_stream{false};

  // Progress: per part, bytes sent and received (received lines kept over
  // resumes); calls to the user's callback never overlap.
  const ProgressCallback* progress = nullptr;
  std::mutex progress_mu;
  std::vector<int64_t> sent;      // guarded by progress_mu
  std::vector<int64_t> received;  // guarded by progress_mu

  bool Failed() {
    std::lock_guard lock(mu);
    return failed;
  }
  // The first final error ends the job: cancels every call in flight.
  void Fail(const absl::Status& status) {
    {
      std::lock_guard lock(mu);
      if (failed) return;
      failed = true;
      first_error = status;
      for (grpc::ClientContext* c : live) c->TryCancel();
    }
    failed_cv.notify_all();
  }
  // A call starting; cancelled at once when the job has already failed.
  void Register(grpc::ClientContext* context) {
    std::lock_guard lock(mu);
    live.push_back(context);
    if (failed) context->TryCancel();
  }
  void Unregister(grpc::ClientContext* context) {
    std::lock_guard lock(mu);
    live.erase(std::find(live.begin(), live.end(), context));
  }
  // Waits `wait`, or less when the job fails meanwhile; false if it failed.
  bool Sleep(absl::Duration wait) {
    std::unique_lock lock(mu);
    failed_cv.wait_for(lock, absl::ToChronoNanoseconds(wait), [this] { return failed; });
    return !failed;
  }
  void Progress(int part, int64_t sent_bytes, int64_t received_bytes) {
    if (progress == nullptr || !*progress) return;
    std::lock_guard lock(progress_mu);
    sent[part] = sent_bytes;
    received[part] = received_bytes;
    int64_t total_sent = 0;
    int64_t total_received = 0;
    for (size_t i = 0; i < sent.size(); ++i) {
      total_sent += sent[i];
      total_received += received[i];
    }
    (*progress)(total_sent, total_received, static_cast<int64_t>(matrix_bytes));
  }
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
  if (options.same_host_blocks < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("ClientOptions.same_host_blocks must be 0 (auto) or more, not ",
                     options.same_host_blocks));
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
  if (options.stripes < 0 || options.stripes > 256) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ClientOptions.stripes is ", options.stripes, "; it must be from 0 (auto) to 256"));
  }
  if (!options.bearer_token.empty()) return CheckBearerToken(options.bearer_token);
  return absl::OkStatus();
}

size_t ElementSize(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_COMPLEX64:
      return 8;
    case v1::DTYPE_COMPLEX128:
      return 16;
    default:
      return 0;
  }
}

v1::DType PromoteDTypes(v1::DType a, v1::DType b) {
  if (ElementSize(a) == 0 || ElementSize(b) == 0) return v1::DTYPE_UNSPECIFIED;
  if (a == b) return a;
  const auto complex = [](v1::DType t) {
    return t == v1::DTYPE_COMPLEX64 || t == v1::DTYPE_COMPLEX128;
  };
  // Width of the real part: 0 half, 1 float32, 2 float64.
  const auto rank = [](v1::DType t) {
    switch (t) {
      case v1::DTYPE_FLOAT16:
      case v1::DTYPE_BFLOAT16:
        return 0;
      case v1::DTYPE_FLOAT32:
      case v1::DTYPE_COMPLEX64:
        return 1;
      default:
        return 2;
    }
  };
  // float16 with bfloat16 (a != b): float32.
  const int r = std::max({rank(a), rank(b), 1});
  if (complex(a) || complex(b)) return r == 1 ? v1::DTYPE_COMPLEX64 : v1::DTYPE_COMPLEX128;
  return r == 1 ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT64;
}

v1::DType ResultDType(const Job& job) {
  if (job.result_dtype != v1::DTYPE_UNSPECIFIED) return job.result_dtype;
  return PromoteDTypes(job.matrix.dtype, job.diagonal_dtype == v1::DTYPE_UNSPECIFIED
                                             ? job.matrix.dtype
                                             : job.diagonal_dtype);
}

absl::StatusOr<size_t> ResultBytes(const Job& job) {
  absl::StatusOr<size_t> bytes = MatrixBytes(job.matrix);
  if (!bytes.ok()) return bytes;
  const v1::DType c = ResultDType(job);
  const size_t elem = ElementSize(c);
  if (elem == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported result dtype ", v1::DType_Name(c),
                     "; use float16, bfloat16, float32, float64, complex64 or complex128"));
  }
  const size_t a = ElementSize(job.matrix.dtype);
  const size_t n = *bytes / a;
  if (n > std::numeric_limits<size_t>::max() / elem) {
    return absl::InvalidArgumentError(absl::StrCat("the result of the ", job.matrix.rows, "x",
                                                   job.matrix.cols, " matrix overflows"));
  }
  return n * elem;
}

const char* TransferModeName(TransferMode mode) {
  switch (mode) {
    case TransferMode::kUnary:
      return "unary";
    case TransferMode::kStream:
      return "stream";
    case TransferMode::kRegion:
      return "shm";
  }
  return "?";
}

int64_t UnaryThreshold(int64_t max_unary_message_bytes, int64_t chunk_bytes) {
  return std::min(chunk_bytes, max_unary_message_bytes / 8 * 7);
}

int64_t LinesPerBlock(int64_t line_bytes, int64_t chunk_bytes) {
  return std::max<int64_t>(1, line_bytes > 0 ? chunk_bytes / line_bytes : 1);
}

int AttemptsOf(const absl::Status& status) {
  const auto payload = status.GetPayload(kAttemptsPayload);
  int attempts = 0;
  if (!payload.has_value() || !absl::SimpleAtoi(std::string(*payload), &attempts)) return 0;
  return attempts;
}

// Room left in a Multiply message for its framing and header fields when a
// job goes unary because its line fits no block (rule 1).
constexpr int64_t kUnaryFramingBytes = int64_t{64} << 10;

TransferMode ChooseTransferMode(int64_t request_bytes, int64_t max_unary_message_bytes,
                                int64_t chunk_bytes, int64_t line_bytes) {
  const int64_t threshold =
      line_bytes > chunk_bytes ? max_unary_message_bytes - kUnaryFramingBytes
                               : UnaryThreshold(max_unary_message_bytes, chunk_bytes);
  return request_bytes <= threshold ? TransferMode::kUnary : TransferMode::kStream;
}

int ChooseStripes(int64_t matrix_bytes, int64_t lines, int stripes_option) {
  constexpr int64_t kBytesPerStripe = int64_t{32} << 20;
  int64_t k = stripes_option >= 1
                  ? stripes_option
                  : std::min<int64_t>(8, std::max<int64_t>(1, matrix_bytes / kBytesPerStripe));
  k = std::min(k, std::max<int64_t>(lines, 1));
  return static_cast<int>(k);
}

std::vector<LineRange> SplitLines(int64_t lines, int stripes) {
  std::vector<LineRange> ranges;
  const int64_t k = std::max(1, stripes);
  const int64_t base = lines / k;
  const int64_t extra = lines % k;
  int64_t first = 0;
  for (int64_t i = 0; i < k; ++i) {
    const int64_t n = base + (i < extra ? 1 : 0);
    ranges.push_back({first, n});
    first += n;
  }
  return ranges;
}

absl::StatusOr<v1::Backend> ParseBackendName(absl::string_view name) {
  if (name == "auto" || name == "BACKEND_AUTO") return v1::BACKEND_AUTO;
  if (name == "cpu" || name == "BACKEND_CPU") return v1::BACKEND_CPU;
  if (name == "cuda-kernel" || name == "BACKEND_CUDA_KERNEL") return v1::BACKEND_CUDA_KERNEL;
  if (name == "cublas" || name == "BACKEND_CUBLAS") return v1::BACKEND_CUBLAS;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend \"", name,
                   "\"; expected auto, cpu, cuda-kernel or cublas (or BACKEND_AUTO, BACKEND_CPU, "
                   "BACKEND_CUDA_KERNEL, BACKEND_CUBLAS)"));
}

absl::StatusOr<size_t> MatrixBytes(const MatrixView& matrix) {
  const size_t element = ElementSize(matrix.dtype);
  if (element == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("unsupported dtype ", v1::DType_Name(matrix.dtype),
                     "; use float16, bfloat16, float32, float64, complex64 or complex128"));
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
    : Client(MakeChannel(target, options), options) {
  target_ = target;
}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : options_(std::move(options)),
      options_status_(CheckClientOptions(options_)),
      channel_(std::move(channel)),
      stub_(v1::Dgmm::NewStub(channel_)) {
  // Debian's Abseil is built with mutex deadlock detection on, a debugging
  // aid that costs every absl::Mutex lock in the process, gRPC's included
  // (bench/results/wire). The first Client turns it off (dgmm-server does
  // the same); a program that wants it calls
  // absl::SetMutexDeadlockDetectionMode afterwards.
  static std::once_flag quiet_mutexes;
  std::call_once(quiet_mutexes, [] {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  });
  auto lane = std::make_unique<Lane>();
  lane->channel = channel_;
  lane->stub = std::make_unique<grpc::GenericStub>(channel_);
  lanes_.push_back(std::move(lane));
}

Client::~Client() {
  std::lock_guard lock(connect_mu_);
  stop_connecting_ = true;
  if (connector_.joinable()) connector_.join();
}

void Client::Connect(int stripes) {
  // As many as a job may use (ClientOptions.stripes is at most 256).
  const int k = std::clamp(stripes, 1, 256);
  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < k; ++i) {
    std::shared_ptr<grpc::Channel> channel = GetLane(i, /*striped=*/k > 1)->channel;
    channel->GetState(/*try_to_connect=*/true);
    channels.push_back(std::move(channel));
  }
  // gRPC 1.51 advances a connection only while some thread waits on it (or
  // at its backup poller's 5 s ticks), and gives an attempt up after
  // min_reconnect_backoff: without a waiter, a caller that works for longer
  // than that before its job finds the channel failed. So a thread waits.
  std::lock_guard lock(connect_mu_);
  if (connector_.joinable()) {
    stop_connecting_ = true;
    connector_.join();
    stop_connecting_ = false;
  }
  const absl::Time until = absl::Now() + options_.retry.max_reconnect_wait;
  connector_ = std::thread([this, channels = std::move(channels), until] {
    for (const std::shared_ptr<grpc::Channel>& channel : channels) {
      while (!stop_connecting_.load()) {
        const absl::Time slice = std::min(until, absl::Now() + absl::Milliseconds(20));
        if (channel->WaitForConnected(absl::ToChronoTime(slice)) || slice >= until) break;
      }
    }
  });
}

namespace {

// UNAVAILABLE for a wait for a connection that began at `start` and ran out:
// the server could not be reached, which is what the caller needs to know (a
// deadline that passed without any call made is not a slow job).
absl::Status NoConnectionWithin(absl::Time start, bool deadline_first) {
  absl::Status s = absl::UnavailableError(absl::StrCat(
      "no connection to the server within ",
      absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
      deadline_first ? " (the job's deadline)" : " (RetryPolicy.max_reconnect_wait)"));
  MarkReconnectWaitSpent(&s);
  return s;
}

}  // namespace

absl::Status Client::AwaitChannel(absl::Time deadline) const {
  const absl::Time start = absl::Now();
  const absl::Duration wait = options_.retry.max_reconnect_wait;
  const bool deadline_first = deadline <= start + wait;
  const absl::Time until = deadline_first ? deadline : start + wait;
  // Until the channel is READY, or a connection attempt this wait saw start
  // has failed (a server that is not there answers at once: no need to wait
  // out max_reconnect_wait), or the time is up. Waiting is what drives the
  // attempt (gRPC 1.51 makes progress only while a thread waits).
  bool attempted = false;
  for (;;) {
    const grpc_connectivity_state state = channel_->GetState(/*try_to_connect=*/true);
    if (state == GRPC_CHANNEL_READY) return absl::OkStatus();
    if (state == GRPC_CHANNEL_CONNECTING) attempted = true;
    if (state == GRPC_CHANNEL_TRANSIENT_FAILURE && attempted) break;
    if (!channel_->WaitForStateChange(state, absl::ToChronoTime(until))) break;
  }
  if (attempted && absl::Now() < until) {
    return absl::UnavailableError(absl::StrCat(
        "the connection to the server failed (after ",
        absl::FormatDuration(absl::Trunc(absl::Now() - start, absl::Milliseconds(1))), ")"));
  }
  return NoConnectionWithin(start, deadline_first);
}

Client::Lane* Client::GetLane(int i, bool striped) {
  std::lock_guard lock(lanes_mu_);
  // Without a target every part shares the one channel it was given.
  if (!striped || target_.empty()) return lanes_.front().get();
  while (static_cast<int>(stripe_lanes_.size()) <= i) {
    // MakeChannel uses a local subchannel pool: each lane's channel makes its
    // own TCP connection(s).
    const auto [target, lb_policy] = StripeLaneTarget(target_, options_.load_balancing_policy,
                                                      static_cast<int>(stripe_lanes_.size()));
    ClientOptions lane_options = options_;
    lane_options.load_balancing_policy = lb_policy;
    auto lane = std::make_unique<Lane>();
    lane->channel = MakeChannel(target, lane_options);
    lane->stub = std::make_unique<grpc::GenericStub>(lane->channel);
    stripe_lanes_.push_back(std::move(lane));
  }
  return stripe_lanes_[static_cast<size_t>(i)].get();
}

absl::Time Client::Deadline() const { return absl::Now() + options_.deadline; }

void Client::PrepareContext(grpc::ClientContext* context, absl::Time deadline) const {
  if (deadline != absl::InfiniteFuture()) context->set_deadline(absl::ToChronoTime(deadline));
  if (!options_.bearer_token.empty()) {
    context->AddMetadata("authorization", absl::StrCat("Bearer ", options_.bearer_token));
  }
}

absl::Status Client::PrepareCall(grpc::ClientContext* context, absl::Time deadline) const {
  if (!options_status_.ok()) return options_status_;
  PrepareContext(context, deadline);
  return absl::OkStatus();
}

absl::Status Client::AwaitConnection(Lane* lane, JobRun* run) {
  const absl::Time start = absl::Now();
  const absl::Duration wait = options_.retry.max_reconnect_wait;
  const bool deadline_first = run->deadline <= start + wait;
  const absl::Time until = deadline_first ? run->deadline : start + wait;
  // In slices, so that a cancelled or failed job stops waiting at once.
  for (;;) {
    if (run->Failed()) return absl::CancelledError("the job was cancelled or another part failed");
    const absl::Time slice = std::min(until, absl::Now() + absl::Milliseconds(20));
    if (lane->channel->WaitForConnected(absl::ToChronoTime(slice))) return absl::OkStatus();
    if (slice >= until) break;
  }
  return NoConnectionWithin(start, deadline_first);
}

void CancelToken::Cancel() {
  std::lock_guard lock(mu_);
  cancelled_ = true;
  if (on_cancel_) on_cancel_();
}

bool CancelToken::cancelled() const {
  std::lock_guard lock(mu_);
  return cancelled_;
}

CancelToken::Watch::Watch(CancelToken* token, std::function<void()> on_cancel) : token_(token) {
  if (token_ == nullptr) return;
  std::lock_guard lock(token_->mu_);
  previous_ = std::exchange(token_->on_cancel_, std::move(on_cancel));
  if (token_->cancelled_) token_->on_cancel_();
}

CancelToken::Watch::~Watch() {
  if (token_ == nullptr) return;
  std::lock_guard lock(token_->mu_);
  token_->on_cancel_ = std::move(previous_);
}

bool CancelToken::SleepUnlessCancelled(absl::Duration wait, const CancelToken* token) {
  const absl::Time until = absl::Now() + wait;
  // In slices, so that a cancel ends the wait within 20 ms.
  for (;;) {
    if (token != nullptr && token->cancelled()) return false;
    const absl::Duration left = until - absl::Now();
    if (left <= absl::ZeroDuration()) return true;
    absl::SleepFor(std::min(left, absl::Milliseconds(20)));
  }
}

absl::StatusOr<JobResult> Client::Multiply(const Job& job, void* out, size_t out_bytes,
                                           const ProgressCallback& progress,
                                           CancelToken* cancel) {
  return RunJob(job, out, out_bytes, progress, std::nullopt, cancel);
}

absl::StatusOr<Client::JobPlan> Client::Plan(const Job& job,
                                             std::optional<TransferMode> mode) const {
  absl::StatusOr<size_t> bytes = MatrixBytes(job.matrix);
  if (!bytes.ok()) return bytes.status();
  JobPlan plan;
  plan.forced = mode;
  if (!plan.forced.has_value() && options_.streaming_threshold_bytes >= 0) {
    // An explicit threshold decides for the whole job, as before striping.
    plan.forced = static_cast<int64_t>(*bytes + job.diagonal_bytes + job.right_diagonal_bytes) <=
                          options_.streaming_threshold_bytes
                      ? TransferMode::kUnary
                      : TransferMode::kStream;
  }
  // Parts (and resumed parts) slice the diagonal only when it has the length
  // the side needs; otherwise the job goes whole and the server's validator
  // names the problem.
  const internal::JobLines cut = internal::LinesOfJob(job);
  const int64_t lines = cut.lines;
  plan.stripes = cut.diagonal_fits
                     ? ChooseStripes(static_cast<int64_t>(*bytes), lines, options_.stripes)
                     : 1;
  plan.slice_diagonal = cut.slice_diagonal;
  const int64_t first_lines = SplitLines(lines, plan.stripes).front().lines;
  const size_t first_bytes = static_cast<size_t>(first_lines) * (*bytes / static_cast<size_t>(lines));
  const size_t first_diag =
      job.diagonal_bytes + job.right_diagonal_bytes -
      (plan.slice_diagonal ? cut.sliced_bytes - static_cast<size_t>(first_lines) * cut.diag_elem
                           : 0);
  plan.mode = plan.forced.value_or(ChooseTransferMode(
      static_cast<int64_t>(first_bytes + first_diag), options_.max_unary_message_bytes,
      options_.chunk_bytes, static_cast<int64_t>(*bytes / static_cast<size_t>(lines))));
  return plan;
}

absl::StatusOr<JobResult> Client::MultiplyUnary(const Job& job, void* out, size_t out_bytes,
                                                const ProgressCallback& progress,
                                                CancelToken* cancel) {
  return RunJob(job, out, out_bytes, progress, TransferMode::kUnary, cancel);
}

absl::StatusOr<JobResult> Client::MultiplyStream(const Job& job, void* out, size_t out_bytes,
                                                 const ProgressCallback& progress,
                                                 CancelToken* cancel) {
  return RunJob(job, out, out_bytes, progress, TransferMode::kStream, cancel);
}

namespace {

// A random group id: 16 lowercase hex characters.
std::string RandomGroupId() {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("%016x", rng());
}

}  // namespace

absl::StatusOr<JobResult> Client::RunJob(const Job& caller_job, void* out, size_t out_bytes,
                                         const ProgressCallback& progress,
                                         std::optional<TransferMode> mode, CancelToken* cancel) {
  if (!options_status_.ok()) return options_status_;
  // The job as its calls carry it: with the caller's traceparent or a new one.
  Job job = caller_job;
  if (absl::Status ok = internal::ResolveTrace(&job.traceparent, job.tracestate, "Job");
      !ok.ok()) {
    return ok;
  }
  absl::StatusOr<size_t> bytes = CheckBuffers(job, out, out_bytes);
  if (!bytes.ok()) return bytes.status();
  absl::StatusOr<JobPlan> plan = Plan(job, mode);
  if (!plan.ok()) return plan.status();
  std::string socket_reason;
  if (!mode.has_value() && options_.same_host &&
      static_cast<int64_t>(*bytes) >= options_.same_host_min_bytes) {
    if (cancel != nullptr && cancel->cancelled()) {
      return absl::CancelledError("the job was cancelled before it started");
    }
    std::optional<absl::StatusOr<JobResult>> done = SameHostJob(
        job, out, *bytes, progress, GetLane(0, plan->stripes > 1), cancel, &socket_reason);
    if (done.has_value()) {
      if (done->ok()) (*done)->traceparent = job.traceparent;
      return *std::move(done);
    }
  }
  JobRun run;
  // The token fails the run (cancelling its calls and ending its waits)
  // until the run is over.
  if (cancel != nullptr) {
    std::lock_guard lock(cancel->mu_);
    if (cancel->cancelled_) return absl::CancelledError("the job was cancelled before it started");
    cancel->on_cancel_ = [&run] { run.Fail(absl::CancelledError("the job was cancelled")); };
  }
  absl::Cleanup detach = [cancel] {
    if (cancel == nullptr) return;
    std::lock_guard lock(cancel->mu_);
    cancel->on_cancel_ = nullptr;
  };
  run.job = &job;
  run.out = static_cast<char*>(out);
  run.deadline = std::min(Deadline(), job.deadline);
  run.matrix_bytes = *bytes;
  run.mode = plan->forced;
  run.cut = internal::LinesOfJob(job);
  run.line_bytes = *bytes / static_cast<size_t>(run.cut.lines);
  run.out_line_bytes = out_bytes / static_cast<size_t>(run.cut.lines);
  run.stripes = plan->stripes;
  if (run.stripes > 1) run.group_id = RandomGroupId();
  const std::vector<LineRange> ranges = SplitLines(run.cut.lines, run.stripes);
  const size_t k = ranges.size();
  run.attempts.assign(k, 0);
  run.stats.assign(k, v1::JobStats());
  run.progress = &progress;
  {
    std::lock_guard lock(run.progress_mu);
    run.sent.assign(k, 0);
    run.received.assign(k, 0);
  }
  {
    // A part's final error fails the run (JobRun::Fail), which is read below.
    std::vector<std::thread> threads;
    for (size_t i = 1; i < k; ++i) {
      threads.emplace_back(
          [&, i] { RunPart(&run, static_cast<int>(i), ranges[i]).IgnoreError(); });
    }
    RunPart(&run, 0, ranges[0]).IgnoreError();
    for (std::thread& t : threads) t.join();
  }
  {
    std::lock_guard lock(run.mu);
    if (run.failed) {
      int attempts = 0;
      for (int a : run.attempts) attempts += a;
      absl::Status failed = run.first_error;
      failed.SetPayload(kAttemptsPayload, absl::Cord(absl::StrCat(attempts)));
      return failed;
    }
  }
  JobResult result;
  result.stripes = static_cast<int>(k);
  // Unary only when every attempt of every part went unary (protocol.md §9).
  result.mode = run.any_stream.load() ? TransferMode::kStream : TransferMode::kUnary;
  result.attempts = 0;
  for (int a : run.attempts) result.attempts += a;
  result.part_stats = run.stats;
  result.received_bytes = run.received_bytes.load();
  result.resumed = run.resumed.load();
  result.socket_reason = std::move(socket_reason);
  result.traceparent = job.traceparent;
  result.stats = run.stats[0];
  if (k > 1) {
    int64_t h2d = 0, compute = 0, d2h = 0, queue = 0, total = 0;
    for (const v1::JobStats& s : run.stats) {
      h2d += s.h2d_ns();
      compute += s.compute_ns();
      d2h += s.d2h_ns();
      queue = std::max(queue, s.queue_wait_ns());
      total = std::max(total, s.total_ns());
    }
    result.stats.set_h2d_ns(h2d);
    result.stats.set_compute_ns(compute);
    result.stats.set_d2h_ns(d2h);
    result.stats.set_queue_wait_ns(queue);
    result.stats.set_total_ns(total);
  }
  return result;
}

absl::Status Client::RunPart(JobRun* run, int index, LineRange range) {
  const Job& whole = *run->job;
  int64_t done = 0;  // lines of this part received, from its first
  for (int made = 1;; ++made) {
    if (run->Failed()) return absl::CancelledError("another part of the job failed");
    Lane* lane = GetLane((index + made - 1) % run->stripes, /*striped=*/run->stripes > 1);
    if (made > 1) {
      // A retried attempt first waits for a connection; one that finds none
      // has waited its share and is not retried again.
      if (absl::Status connected = AwaitConnection(lane, run); !connected.ok()) {
        const absl::Status final_status(
            connected.code(), absl::StrCat(connected.message(), " (after ", made, " attempts)"));
        run->Fail(final_status);
        return final_status;
      }
    }
    // This attempt's lines: the part's lines not yet received.
    const int64_t first = range.first_line + done;
    const int64_t lines = range.lines - done;
    const Job part = internal::JobOfLines(whole, run->cut, run->line_bytes, first, lines);
    const size_t part_bytes = static_cast<size_t>(lines) * run->line_bytes;
    char* part_out = run->out + static_cast<size_t>(first) * run->out_line_bytes;
    v1::JobHeader header = MakeHeader(part);
    if (!run->group_id.empty()) {
      v1::JobGroup* g = header.mutable_group();
      g->set_id(run->group_id);
      g->set_first_line(first);
      g->set_total_lines(run->cut.lines);
      g->set_parts(run->stripes);
    }
    const TransferMode mode = run->mode.value_or(ChooseTransferMode(
        static_cast<int64_t>(part_bytes + part.diagonal_bytes + part.right_diagonal_bytes),
        options_.max_unary_message_bytes, options_.chunk_bytes,
        static_cast<int64_t>(run->line_bytes)));
    if (mode == TransferMode::kStream) run->any_stream = true;
    // Progress of the part: what was received before this attempt counts as
    // sent and received.
    const int64_t kept = done * static_cast<int64_t>(run->line_bytes);
    ProgressCallback part_progress;
    if (run->progress != nullptr && *run->progress) {
      part_progress = [run, index, kept](int64_t sent, int64_t received, int64_t) {
        run->Progress(index, kept + sent, kept + received);
      };
    }
    Attempt attempt =
        mode == TransferMode::kUnary
            ? UnaryAttempt(lane, run, header, part, part_bytes, part_out, part_progress)
            : StreamAttempt(lane, run, header, part, part_bytes, part_out, part_progress);
    run->attempts[static_cast<size_t>(index)] = made;
    run->received_bytes += attempt.result_bytes;
    if (attempt.result.ok()) {
      run->stats[static_cast<size_t>(index)] = std::move(attempt.result->stats);
      return absl::OkStatus();
    }
    done += attempt.lines_received;
    if (done == range.lines) {
      // Every line arrived and only the final stats were lost: the part is
      // complete (a retry would have nothing to send).
      v1::JobStats& stats = run->stats[static_cast<size_t>(index)];
      *stats.mutable_group() = header.group();
      return absl::OkStatus();
    }
    if (run->Failed()) return attempt.result.status();
    std::optional<absl::Duration> wait;
    if (attempt.retryable) {
      wait = RetryDelay(options_.retry, made, attempt.result.status().code(), attempt.origin,
                        attempt.pushback, absl::Now(), run->deadline, RandomJitter());
    }
    if (!wait.has_value()) {
      const absl::Status& failure = attempt.result.status();
      const absl::Status final_status = WithPushback(
          made == 1 ? failure
                    : absl::Status(failure.code(), absl::StrCat(failure.message(), " (after ",
                                                                made, " attempts)")),
          attempt.pushback);
      run->Fail(final_status);
      return final_status;
    }
    if (attempt.lines_received > 0) run->resumed++;
    if (!run->Sleep(*wait)) return absl::CancelledError("another part of the job failed");
  }
}

Client::Attempt Client::UnaryAttempt(Lane* lane, JobRun* run, const v1::JobHeader& header,
                                     const Job& job, size_t matrix_bytes, void* out,
                                     const ProgressCallback& progress) {
  Attempt attempt;
  JobResult result;
  result.mode = TransferMode::kUnary;
  // C's bytes of these lines.
  const size_t out_bytes = matrix_bytes / run->line_bytes * run->out_line_bytes;
  absl::Status outcome;
  // Declared first so that it outlives the context and buffers holding its slices.
  wire::SliceLoans loans;
  {
    grpc::ByteBuffer request =
        wire::EncodeMultiplyRequest(header, job.matrix.data, matrix_bytes, &loans);
    grpc::ByteBuffer response;
    // One call of `method`, on a context of its own (a context serves one
    // call); a failure's origin and pushback go into the attempt.
    const auto call = [&](const std::string& method) {
      grpc::ClientContext context;
      // Fail-fast, retried attempts too: a retried one has already waited for
      // its connection (AwaitConnection, bounded by max_reconnect_wait), and a
      // connection lost since then must end it now, not hold it until the
      // deadline (calls sent into a server's drain used to wait their 60 s).
      PrepareContext(&context, run->deadline);
      internal::AddTraceMetadata(&context, run->job->traceparent, run->job->tracestate);
      run->Register(&context);
      grpc::Status s =
          UnaryCallOnThisThread(lane->stub.get(), &context, method, request, &response);
      run->Unregister(&context);
      if (!s.ok()) {
        attempt.origin = FailureOriginOf(context);
        attempt.pushback = RetryPushback(context);
      }
      return s;
    };
    const bool small = request.Length() <= kMaxSmallMessageBytes &&
                       !no_multiply_small_.load(std::memory_order_relaxed);
    grpc::Status status = call(small ? MultiplySmallMethod() : MultiplyMethod());
    if (small && status.error_code() == grpc::StatusCode::UNIMPLEMENTED) {
      // A server without MultiplySmall (no dgmm job is UNIMPLEMENTED):
      // Multiply, now and for the client's later jobs.
      no_multiply_small_.store(true, std::memory_order_relaxed);
      response.Clear();
      status = call(MultiplyMethod());
    }
    request.Clear();
    if (status.ok()) {
      outcome = wire::DecodeMultiplyResponse(&response, out, out_bytes, &result.stats);
      // A response that does not decode came from a server that works: final.
      attempt.retryable = false;
      if (outcome.ok()) attempt.result_bytes = static_cast<int64_t>(out_bytes);
    } else {
      outcome = FromGrpcStatus(status);
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

Client::Attempt Client::StreamAttempt(Lane* lane, JobRun* run, const v1::JobHeader& header,
                                      const Job& job, size_t matrix_bytes, void* out,
                                      const ProgressCallback& progress) {
  Attempt attempt;
  StreamPlan plan = PlanStream(job.matrix, matrix_bytes, options_.chunk_bytes);
  plan.out_line_bytes = run->out_line_bytes;
  absl::StatusOr<v1::JobStats> stats;
  // Declared first so that it outlives the context and buffers holding its slices.
  wire::SliceLoans loans;
  {
    grpc::ClientContext context;
    // Fail-fast, retried attempts too: a retried one has already waited for
    // its connection (AwaitConnection, bounded by max_reconnect_wait), and a
    // connection lost since then must end it now, not hold it until the
    // deadline (calls sent into a server's drain used to wait their 60 s).
    PrepareContext(&context, run->deadline);
    internal::AddTraceMetadata(&context, run->job->traceparent, run->job->tracestate);
    StreamCall call(header, static_cast<const char*>(job.matrix.data), static_cast<char*>(out),
                    plan, progress, &loans);
    run->Register(&context);
    stats = call.Run(lane->stub.get(), &context);
    run->Unregister(&context);
    // The lines received are kept: a retry resumes after them.
    attempt.lines_received = call.LinesReceived();
    attempt.result_bytes = call.BytesReceived();
    if (!stats.ok()) {
      attempt.origin = FailureOriginOf(context);
      attempt.pushback = RetryPushback(context);
      // The client's own verdict on a server that broke the protocol: final.
      if (call.BrokeProtocol()) attempt.retryable = false;
    }
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


absl::StatusOr<v1::GetServerInfoResponse> Client::InfoOn(Lane* lane) {
  if (!options_status_.ok()) return options_status_;
  grpc::ClientContext context;
  PrepareContext(&context, Deadline());
  v1::GetServerInfoResponse response;
  grpc::Status status = v1::Dgmm::NewStub(lane->channel)
                            ->GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<v1::GetServerInfoResponse> Client::GetServerInfo(absl::Time deadline) {
  if (!options_status_.ok()) return options_status_;
  grpc::ClientContext context;
  PrepareContext(&context, std::min(Deadline(), deadline));
  v1::GetServerInfoResponse response;
  grpc::Status status = stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<HealthState> Client::Health(const std::string& service, absl::Time deadline) {
  if (!options_status_.ok()) return options_status_;
  grpc::ClientContext context;
  PrepareContext(&context, std::min(Deadline(), deadline));
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status =
      grpc::health::v1::Health::NewStub(channel_)->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status();
}

absl::StatusOr<BatchResult> Client::MultiplyBatch(const std::vector<BatchItem>& items,
                                                  CancelToken* cancel,
                                                  const std::string& caller_traceparent,
                                                  const std::string& tracestate) {
  if (!options_status_.ok()) return options_status_;
  std::string traceparent = caller_traceparent;
  if (absl::Status ok = internal::ResolveTrace(&traceparent, tracestate, "MultiplyBatch");
      !ok.ok()) {
    return ok;
  }
  BatchResult result;
  result.traceparent = traceparent;
  result.jobs.assign(items.size(), absl::InternalError("not run"));
  // The items the client can send (the server judges the rest of each job).
  std::vector<size_t> sent;
  std::vector<v1::JobHeader> headers;
  std::vector<wire::BatchRequestJob> jobs;
  sent.reserve(items.size());
  headers.reserve(items.size());
  jobs.reserve(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& item = items[i];
    absl::StatusOr<size_t> bytes = CheckBuffers(item.job, item.out, item.out_bytes);
    if (!bytes.ok()) {
      result.jobs[i] = bytes.status();
      continue;
    }
    sent.push_back(i);
    headers.push_back(MakeHeader(item.job));
    jobs.push_back(
        {.header = &headers.back(), .matrix = item.job.matrix.data, .matrix_bytes = *bytes});
  }
  if (jobs.empty()) {  // nothing to send: no call
    result.attempts = 0;
    return result;
  }
  JobRun run;
  if (cancel != nullptr) {
    std::lock_guard lock(cancel->mu_);
    if (cancel->cancelled_) {
      return absl::CancelledError("the batch was cancelled before it started");
    }
    cancel->on_cancel_ = [&run] { run.Fail(absl::CancelledError("the batch was cancelled")); };
  }
  absl::Cleanup detach = [cancel] {
    if (cancel == nullptr) return;
    std::lock_guard lock(cancel->mu_);
    cancel->on_cancel_ = nullptr;
  };
  run.deadline = Deadline();
  Lane* lane = GetLane(0, /*striped=*/false);
  // Each job's result goes straight to its item's `out`.
  const wire::BatchPlacer placer = [&](size_t k, size_t size) -> absl::StatusOr<void*> {
    const BatchItem& item = items[sent[k]];
    if (size != item.out_bytes) {
      return absl::InternalError(absl::StrCat("the server returned a result of ", size,
                                              " bytes; expected ", item.out_bytes));
    }
    return item.out;
  };
  for (int made = 1;; ++made) {
    if (run.Failed()) return run.first_error;
    if (made > 1) {
      if (absl::Status connected = AwaitConnection(lane, &run); !connected.ok()) {
        return absl::Status(connected.code(),
                            absl::StrCat(connected.message(), " (after ", made, " attempts)"));
      }
    }
    absl::Status outcome;
    FailureOrigin origin = FailureOrigin::kTransport;
    std::optional<absl::Duration> pushback;
    std::vector<wire::BatchResultDecoded> decoded;
    wire::SliceLoans loans;  // outlives the context and buffers holding its slices
    {
      grpc::ClientContext context;
      PrepareContext(&context, run.deadline);
      internal::AddTraceMetadata(&context, traceparent, tracestate);
      grpc::ByteBuffer request = wire::EncodeMultiplyBatchRequest(jobs, &loans);
      grpc::ByteBuffer response;
      grpc::Status status;
      run.Register(&context);
      status = UnaryCallOnThisThread(lane->stub.get(), &context, MultiplyBatchMethod(), request,
                                     &response);
      run.Unregister(&context);
      request.Clear();
      if (status.ok()) {
        outcome = wire::DecodeMultiplyBatchResponse(&response, jobs.size(), placer, &decoded);
        if (!outcome.ok()) {
          // A response that does not decode came from a server that works: final.
          return outcome;
        }
      } else {
        outcome = FromGrpcStatus(status);
        origin = FailureOriginOf(context);
        pushback = RetryPushback(context);
      }
    }
    loans.WaitUntilReturned();
    if (outcome.ok()) {
      for (size_t k = 0; k < sent.size(); ++k) {
        if (decoded[k].status.ok()) {
          result.jobs[sent[k]] = std::move(decoded[k].stats);
        } else {
          result.jobs[sent[k]] = decoded[k].status;
        }
      }
      result.attempts = made;
      return result;
    }
    if (run.Failed()) return run.first_error;
    const std::optional<absl::Duration> wait =
        RetryDelay(options_.retry, made, outcome.code(), origin, pushback, absl::Now(),
                   run.deadline, RandomJitter());
    if (!wait.has_value()) {
      return WithPushback(
          made == 1 ? outcome
                    : absl::Status(outcome.code(), absl::StrCat(outcome.message(), " (after ",
                                                                made, " attempts)")),
          pushback);
    }
    if (!run.Sleep(*wait)) return run.first_error;
  }
}

}  // namespace dgmm
