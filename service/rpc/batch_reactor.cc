// MultiplyBatch: unary on the wire, served as a stream of one message like
// Multiply (dgmm_service.h): the reactor starts before the message is read,
// so the BatchJob reads it only once the ReceiveGate has room, and a
// draining server refuses it unread.
#include <memory>
#include <optional>
#include <vector>

#include "proto/wire.h"
#include "service/job/batch_job.h"
#include "service/rpc/reactors.h"
#include "service/rpc/wire_buffers.h"
#include "service/rpc/wire_stats.h"

namespace dgmm {
namespace {

// The request as gRPC read it; the jobs' headers are decoded without
// touching their matrices, which are copied once out of gRPC's slices, in
// order.
class GrpcBatchRequest final : public GrpcRequest<BatchRequest> {
 public:
  using GrpcRequest::GrpcRequest;
  absl::Status Peek(int64_t max_jobs, std::vector<Job>* jobs, int64_t* total_jobs) override {
    size_t total = 0;
    absl::StatusOr<std::vector<wire::BatchJobView>> views =
        wire::PeekMultiplyBatchRequest(message_, static_cast<size_t>(max_jobs), &total);
    if (!views.ok()) return views.status();
    views_ = std::move(*views);
    *total_jobs = static_cast<int64_t>(total);
    jobs->clear();
    jobs->reserve(views_.size());
    for (const wire::BatchJobView& v : views_) {
      jobs->push_back({.decoded = v.decoded,
                       .header = &v.request.header,
                       .message_bytes = static_cast<int64_t>(v.message_bytes),
                       .matrix_bytes = static_cast<int64_t>(v.request.matrix_bytes)});
    }
    return absl::OkStatus();
  }
  absl::Status CopyMatrix(size_t i, std::byte* dst, int64_t bytes) override {
    if (!reader_.has_value()) reader_.emplace(message_);
    return reader_->Copy(views_[i].matrix_offset, dst, static_cast<size_t>(bytes));
  }

 private:
  std::vector<wire::BatchJobView> views_;
  std::optional<wire::BatchMatrixReader> reader_;
};

class MultiplyBatchReactor final : public GatedReactor<BatchJob, BatchIo, GrpcBatchRequest> {
 public:
  using GatedReactor::GatedReactor;

  void Reply(BatchReply reply) override {
    std::vector<wire::BatchResultView> results(reply.jobs.size());
    std::vector<v1::JobStats> stats(reply.jobs.size());
    for (size_t i = 0; i < reply.jobs.size(); ++i) {
      const BatchReply::Job& job = reply.jobs[i];
      wire::BatchResultView& r = results[i];
      r.code = static_cast<int>(job.status.code());
      if (!job.status.ok()) {
        r.message = job.status.message();
        continue;
      }
      stats[i] = ToWire(job.stats);
      r.stats = &stats[i];
      r.has_result = true;
      r.offset = static_cast<size_t>(job.offset);
      r.bytes = static_cast<size_t>(job.bytes);
    }
    // The results go out from the buffer they were computed in (ToSlice),
    // which goes back to its pool once gRPC has sent them.
    const grpc::Slice data =
        reply.results.data() == nullptr
            ? grpc::Slice()
            : ToSlice(std::move(reply.results), static_cast<size_t>(reply.results_bytes));
    response_ = wire::EncodeMultiplyBatchResponse(results, data);
    SendResponse();
  }
};

}  // namespace

StreamReactorBase* NewMultiplyBatchReactor(grpc::CallbackServerContext* context, CallPolicy* policy,
                                           const JobServices& services) {
  return NewGatedReactor<MultiplyBatchReactor>(context, policy, services);
}

}  // namespace dgmm
