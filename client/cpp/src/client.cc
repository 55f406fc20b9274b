#include "dgmm/client.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "dgmm/grpc_status.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "src/stream_call.h"
#include "src/wire.h"

namespace dgmm {
namespace {

constexpr char kMultiplyMethod[] = "/dgmm.v1.Dgmm/Multiply";

std::shared_ptr<grpc::Channel> MakeChannel(const std::string& target,
                                           const ClientOptions& options) {
  grpc::ChannelArguments args;
  // Responses are as large as the requests the server accepted; the server's
  // limits bound them, not the client's.
  args.SetMaxReceiveMessageSize(-1);
  if (!options.load_balancing_policy.empty()) {
    args.SetLoadBalancingPolicyName(options.load_balancing_policy);
  }
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      options.credentials != nullptr ? options.credentials : grpc::InsecureChannelCredentials();
  return grpc::CreateCustomChannel(target, credentials, args);
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

Client::Client(const std::string& target, ClientOptions options)
    : Client(MakeChannel(target, options), std::move(options)) {}

Client::Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options)
    : options_(std::move(options)),
      channel_(std::move(channel)),
      stub_(v1::Dgmm::NewStub(channel_)),
      generic_stub_(channel_) {}

void Client::PrepareContext(grpc::ClientContext* context) const {
  if (options_.deadline != absl::InfiniteDuration()) {
    context->set_deadline(std::chrono::system_clock::now() +
                          absl::ToChronoNanoseconds(options_.deadline));
  }
}

absl::StatusOr<JobResult> Client::Multiply(const Job& job, void* out, size_t out_bytes,
                                           const ProgressCallback& progress) {
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
  absl::StatusOr<size_t> bytes = CheckBuffers(job, out, out_bytes);
  if (!bytes.ok()) return bytes.status();
  const v1::JobHeader header = MakeHeader(job);
  JobResult result;
  result.mode = TransferMode::kUnary;
  absl::Status outcome;
  // Declared first so that it outlives the context and buffers holding its slices.
  wire::SliceLoans loans;
  {
    grpc::ClientContext context;
    PrepareContext(&context);
    grpc::ByteBuffer request = wire::EncodeMultiplyRequest(header, job.matrix.data, *bytes, &loans);
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
    outcome = status.ok() ? wire::DecodeMultiplyResponse(&response, out, out_bytes, &result.stats)
                          : FromGrpcStatus(status);
  }
  loans.WaitUntilReturned();
  if (!outcome.ok()) return outcome;
  if (progress) {
    const int64_t total = static_cast<int64_t>(*bytes);
    progress(total, total, total);
  }
  return result;
}

absl::StatusOr<JobResult> Client::MultiplyStream(const Job& job, void* out, size_t out_bytes,
                                                 const ProgressCallback& progress) {
  absl::StatusOr<size_t> bytes = CheckBuffers(job, out, out_bytes);
  if (!bytes.ok()) return bytes.status();
  const v1::JobHeader header = MakeHeader(job);
  const StreamPlan plan = PlanStream(job.matrix, *bytes, options_.chunk_bytes);
  absl::StatusOr<v1::JobStats> stats;
  // Declared first so that it outlives the context and buffers holding its slices.
  wire::SliceLoans loans;
  {
    grpc::ClientContext context;
    PrepareContext(&context);
    StreamCall call(header, static_cast<const char*>(job.matrix.data), static_cast<char*>(out),
                    plan, progress, &loans);
    stats = call.Run(&generic_stub_, &context);
  }
  loans.WaitUntilReturned();
  if (!stats.ok()) return stats.status();
  JobResult result;
  result.mode = TransferMode::kStream;
  result.stats = *std::move(stats);
  return result;
}

absl::StatusOr<v1::GetServerInfoResponse> Client::GetServerInfo() {
  grpc::ClientContext context;
  PrepareContext(&context);
  v1::GetServerInfoResponse response;
  grpc::Status status = stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

absl::StatusOr<HealthState> Client::Health(const std::string& service) {
  grpc::ClientContext context;
  PrepareContext(&context);
  grpc::health::v1::HealthCheckRequest request;
  request.set_service(service);
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status =
      grpc::health::v1::Health::NewStub(channel_)->Check(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.status();
}

}  // namespace dgmm
