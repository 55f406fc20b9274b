#include "service/rpc/oip_service.h"

#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "inference/model_config.pb.h"
#include "proto/wire.h"
#include "service/job/unary_job.h"
#include "service/rpc/oip_model.h"
#include "service/rpc/oip_wire.h"
#include "service/rpc/wire_buffers.h"

namespace dgmm {
namespace {

constexpr UnaryJobNames kModelInferNames{
    .method = "ModelInfer",
    .too_large_advice =
        "gRPC carries at most 2 GiB in a message, and this server takes less in one request: "
        "send a job this large through dgmm's streaming API (dgmm.v1.Dgmm/MultiplyStream), "
        "which the dgmm clients (C++, Python, Node) use on their own"};

// A ModelInfer request as gRPC read it: Peek reads it (oip_wire.h), checks
// it against the model and turns it into a job (oip_model.h), leaving the
// response's head with the reactor; CopyMatrix copies A once out of gRPC's
// slices.
class OipInferRequest final : public GrpcRequest<UnaryRequest> {
 public:
  using GrpcRequest::GrpcRequest;
  void set_head(inference::ModelInferResponse* head) { head_ = head; }

  absl::Status Peek(const v1::JobHeader** header, int64_t* matrix_bytes) override {
    absl::StatusOr<oip::InferRequestView> view = oip::PeekInferRequest(message_);
    if (!view.ok()) return view.status();
    if (absl::Status s = oip::ToJob(*view, message_, &job_); !s.ok()) return s;
    if (head_ != nullptr) head_->Swap(&job_.head);
    *header = &job_.header;
    *matrix_bytes = job_.matrix_bytes;
    return absl::OkStatus();
  }
  absl::Status CopyMatrix(std::byte* dst, int64_t bytes) override {
    if (bytes != job_.matrix_bytes) {
      return absl::InternalError("the request's matrix is not the one peeked at");
    }
    return oip::CopySpans(message_, job_.matrix, dst);
  }

 private:
  inference::ModelInferResponse* head_ = nullptr;
  oip::InferJob job_;
};

// ModelInfer: Multiply's reactor with the OIP request and response.
class ModelInferReactor final : public GatedReactor<UnaryJob, UnaryIo, OipInferRequest> {
 public:
  ModelInferReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                    const JobServices& services)
      : GatedReactor(context, policy, services, kModelInferNames) {}

  void Reply(HostBuffer result, size_t bytes, const JobStats&) override {
    // C goes out from the buffer it was computed in.
    response_ = oip::EncodeInferResponse(head_, ToSlice(std::move(result), bytes));
    SendResponse();
  }

 private:
  std::unique_ptr<OipInferRequest> TakeRequest() override {
    auto request = std::make_unique<OipInferRequest>(&request_);
    request->set_head(&head_);  // filled by Peek, before the job is admitted
    return request;
  }

  inference::ModelInferResponse head_;
};

// A unary control call answered at once with what `serve` returns; with
// `open`, no token is asked for (ServerLive, ServerReady: probes).
class ControlReply final : public InlineUnaryReactor {
 public:
  ControlReply(grpc::CallbackServerContext* context, CallPolicy* policy, bool open,
               const std::function<absl::Status()>& serve)
      : call_(context, policy) {
    Finish(call_.Status(open || call_.auth().ok() ? serve() : call_.auth()));
  }
  void OnDone() override { delete this; }

