// The one model dgmm serves over the Open Inference Protocol, "dgmm": what
// a ModelInfer request means as a dgmm job, and how the model describes
// itself (ModelMetadata, ModelConfig). docs/protocol.md ("The Open
// Inference Protocol") is the contract:
//
//   inputs   A [rows, cols]; d [cols] (side "right", the default) or
//            [rows] (side "left"); side "both": l [rows] and r [cols]
//   params   side: "right" | "left" | "both" (a string parameter)
//   output   C [rows, cols], of NumPy's result type of A's and the
//            diagonal's datatypes
//   types    FP16, BF16, FP32, FP64, raw (raw_input_contents); FP32 and
//            FP64 also in the typed contents fields. OIP has no complex
//            datatype: complex jobs are refused, pointing at dgmm's API.
//
// Errors are statuses as OIP's gRPC binding has them: an unknown model or
// version NOT_FOUND, a request that does not fit the model INVALID_ARGUMENT.
#ifndef DGMM_SERVICE_RPC_OIP_MODEL_H_
#define DGMM_SERVICE_RPC_OIP_MODEL_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "dgmm/v1/dgmm.pb.h"
#include "inference/grpc_predict_v2.pb.h"
#include "inference/model_config.pb.h"
#include "service/rpc/oip_wire.h"

namespace dgmm::oip {

inline constexpr char kModelName[] = "dgmm";
inline constexpr char kModelVersion[] = "1";

// OK for the model "dgmm" with version "" or "1"; NOT_FOUND otherwise.
absl::Status FindModel(absl::string_view name, absl::string_view version);

// A ModelInfer request as a dgmm job: the header (diagonals copied in), where
// A's bytes lie in the message, and the response to send around C.
struct InferJob {
  v1::JobHeader header;
  std::vector<Span> matrix;
  int64_t matrix_bytes = 0;
  // The response but for raw_output_contents: model, version, id, and C's
  // name, datatype and shape.
  inference::ModelInferResponse head;
};

// Checks `request` (read from `message`) against the model and fills *job.
absl::Status ToJob(const InferRequestView& request, const grpc::ByteBuffer& message,
                   InferJob* job);

inference::ModelMetadataResponse Metadata();
inference::ModelConfigResponse Config();

}  // namespace dgmm::oip

#endif  // DGMM_SERVICE_RPC_OIP_MODEL_H_
