// MultiplyStream and the benchmark's Echo: one bidi reactor over a StreamJob;
// what the blocks go through (a computed job, or the echo stage) is the
// StreamStages it is given.
#include <functional>
#include <memory>

#include "proto/wire.h"
#include "service/job/stream_job.h"
#include "service/rpc/reactors.h"
#include "service/rpc/wire_buffers.h"
#include "service/rpc/wire_stats.h"

namespace dgmm {
namespace {

// A stream message as it arrived; decoded on the job's worker, its payload
// copied once out of gRPC's slices.
class GrpcStreamMessage final : public StreamMessage {
 public:
  explicit GrpcStreamMessage(grpc::ByteBuffer* message) { message_.Swap(message); }
  size_t size() const override { return message_.Length(); }
  absl::StatusOr<v1::JobHeader> DecodeHeader() override {
    absl::StatusOr<wire::StreamRequest> request = wire::DecodeStreamRequest(
        &message_, [](int64_t, size_t) -> absl::StatusOr<void*> {
          return absl::InvalidArgumentError(
              "the first message of MultiplyStream must be a header, got a block");
        });
    message_.Clear();
    if (!request.ok()) return request.status();
    return std::move(request->header);
  }
  absl::StatusOr<Decoded> Decode(const Place& place) override {
    absl::StatusOr<wire::StreamRequest> request = wire::DecodeStreamRequest(
        &message_, [&](int64_t first_line, size_t size) { return place(first_line, size); });
    message_.Clear();  // gRPC's buffers go back now
    if (!request.ok()) return request.status();
    if (request->kind == wire::StreamRequest::Kind::kHeader) {
      return absl::InvalidArgumentError(
          "a second header arrived; MultiplyStream takes exactly one header, then blocks");
    }
    return Decoded{request->first_line, request->size};
  }

 private:
  grpc::ByteBuffer message_;
};

class StreamReactor final : public StreamReactorBase, public StreamIo {
 public:
  using MakeStages = std::function<std::unique_ptr<StreamStages>(const CallInfo&)>;
  // `watchdog` null: the stream is not timed out.
  StreamReactor(grpc::CallbackServerContext* context, CallPolicy* policy, Engine* engine,
                const MakeStages& make_stages, StreamTimeouts timeouts, StreamWatchdog* watchdog)
      : call_(context, policy) {
    if (!call_.auth().ok()) {
      Finish(call_.Status(call_.auth()));
      return;
    }
    job_ = std::make_shared<StreamJob>(engine, make_stages(call_.info()), timeouts, this);
    job_->Begin();
    if (watchdog != nullptr) watchdog->Watch(job_);
  }

  void OnReadDone(bool ok) override {
    job_->OnMessage(ok ? std::make_unique<GrpcStreamMessage>(&request_) : nullptr,
                    call_.grpc()->IsCancelled());
  }
  void OnWriteDone(bool ok) override {
    block_write_.Clear();  // the result block's buffer goes back to its pool
    job_->OnWriteDone(ok);
  }
  void OnCancel() override {
    if (job_ != nullptr) job_->OnCancel();
  }
  void OnDone() override {
    if (job_ != nullptr) job_->Detach();
    delete this;
  }

  // StreamIo, called under the job's (or its pipeline's) lock.
  void StartRead() override {
    GrpcOpScope op;
    StreamReactorBase::StartRead(&request_);
  }
  void WriteAccepted(const v1::StreamAccepted& accepted) override {
    v1::MultiplyStreamResponse message;
    *message.mutable_accepted() = accepted;
    control_write_ = wire::EncodeMessage(message);
    GrpcOpScope op;
    StartWrite(&control_write_);
  }
  void WriteBlock(OutBlock block) override {
    // The result goes out from the buffer it was computed in; the buffer
    // returns to its pool when gRPC has sent it.
    block_write_ =
        wire::EncodeStreamBlock(block.first_line, ToSlice(std::move(block.buffer), block.bytes));
    GrpcOpScope op;
    StartWrite(&block_write_);
  }
  void Finish(const absl::Status& status, const JobStats& stats) override {
    GrpcOpScope op;
    if (!status.ok()) {
      StreamReactorBase::Finish(call_.Status(status));
      return;
    }
    v1::MultiplyStreamResponse message;
    *message.mutable_stats() = ToWire(stats);
    control_write_ = wire::EncodeMessage(message);
    StartWriteAndFinish(&control_write_, grpc::WriteOptions(), grpc::Status::OK);
  }
  void CancelCall() override { CancelFromJob(call_); }

 private:
  using StreamReactorBase::Finish;

  CallContext call_;
  grpc::ByteBuffer request_;        // owned by the one read in flight
  grpc::ByteBuffer control_write_;  // the acceptance, then the stats
  grpc::ByteBuffer block_write_;    // owned by the one block write in flight
  std::shared_ptr<StreamJob> job_;  // null when refused at once
};

}  // namespace

StreamReactorBase* NewMultiplyStreamReactor(grpc::CallbackServerContext* context,
                                            CallPolicy* policy, const JobServices& services) {
  return new StreamReactor(
      context, policy, services.engine,
      [&services](const CallInfo& call) {
        return ComputeStreamStages(std::make_shared<JobSession>(services.engine, call),
                                   services.intake);
      },
      services.timeouts, services.watchdog);
}

StreamReactorBase* NewEchoReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                                  Engine* engine) {
  // The benchmark's streams are not timed out.
  return new StreamReactor(
      context, policy, engine,
      [engine](const CallInfo& call) { return EchoStreamStages(engine, call.deadline); },
      StreamTimeouts{}, /*watchdog=*/nullptr);
}

}  // namespace dgmm