 private:
  CallContext call_;
};

// A unary call taken by the generic service as a stream of one message
// (ModelConfig): reads it, answers with what `serve` returns.
class OneMessageReply final : public StreamReactorBase {
 public:
  using Serve = std::function<absl::Status(const grpc::ByteBuffer&, grpc::ByteBuffer*)>;
  OneMessageReply(grpc::CallbackServerContext* context, CallPolicy* policy, Serve serve)
      : call_(context, policy), serve_(std::move(serve)) {
    if (!call_.auth().ok()) {
      Finish(call_.Status(call_.auth()));
      return;
    }
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    absl::Status s = ok ? serve_(request_, &response_)
                        : absl::InvalidArgumentError("the call ended without its request message");
    if (!s.ok()) {
      Finish(call_.Status(s));
      return;
    }
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void OnDone() override { delete this; }

 private:
  CallContext call_;
  Serve serve_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
};

// Parses a small request of `method` into *message.
absl::Status ParseControl(const grpc::ByteBuffer& request, absl::string_view method,
                          google::protobuf::MessageLite* message) {
  if (absl::Status s = CheckRequestSize(request, kMaxControlRequestBytes, method); !s.ok()) {
    return s;
  }
  if (!wire::ParseMessage(request, message)) {
    return absl::InvalidArgumentError(absl::StrCat(method, " request does not parse as an ",
                                                   message->GetTypeName()));
  }
  return absl::OkStatus();
}

// The name and version of a ModelReady, ModelMetadata or ModelConfig request.
template <typename Request>
absl::StatusOr<Request> ParseModelRequest(const grpc::ByteBuffer& request,
                                          absl::string_view method) {
  Request parsed;
  if (absl::Status s = ParseControl(request, method, &parsed); !s.ok()) return s;
  return parsed;
}

}  // namespace

OipService::OipService(DgmmService* dgmm, DgmmGenericService* generic)
    : policy_(dgmm->policy()), services_(dgmm->services()) {
  generic->Route(kModelInferMethod, [this](grpc::CallbackServerContext* context) {
    return NewGatedReactor<ModelInferReactor>(context, policy_, services_);
  });
  generic->Route(kModelConfigMethod, [this](grpc::CallbackServerContext* context) {
    return new OneMessageReply(
        context, policy_, [](const grpc::ByteBuffer& request, grpc::ByteBuffer* response) {
          auto parsed = ParseModelRequest<inference::ModelConfigRequest>(request, "ModelConfig");
          if (!parsed.ok()) return parsed.status();
          if (absl::Status s = oip::FindModel(parsed->name(), parsed->version()); !s.ok()) {
            return s;
          }
          *response = wire::EncodeMessage(oip::Config());
          return absl::OkStatus();
        });
  });
}

bool OipService::ready() const {
  return services_.engine->serving() && !services_.engine->draining();
}

grpc::ServerUnaryReactor* OipService::ServerLive(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return new ControlReply(context, policy_, /*open=*/true, [&]() -> absl::Status {
    inference::ServerLiveRequest parsed;
    if (absl::Status s = ParseControl(*request, "ServerLive", &parsed); !s.ok()) return s;
    inference::ServerLiveResponse live;
    live.set_live(true);  // it answers
    *response = wire::EncodeMessage(live);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OipService::ServerReady(grpc::CallbackServerContext* context,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  return new ControlReply(context, policy_, /*open=*/true, [&]() -> absl::Status {
    inference::ServerReadyRequest parsed;
    if (absl::Status s = ParseControl(*request, "ServerReady", &parsed); !s.ok()) return s;
    inference::ServerReadyResponse ready;
    ready.set_ready(this->ready());
    *response = wire::EncodeMessage(ready);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OipService::ModelReady(grpc::CallbackServerContext* context,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  return new ControlReply(context, policy_, /*open=*/false, [&]() -> absl::Status {
    auto parsed = ParseModelRequest<inference::ModelReadyRequest>(*request, "ModelReady");
    if (!parsed.ok()) return parsed.status();
    // An unknown model is not ready (as Triton answers), not an error.
    inference::ModelReadyResponse ready;
    ready.set_ready(oip::FindModel(parsed->name(), parsed->version()).ok() && this->ready());
    *response = wire::EncodeMessage(ready);
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OipService::ServerMetadata(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return new ControlReply(context, policy_, /*open=*/false, [&]() -> absl::Status {
    inference::ServerMetadataRequest parsed;
    if (absl::Status s = ParseControl(*request, "ServerMetadata", &parsed); !s.ok()) return s;
    inference::ServerMetadataResponse metadata;
    metadata.set_name("dgmm");
    metadata.set_version(DGMM_VERSION);
    *response = wire::EncodeMessage(metadata);  // no protocol extensions
    return absl::OkStatus();
  });
}

grpc::ServerUnaryReactor* OipService::ModelMetadata(grpc::CallbackServerContext* context,
                                                    const grpc::ByteBuffer* request,
                                                    grpc::ByteBuffer* response) {
  return new ControlReply(context, policy_, /*open=*/false, [&]() -> absl::Status {
    auto parsed = ParseModelRequest<inference::ModelMetadataRequest>(*request, "ModelMetadata");
    if (!parsed.ok()) return parsed.status();
    if (absl::Status s = oip::FindModel(parsed->name(), parsed->version()); !s.ok()) return s;
    *response = wire::EncodeMessage(oip::Metadata());
    return absl::OkStatus();
  });
}

}  // namespace dgmm
