// One MultiplyStream call, driven by gRPC's callback API: one write and one
// read in flight at a time, so sending blocks of A overlaps receiving blocks
// of C. Used by Client::MultiplyStream; not part of the public API.
#ifndef DGMM_CLIENT_CPP_SRC_STREAM_CALL_H_
#define DGMM_CLIENT_CPP_SRC_STREAM_CALL_H_

#include <grpcpp/client_context.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/client_callback.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>

#include "absl/status/statusor.h"
#include "dgmm/client.h"
#include "proto/wire.h"

namespace dgmm {

// The geometry of a streamed job: the matrix as `lines` lines of
// `line_bytes` each (rows for row-major, columns for column-major), sent
// `lines_per_block` at a time.
struct StreamPlan {
  int64_t lines = 0;
  size_t line_bytes = 0;
  int64_t lines_per_block = 0;
  // A line of the result C (more than line_bytes when C's dtype is wider
  // than A's); 0: line_bytes.
  size_t out_line_bytes = 0;
  size_t result_line_bytes() const { return out_line_bytes != 0 ? out_line_bytes : line_bytes; }
};

// Lines per block for a chunk of `chunk_bytes`: as many whole lines as fit,
// at least one.
StreamPlan PlanStream(const MatrixView& matrix, size_t matrix_bytes, int64_t chunk_bytes);

class StreamCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `matrix` and `out` must stay valid until Run returns and `loans` has got
  // every slice back; `loans` must outlive the context passed to Run.
  StreamCall(const v1::JobHeader& header, const char* matrix, char* out, StreamPlan plan,
             ProgressCallback progress, wire::SliceLoans* loans);

  // Starts the call on `stub` with `context` and blocks until it ends.
  // Returns the job's stats, or the call's (or a protocol) error.
  absl::StatusOr<v1::JobStats> Run(grpc::GenericStub* stub, grpc::ClientContext* context);

  // After Run: how many lines of the result arrived, from the first (each
  // written to `out`); a resumed job starts after them.
  int64_t LinesReceived() const { return next_line_to_receive_; }
  // After Run: result payload bytes that arrived, counted per block.
  int64_t BytesReceived() const { return bytes_received_.load(std::memory_order_relaxed); }
  // After Run: true when Run's error is the client's own verdict that the
  // server broke the MultiplyStream protocol (INTERNAL, not to be retried).
  bool BrokeProtocol() const { return broke_protocol_; }

  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  // Starts writing the next block, or half-closes after the last.
  void WriteNextBlock();
  // Decodes read_buffer_ and places a result block into out_.
  absl::Status HandleResponse();
  // Where a result block goes, after checking it is the next one expected.
  absl::StatusOr<void*> PlaceBlock(int64_t first_line, size_t size);
  void ReportProgress();
  // The outcome once the call has ended.
  absl::StatusOr<v1::JobStats> Outcome();

  const v1::JobHeader& header_;
  const char* const matrix_;
  char* const out_;
  const StreamPlan plan_;
  const ProgressCallback progress_;
  wire::SliceLoans* const loans_;
  grpc::ClientContext* context_ = nullptr;

  // Writer side (OnWriteDone runs one at a time).
  grpc::ByteBuffer write_buffer_;
  int64_t next_line_to_send_ = 0;
  size_t pending_write_bytes_ = 0;

  // Reader side (OnReadDone runs one at a time).
  grpc::ByteBuffer read_buffer_;
  bool accepted_ = false;
  int64_t next_line_to_receive_ = 0;
  std::optional<v1::JobStats> stats_;
  absl::Status protocol_error_;
  bool broke_protocol_ = false;  // set by Outcome

  std::atomic<int64_t> bytes_sent_{0};
  std::atomic<int64_t> bytes_received_{0};
  // std::mutex rather than absl::Mutex: the thread sanitizer sees it (and
  // so the hand-off of `out` from gRPC's threads to Run's caller).
  std::mutex progress_mu_;

  std::mutex done_mu_;
  std::condition_variable done_cv_;
  bool done_ = false;     // guarded by done_mu_
  grpc::Status status_;   // guarded by done_mu_
};

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_SRC_STREAM_CALL_H_
