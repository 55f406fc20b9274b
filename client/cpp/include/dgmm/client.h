// dgmm::Client: the C++ client of the dgmm service (proto/dgmm/v1/dgmm.proto).
//
// A Client sends a job -- a dense matrix A, a diagonal d and a side -- and
// receives C = A·diag(d) (SIDE_RIGHT) or C = diag(d)·A (SIDE_LEFT) into a
// buffer the caller owns. Small jobs travel in one `Multiply` message; large
// ones are streamed in blocks of whole lines over `MultiplyStream`, with
// sending and receiving overlapped. The matrix is read straight from the
// caller's memory (no intermediate copy of the whole matrix) and result blocks
// are written straight into the caller's output buffer.
//
// Errors: every method returns an absl::Status whose code is the gRPC status
// code of the call (see the status table in dgmm.proto) and whose message is
// the server's. Problems the client detects itself (a buffer of the wrong
// size, a server that breaks the protocol) are INVALID_ARGUMENT and INTERNAL.
//
// Thread safety: a Client is thread-safe; concurrent calls share one channel.
#ifndef DGMM_CLIENT_CPP_INCLUDE_DGMM_CLIENT_H_
#define DGMM_CLIENT_CPP_INCLUDE_DGMM_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "dgmm/v1/dgmm.grpc.pb.h"
#include "dgmm/v1/dgmm.pb.h"
#include "grpc/health/v1/health.pb.h"

namespace dgmm {

// Bytes per element of `dtype`: 4 for float32, 8 for float64, 0 otherwise.
size_t ElementSize(v1::DType dtype);

// Called as a job's payload moves: matrix bytes sent so far, result bytes
// received so far, and the matrix size (each of the first two ends at it).
// May be called from gRPC threads; calls for one job never overlap.
using ProgressCallback =
    std::function<void(int64_t bytes_sent, int64_t bytes_received, int64_t total_bytes)>;

struct ClientOptions {
  // Per-call deadline; InfiniteDuration means none.
  absl::Duration deadline = absl::InfiniteDuration();
  // Largest Multiply request this client sends in one message. Match it to
  // the server's --max_unary_message_bytes (GetServerInfo.limits).
  int64_t max_unary_message_bytes = int64_t{64} << 20;
  // Largest block payload sent over MultiplyStream (whole lines are sent, so
  // a block holds max(1, chunk_bytes / line_bytes) lines). Must not exceed
  // the server's max_block_bytes.
  int64_t chunk_bytes = int64_t{4} << 20;
  // Multiply() streams when matrix plus diagonal exceed this many bytes. A
  // negative value means the smaller of chunk_bytes and 7/8 of
  // max_unary_message_bytes (room for the header and framing): a job that
  // fits one block goes in one message, and larger ones stream, because
  // streaming overlaps upload, compute and download (over loopback it beats
  // a single message from about 4 MiB up: 14.5 vs 17.3 ms at 4 MiB, 71 vs
  // 108 ms at 32 MiB).
  int64_t streaming_threshold_bytes = -1;
  // Channel credentials; null means insecure (plaintext) transport.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // gRPC load-balancing policy, e.g. "round_robin" for a DNS name that
  // resolves to several replicas; empty keeps gRPC's default (pick_first).
  std::string load_balancing_policy;
};

// The matrix A, read-only, in the caller's memory. `data` must hold
// rows*cols elements of `dtype` in `layout` order (little-endian).
struct MatrixView {
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  v1::Layout layout = v1::LAYOUT_ROW_MAJOR;
};

// Size in bytes of `matrix`'s payload; INVALID_ARGUMENT for a non-positive
// dimension, an unknown dtype or a size that overflows.
absl::StatusOr<size_t> MatrixBytes(const MatrixView& matrix);

// One multiplication. The diagonal has cols elements of the matrix's dtype
// for SIDE_RIGHT and rows for SIDE_LEFT (the server checks its length).
struct Job {
  MatrixView matrix;
  const void* diagonal = nullptr;
  size_t diagonal_bytes = 0;
  v1::Side side = v1::SIDE_RIGHT;
  v1::Backend backend = v1::BACKEND_AUTO;
};

using HealthState = grpc::health::v1::HealthCheckResponse::ServingStatus;

enum class TransferMode { kUnary, kStream };

// "unary" or "stream".
const char* TransferModeName(TransferMode mode);

struct JobResult {
  // Where and how long the job ran, as the server measured it.
  v1::JobStats stats;
  // Which RPC carried the job.
  TransferMode mode = TransferMode::kUnary;
};

class Client {
 public:
  // Connects (lazily) to `target`, e.g. "127.0.0.1:50051" or
  // "dns:///dgmm.svc:50051".
  explicit Client(const std::string& target, ClientOptions options = {});
  // Uses an existing channel; options' credentials and load-balancing policy
  // are ignored (they belong to the channel).
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Runs `job` and writes C into out[0, out_bytes), which must be exactly the
  // matrix's size; C has A's shape, dtype and layout. Uses Multiply when the
  // job is at most the streaming threshold (see ClientOptions), else
  // MultiplyStream.
  // On error the contents of `out` are unspecified.
  absl::StatusOr<JobResult> Multiply(const Job& job, void* out, size_t out_bytes,
                                     const ProgressCallback& progress = nullptr);

  // Runs `job` in one Multiply message, whatever its size.
  absl::StatusOr<JobResult> MultiplyUnary(const Job& job, void* out, size_t out_bytes,
                                          const ProgressCallback& progress = nullptr);

  // Runs `job` over MultiplyStream, whatever its size: header, then blocks of
  // whole lines (rows of a row-major matrix, columns of a column-major one)
  // of at most chunk_bytes, while result blocks are placed into `out` as
  // they arrive.
  absl::StatusOr<JobResult> MultiplyStream(const Job& job, void* out, size_t out_bytes,
                                           const ProgressCallback& progress = nullptr);

  // The server's version, devices, budgets, queue and limits.
  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo();

  // Standard grpc.health.v1 Check of `service` ("" is the whole server):
  // SERVING, NOT_SERVING, ... An RPC failure is an error: UNAVAILABLE when
  // nothing listens, NOT_FOUND for a service the server does not know.
  absl::StatusOr<HealthState> Health(const std::string& service = "");

  const ClientOptions& options() const { return options_; }

 private:
  // Applies the deadline option to a fresh context.
  void PrepareContext(grpc::ClientContext* context) const;

  ClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Dgmm::Stub> stub_;
  // For Multiply/MultiplyStream, whose payloads are sent from the caller's
  // memory and received into it without proto copies (see wire.h).
  grpc::GenericStub generic_stub_;
};

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_INCLUDE_DGMM_CLIENT_H_
