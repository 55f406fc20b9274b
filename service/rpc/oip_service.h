// inference.GRPCInferenceService, the Open Inference Protocol (KServe's
// predict v2, Triton's gRPC API), on dgmm's port and over dgmm's jobs: a
// ModelInfer request of the model "dgmm" (oip_model.h) becomes the same
// UnaryJob a Multiply call runs, with the same CallPolicy (token, client,
// deadline, the count Drain waits for), intake, receive gate, watchdog,
// admission, budgets, fair share and metrics as DgmmService's, whose
// services it borrows. Like Multiply, ModelInfer is left to the generic
// service and taken as a stream of one message, so that its request is read
// only once the receive gate has room, and a draining server refuses it
// unread.
//
//   ServerLive, ServerReady   open, as grpc.health.v1 is (probes); ready
//                             while the engine serves and does not drain
//   ModelReady, ServerMetadata, ModelMetadata   the token when one is set
//   ModelInfer                the job (oip_model.h), the token when one is set
//   ModelConfig               Triton's, by name through the generic service
//                             (proto/inference/model_config.proto)
//
// Triton's other calls (ModelStreamInfer, statistics, the repository and
// shared-memory extensions) are UNIMPLEMENTED.
#ifndef DGMM_SERVICE_RPC_OIP_SERVICE_H_
#define DGMM_SERVICE_RPC_OIP_SERVICE_H_

#include "grpcpp/grpcpp.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "service/rpc/dgmm_service.h"
#include "service/rpc/reactors.h"

namespace dgmm {

inline constexpr char kModelInferMethod[] = "/inference.GRPCInferenceService/ModelInfer";
inline constexpr char kModelConfigMethod[] = "/inference.GRPCInferenceService/ModelConfig";

class OipService final
    : public inference::GRPCInferenceService::WithGenericMethod_ModelInfer<
          inference::GRPCInferenceService::WithRawCallbackMethod_ServerLive<
              inference::GRPCInferenceService::WithRawCallbackMethod_ServerReady<
                  inference::GRPCInferenceService::WithRawCallbackMethod_ModelReady<
                      inference::GRPCInferenceService::WithRawCallbackMethod_ServerMetadata<
                          inference::GRPCInferenceService::WithRawCallbackMethod_ModelMetadata<
                              inference::GRPCInferenceService::Service>>>>>> {
 public:
  // Serves over `dgmm`'s jobs and policy; `dgmm` must outlive it. Routes
  // ModelInfer and ModelConfig through `generic`.
  OipService(DgmmService* dgmm, DgmmGenericService* generic);

  grpc::ServerUnaryReactor* ServerLive(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ServerReady(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelReady(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ServerMetadata(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ModelMetadata(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

 private:
  bool ready() const;

  CallPolicy* const policy_;
  const JobServices services_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_OIP_SERVICE_H_
