// Zero-copy encoders and decoders of dgmm.proto's Multiply and
// MultiplyStream messages, for both ends of the wire:
//
// - client side (dgmm::Client): EncodeMultiplyRequest, EncodeStreamHeader and
//   EncodeStreamBlock build a request as a small encoded prefix plus a slice
//   that borrows the caller's bytes (SliceLoans); DecodeMultiplyResponse and
//   DecodeStreamResponse read a result's payload straight from gRPC's
//   buffers into its place in the caller's output;
// - server side (service/handlers.cc): PeekMultiplyRequest,
//   CopyMultiplyMatrix and DecodeStreamRequest read a request's header and
//   copy its payload once out of gRPC's buffers into memory the server
//   chooses; EncodeMultiplyResponse and EncodeStreamBlock(first_line, Slice)
//   send a result from a slice that owns its buffer.
//
// The generated classes would copy each payload into a proto string and again
// into a serialization buffer. The field numbers used are those of
// proto/dgmm/v1/dgmm.proto; tests check these encoders and decoders against
// the generated classes. Part of dgmm_proto, which both link.
#ifndef DGMM_PROTO_WIRE_H_
#define DGMM_PROTO_WIRE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "dgmm/v1/dgmm.pb.h"

namespace google::protobuf::io {
class CodedInputStream;
}  // namespace google::protobuf::io
namespace grpc {
class ProtoBufferReader;
}  // namespace grpc

namespace dgmm::wire {

// Slices that borrow caller memory for gRPC. gRPC may hold a slice until
// after the call ends; the memory must stay valid until gRPC returns every
// slice, so the owner of the memory waits for that before it gives the memory
// back (WaitUntilReturned, also run by the destructor).
class SliceLoans {
 public:
  SliceLoans() = default;
  SliceLoans(const SliceLoans&) = delete;
  SliceLoans& operator=(const SliceLoans&) = delete;
  ~SliceLoans() { WaitUntilReturned(); }

  // A slice over [data, data+size) that gRPC returns to this object.
  grpc::Slice Lend(const void* data, size_t size);
  // Blocks until gRPC has released every slice lent so far.
  void WaitUntilReturned();

 private:
  static void Return(void* self);

  absl::Mutex mu_;
  int64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;
};

// MultiplyRequest{header, matrix=[matrix, matrix+matrix_bytes)}; the matrix
// bytes are borrowed from `loans`, or, up to 16 KiB, copied into the
// message's one slice (a loan costs more than such a copy).
grpc::ByteBuffer EncodeMultiplyRequest(const v1::JobHeader& header, const void* matrix,
                                       size_t matrix_bytes, SliceLoans* loans);

// MultiplyStreamRequest{header}.
grpc::ByteBuffer EncodeStreamHeader(const v1::JobHeader& header);

// MultiplyStreamRequest{block{first_line, data=[data, data+size)}}, with the
// data borrowed from `loans`.
grpc::ByteBuffer EncodeStreamBlock(int64_t first_line, const void* data, size_t size,
                                   SliceLoans* loans);

// MultiplyStreamRequest or MultiplyStreamResponse (`block` is field 2 of
// both) {block{first_line, data}}: a small encoded prefix, then `data` as is
// (a slice that owns or borrows the payload; nothing is copied).
grpc::ByteBuffer EncodeStreamBlock(int64_t first_line, grpc::Slice data);

// Any message serialized into one slice: for the small ones (headers,
// acceptances, stats).
grpc::ByteBuffer EncodeMessage(const google::protobuf::MessageLite& message);

// Parses a whole small message (a GetServerInfoRequest). False when the bytes
// do not parse as `message`'s type.
bool ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message);

// Decodes a MultiplyResponse: its `result` must be exactly out_bytes long and
// is copied into `out`; its stats into *stats. INTERNAL on a malformed
// message or a result of the wrong size.
absl::Status DecodeMultiplyResponse(grpc::ByteBuffer* buffer, void* out, size_t out_bytes,
                                    v1::JobStats* stats);

// Given a result block's first line and payload size, returns where its
// payload goes, or an error if the block does not belong anywhere.
using BlockPlacer = std::function<absl::StatusOr<void*>(int64_t first_line, size_t size)>;

// One decoded MultiplyStreamResponse. For a block, its payload has already
// been copied to the place `placer` chose; first_line and size describe it.
struct StreamResponse {
  enum class Kind { kAccepted, kBlock, kStats };
  Kind kind = Kind::kAccepted;
  v1::StreamAccepted accepted;
  v1::JobStats stats;
  int64_t first_line = 0;
  size_t size = 0;
};

// Decodes a MultiplyStreamResponse, placing a block's payload with `placer`.
// INTERNAL on a malformed message or an empty oneof; the placer's error as is.
absl::StatusOr<StreamResponse> DecodeStreamResponse(grpc::ByteBuffer* buffer,
                                                    const BlockPlacer& placer);

// One decoded MultiplyStreamRequest. For a block, its payload has already
// been copied to the place `placer` chose; first_line and size describe it.
struct StreamRequest {
  enum class Kind { kHeader, kBlock };
  Kind kind = Kind::kHeader;
  v1::JobHeader header;
  int64_t first_line = 0;
  size_t size = 0;
};

// Decodes a MultiplyStreamRequest on the server, placing a block's payload
// with `placer`: called once per block, before any payload byte is copied (so
// a block the placer refuses costs no copy), with the block's size and the
// first_line seen so far. The placement must not depend on first_line, which
// a (non-canonical) encoder may put after the data: the line to use is the
// returned one. The payload is copied once, from gRPC's buffers. INVALID_ARGUMENT on a malformed message,
// a message with neither or both of header and block, or a second block in
// one message; the placer's error as is.
absl::StatusOr<StreamRequest> DecodeStreamRequest(grpc::ByteBuffer* buffer,
                                                  const BlockPlacer& placer);

