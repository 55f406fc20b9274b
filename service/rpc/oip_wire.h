// The Open Inference Protocol's ModelInfer messages on the wire, read and
// written at the ByteBuffer level as proto/wire.h does for Multiply: the
// request's fields are read without copying a tensor's bytes (only where
// they lie in the message is kept), a tensor is then copied once out of
// gRPC's slices into memory the server chooses, and the response sends the
// result from a slice that owns its buffer. Field numbers are those of
// proto/inference/grpc_predict_v2.proto; tests/unit/oip_wire_test.cc checks
// both directions against the generated classes.
#ifndef DGMM_SERVICE_RPC_OIP_WIRE_H_
#define DGMM_SERVICE_RPC_OIP_WIRE_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "inference/grpc_predict_v2.pb.h"

namespace dgmm::oip {

// Bytes [offset, offset + size) of a message.
struct Span {
  size_t offset = 0;
  size_t size = 0;
};

// Which field of a tensor's InferTensorContents holds its elements.
enum class Contents {
  kNone,   // none set
  kFp32,   // fp32_contents, packed
  kFp64,   // fp64_contents, packed
  kOther,  // a field for another datatype (bool, integers, bytes), or two fields
};

struct InputView {
  std::string name;
  std::string datatype;
  std::vector<int64_t> shape;
  // The names of its parameters (the value is not kept).
  std::vector<std::string> parameters;
  Contents contents = Contents::kNone;
  // Where its typed elements lie (packed runs, in order); empty unless
  // contents is kFp32 or kFp64.
  std::vector<Span> typed;
};

struct RequestedOutputView {
  std::string name;
  std::vector<std::string> parameters;
};

// A ModelInferRequest as the server first reads it: every field, but only
// the places of the tensors' bytes.
struct InferRequestView {
  std::string model_name;
  std::string model_version;
  std::string id;
  std::vector<std::pair<std::string, inference::InferParameter>> parameters;
  std::vector<InputView> inputs;
  std::vector<RequestedOutputView> outputs;
  std::vector<Span> raw_input_contents;
};

// Reads a ModelInferRequest without copying a tensor's bytes.
// INVALID_ARGUMENT on a malformed message, or typed contents sent unpacked
// (proto3 encoders pack them; an unpacked element would cost a span each).
absl::StatusOr<InferRequestView> PeekInferRequest(const grpc::ByteBuffer& message);

// Copies `spans` of `message` (in increasing order of offset, apart) one
// after another into `out`: the one copy out of gRPC's buffers.
absl::Status CopySpans(const grpc::ByteBuffer& message, const std::vector<Span>& spans,
                       std::byte* out);

// The bytes of `spans` added up.
size_t SpanBytes(const std::vector<Span>& spans);

// ModelInferResponse: `head` (every field but raw_output_contents), then
// `raw_output` as its one raw_output_contents entry, sent as is (a slice
// that owns or borrows it; nothing is copied but a small result, which
// goes into one slice with the rest).
grpc::ByteBuffer EncodeInferResponse(const inference::ModelInferResponse& head,
                                     grpc::Slice raw_output);

}  // namespace dgmm::oip

#endif  // DGMM_SERVICE_RPC_OIP_WIRE_H_
