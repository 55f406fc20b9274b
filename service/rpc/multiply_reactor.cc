// Multiply: unary on the wire, but served as a stream of one message
// (dgmm_service.h): the reactor starts before the message is read, so the
// UnaryJob reads it only once the ReceiveGate has room, and a draining
// server refuses it unread.
//
// MultiplySmall: the same job as a plain unary call, its message read whole
// by gRPC (at most Limits::max_small_message_bytes(), checked by the
// intake): no gate to wait at, and none of the stream's extra steps (a read
// completed as an event of its own, on another of gRPC's threads).
#include <memory>

#include "proto/wire.h"
#include "service/job/unary_job.h"
#include "service/rpc/reactors.h"
#include "service/rpc/wire_buffers.h"
#include "service/rpc/wire_stats.h"

namespace dgmm {
namespace {

// The request as gRPC read it; the header is decoded without touching the
// matrix, which is copied once out of gRPC's slices.
class GrpcUnaryRequest final : public GrpcRequest<UnaryRequest> {
 public:
  using GrpcRequest::GrpcRequest;
  absl::Status Peek(const v1::JobHeader** header, int64_t* matrix_bytes) override {
    absl::StatusOr<wire::MultiplyRequestView> view = wire::PeekMultiplyRequest(message_);
    if (!view.ok()) return view.status();
    view_ = std::move(*view);
    *header = &view_.header;
    *matrix_bytes = static_cast<int64_t>(view_.matrix_bytes);
    return absl::OkStatus();
  }
  absl::Status CopyMatrix(std::byte* dst, int64_t bytes) override {
    return wire::CopyMultiplyMatrix(message_, dst, static_cast<size_t>(bytes));
  }

 private:
  wire::MultiplyRequestView view_;
};

class MultiplyReactor final : public GatedReactor<UnaryJob, UnaryIo, GrpcUnaryRequest> {
 public:
  using GatedReactor::GatedReactor;

  void Reply(HostBuffer result, size_t bytes, const JobStats& stats) override {
    // The result goes out from the buffer it was computed in.
    response_ = wire::EncodeMultiplyResponse(ToSlice(std::move(result), bytes), ToWire(stats));
    SendResponse();
  }
};

class MultiplySmallReactor final : public InlineJobReactor<UnaryJob>, public UnaryIo {
 public:
  using InlineJobReactor::InlineJobReactor;

  void Start(const JobServices& services, const grpc::ByteBuffer& request) {
    job_ = std::make_shared<UnaryJob>(std::make_shared<JobSession>(services.engine, call_.info()),
                                      services.intake, services.gate, services.timeouts, this);
    services.watchdog->Watch(job_);
    // The request's slices are shared, not copied.
    grpc::ByteBuffer message(request);
    job_->BeginRead(std::make_unique<GrpcUnaryRequest>(&message));
  }

  // UnaryIo, called under the job's lock.
  void StartRead() override {}  // BeginRead: the request came with the call
  void Reply(HostBuffer result, size_t bytes, const JobStats& stats) override {
    *response_ = wire::EncodeMultiplyResponse(ToSlice(std::move(result), bytes), ToWire(stats));
    GrpcOpScope op;
    grpc::ServerUnaryReactor::Finish(grpc::Status::OK);
  }
  void Fail(const absl::Status& status) override { FailFromJob(this, call_, status); }
  void CancelCall() override { CancelFromJob(call_); }
};

}  // namespace

const InlineJobRpc NewMultiplySmallReactor = &NewInlineJobReactor<MultiplySmallReactor>;

StreamReactorBase* NewMultiplyReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                                      const JobServices& services) {
  return NewGatedReactor<MultiplyReactor>(context, policy, services);
}

}  // namespace dgmm