// A MultiplyRequest as the server first reads it: the header, and where the
// matrix is, without copying it.
struct MultiplyRequestView {
  v1::JobHeader header;
  bool has_matrix = false;
  size_t matrix_bytes = 0;
};

// Reads a MultiplyRequest's header and the matrix's size, skipping the
// matrix bytes (nothing is copied). INVALID_ARGUMENT on a malformed message
// or a matrix field given twice.
absl::StatusOr<MultiplyRequestView> PeekMultiplyRequest(const grpc::ByteBuffer& buffer);

// Copies the matrix of a MultiplyRequest that PeekMultiplyRequest accepted
// into [out, out + view.matrix_bytes): the one copy out of gRPC's buffers.
absl::Status CopyMultiplyMatrix(const grpc::ByteBuffer& buffer, void* out, size_t bytes);

// MultiplyResponse{result, stats}: a small prefix, `result` as is (a slice
// that owns or borrows the payload; nothing is copied), then the stats. A
// result of up to 16 KiB is copied into one slice with the rest (and its
// own slice released at once).
grpc::ByteBuffer EncodeMultiplyResponse(grpc::Slice result, const v1::JobStats& stats);

// ------------------------------------------------------------ MultiplyBatch

// One job of a MultiplyBatchRequest as the server first reads it.
struct BatchJobView {
  // OK, or why this job's MultiplyRequest does not decode (INVALID_ARGUMENT
  // in PeekMultiplyRequest's words): that job fails, the others do not.
  absl::Status decoded;
  MultiplyRequestView request;
  // Bytes of the job's MultiplyRequest, and where its matrix starts in the
  // batch message (BatchMatrixReader::Copy).
  size_t message_bytes = 0;
  size_t matrix_offset = 0;
};

// Reads a MultiplyBatchRequest's jobs, each one's header and matrix size and
// place, skipping the matrices (nothing is copied). Reads at most `max_jobs`
// jobs; *total_jobs counts every one. INVALID_ARGUMENT only when the batch's
// own framing is broken (a job whose length runs past the message).
absl::StatusOr<std::vector<BatchJobView>> PeekMultiplyBatchRequest(const grpc::ByteBuffer& message,
                                                                   size_t max_jobs,
                                                                   size_t* total_jobs);

// Copies the batch's matrices out of gRPC's buffers, one after another: the
// offsets of successive calls must not decrease (one pass over the message).
class BatchMatrixReader {
 public:
  explicit BatchMatrixReader(const grpc::ByteBuffer& message);
  ~BatchMatrixReader();
  absl::Status Copy(size_t offset, void* out, size_t bytes);

 private:
  grpc::ByteBuffer buffer_;  // shares the message's slices
  std::unique_ptr<grpc::ProtoBufferReader> reader_;
  std::unique_ptr<google::protobuf::io::CodedInputStream> in_;
};

// One job's outcome for EncodeMultiplyBatchResponse: a google.rpc code and
// message; when OK (`has_result`), `bytes` of result at `offset` of the
// results' slice, and the stats.
struct BatchResultView {
  int code = 0;
  absl::string_view message;
  const v1::JobStats* stats = nullptr;
  bool has_result = false;
  size_t offset = 0;
  size_t bytes = 0;
};

// MultiplyBatchResponse{results}: small results are copied into the
// framing; larger ones (over 16 KiB) go out as sub-slices of `data`, which
// holds every result (nothing copied; the slices keep it alive).
grpc::ByteBuffer EncodeMultiplyBatchResponse(const std::vector<BatchResultView>& results,
                                             const grpc::Slice& data);

// One job of a batch the client sends: the matrix is borrowed from `loans`
// (small ones are copied into the framing).
struct BatchRequestJob {
  const v1::JobHeader* header = nullptr;
  const void* matrix = nullptr;
  size_t matrix_bytes = 0;
};
grpc::ByteBuffer EncodeMultiplyBatchRequest(const std::vector<BatchRequestJob>& jobs,
                                            SliceLoans* loans);

// One job's outcome as the client decodes it: the server's status for the
// job (or the placer's error), its stats, and whether a result was placed.
struct BatchResultDecoded {
  absl::Status status;
  v1::JobStats stats;
  bool has_result = false;
};
// Where job `job`'s result of `size` bytes goes, or why it cannot.
using BatchPlacer = std::function<absl::StatusOr<void*>(size_t job, size_t size)>;
// Decodes a MultiplyBatchResponse of `jobs` results, placing each result with
// `placer`. INTERNAL on a malformed message or a count other than `jobs`.
absl::Status DecodeMultiplyBatchResponse(grpc::ByteBuffer* buffer, size_t jobs,
                                         const BatchPlacer& placer,
                                         std::vector<BatchResultDecoded>* results);

// A measuring aid for transport A/B runs (bench/wire_ab.sh), not a
// supported setting: the environment variable DGMM_GRPC_ARGS, a comma-
// separated list of integer gRPC channel arguments ("grpc.http2.
// max_frame_size=16777215,grpc.http2.bdp_probe=0"), which dgmm-server and
// dgmm::Client add to the ones they set. Entries that do not parse are
// skipped. Empty when the variable is unset.
std::vector<std::pair<std::string, int>> ExtraChannelArgs();

}  // namespace dgmm::wire

#endif  // DGMM_PROTO_WIRE_H_
