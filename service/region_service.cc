#include "service/region_service.h"

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "proto/wire.h"
#include "service/outcome.h"
#include "service/status_map.h"
#include "service/validator.h"

namespace dgmm {
namespace {

absl::Status RegionsOff() {
  return absl::FailedPreconditionError(
      "shared-memory and CUDA IPC regions are off on this server (start it with "
      "--allow_regions); stream the job instead");
}

template <typename Request>
absl::StatusOr<Request> Parse(const grpc::ByteBuffer* buffer, const char* name) {
  Request r;
  if (!wire::ParseMessage(*buffer, &r)) {
    return absl::InvalidArgumentError(
        absl::StrCat("request does not parse as a dgmm.v1.", name));
  }
  return r;
}

// Bytes [offset, offset + bytes) of `region`, if they lie within it and are
// aligned for elements of `align` bytes.
absl::StatusOr<std::byte*> Span(const Region& region, const v1::RegionRef& ref, int64_t bytes,
                                int64_t align, const char* what) {
  if (ref.offset() < 0 || ref.offset() > region.byte_size() ||
      bytes > region.byte_size() - ref.offset()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %s needs %d bytes at offset %d of region '%s', which has %d bytes", what, bytes,
        ref.offset(), region.name(), region.byte_size()));
  }
  std::byte* p = region.data() + ref.offset();
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(align) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the %s in region '%s' at offset %d is not aligned to its %d-byte elements", what,
        region.name(), ref.offset(), align));
  }
  return p;
}

class RegionJobCall final : public grpc::ServerUnaryReactor,
                            public std::enable_shared_from_this<RegionJobCall> {
 public:
  RegionJobCall(Engine* engine, RegionRegistry* registry, grpc::CallbackServerContext* context,
                std::string owner, absl::Time deadline, grpc::ByteBuffer* response,
                std::atomic<int64_t>* calls)
      : engine_(engine),
        registry_(registry),
        context_(context),
        owner_(std::move(owner)),
        response_(response),
        calls_(calls),
        arrived_(absl::Now()),
        deadline_(deadline) {
    calls_->fetch_add(1);
  }

  void Begin(const grpc::ByteBuffer* request) {
    self_ = shared_from_this();
    absl::Status s = Prepare(request);
    if (!s.ok()) {
      matrix_.reset();
      result_.reset();
      engine_->RecordRejected(s);
      Finish(ToGrpcStatus(s, context_));
      return;
    }
    std::unique_lock lock(mu_);
    auto ticket = engine_->Start(
        job_, mode_, arrived_, deadline_,
        [call = shared_from_this()](absl::StatusOr<std::unique_ptr<ActiveJob>> admitted) {
          call->Run(std::move(admitted));
        },
        owner_);
    if (!ticket.ok()) {
      lock.unlock();
      matrix_.reset();
      result_.reset();
      Finish(ToGrpcStatus(ticket.status(), context_));
      return;
    }
    ticket_ = *ticket;
    lock.unlock();
    if (cancelled_) engine_->Cancel(*ticket, Cancelled());
  }

  void OnCancel() override {
    cancelled_ = true;
    std::lock_guard lock(mu_);
    if (ticket_.has_value()) engine_->Cancel(*ticket_, Cancelled());
  }

  void OnDone() override {
    calls_->fetch_sub(1);
    std::shared_ptr<RegionJobCall> self = std::move(self_);  // may be the last reference
  }

 private:
  absl::Status Cancelled() const {
    if (absl::Now() + absl::Milliseconds(250) >= deadline_) {
      return absl::DeadlineExceededError("deadline exceeded while the region job waited or ran");
    }
    return absl::CancelledError("the client cancelled the region job");
  }

  absl::Status Prepare(const grpc::ByteBuffer* buffer) {
    if (registry_ == nullptr || !registry_->enabled()) return RegionsOff();
    auto req = Parse<v1::MultiplyRegionRequest>(buffer, "MultiplyRegionRequest");
    if (!req.ok()) return req.status();
    request_ = std::move(*req);
    if (!request_.has_matrix() || !request_.has_result()) {
      return absl::InvalidArgumentError("MultiplyRegionRequest needs a matrix and a result ref");
    }
    auto matrix = registry_->Find(owner_, request_.matrix().name());
    if (!matrix.ok()) return matrix.status();
    auto result = registry_->Find(owner_, request_.result().name());
    if (!result.ok()) return result.status();
    std::shared_ptr<Region> diag_region;
    if (request_.has_diagonal()) {
      if (!request_.header().diagonal().empty()) {
        return absl::InvalidArgumentError(
            "the diagonal is either inline (header.diagonal) or in a region (diagonal), not both");
      }
      auto d = registry_->Find(owner_, request_.diagonal().name());
      if (!d.ok()) return d.status();
      diag_region = *d;
    }
    const Region& m = **matrix;
    for (const Region* r : {result->get(), diag_region.get()}) {
      if (r == nullptr) continue;
      if (r->kind() != m.kind() || r->device() != m.device()) {
        return absl::InvalidArgumentError(
            "the matrix, result and diagonal regions of one job must be of one kind (and, for "
            "CUDA IPC, on one GPU)");
      }
    }
    if (diag_region != nullptr) {
      // The diagonal's length follows from the header: read it into the
      // header, then validate as for any job.
      const int64_t elem = request_.header().dtype() == v1::DTYPE_FLOAT64 ? 8 : 4;
      const int64_t len = request_.header().side() == v1::SIDE_LEFT ? request_.header().rows()
                                                                    : request_.header().cols();
      if (len <= 0 || len > (int64_t{1} << 40) / elem) {
        return absl::InvalidArgumentError("header rows/cols out of range for the diagonal");
      }
      if (diag_region->kind() != v1::REGION_KIND_SYSTEM_SHM) {
        return absl::InvalidArgumentError(
            "a diagonal in a CUDA IPC region is not supported: send it inline (header.diagonal)");
      }
      auto span = Span(*diag_region, request_.diagonal(), len * elem, elem, "diagonal");
      if (!span.ok()) return span.status();
      Region::Use use(diag_region);
      std::string* d = request_.mutable_header()->mutable_diagonal();
      d->resize(static_cast<size_t>(len * elem));
      std::memcpy(d->data(), *span, d->size());
      if (auto st = use->CheckIntact(); !st.ok()) return st;
    }
    auto job = ValidateHeader(request_.header(), engine_->options().limits, /*streamed=*/false);
    if (!job.ok()) return job.status();
    job_ = *job;
    const Problem& p = job_.problem;
    const int64_t bytes = p.matrix_bytes();
    const int64_t elem = static_cast<int64_t>(p.elem_size());
    auto in = Span(m, request_.matrix(), bytes, elem, "matrix");
    if (!in.ok()) return in.status();
    auto out = Span(**result, request_.result(), bytes, elem, "result");
    if (!out.ok()) return out.status();
    if ((*result)->SameObject(m)) {
      const int64_t a = m.object_offset() + request_.matrix().offset();
      const int64_t b = (*result)->object_offset() + request_.result().offset();
      if (a != b && a < b + bytes && b < a + bytes) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the result [%d, %d) partly overlaps the matrix [%d, %d) in the same memory; in place "
            "means the same region and offset",
            b, b + bytes, a, a + bytes));
      }
    }
    in_ = *in;
    out_ = *out;
    matrix_ = *matrix;
    result_ = *result;
    if (m.kind() == v1::REGION_KIND_CUDA_IPC) {
      mode_ = JobMode::kDeviceRegion;
      job_.gpu = m.device();
    } else {
      mode_ = JobMode::kHostRegion;
    }
    job_.diagonal = request_.header().diagonal();  // the copy the call owns
    return engine_->CheckFits(job_, mode_);
  }

  // On a job worker, once admitted.
  void Run(absl::StatusOr<std::unique_ptr<ActiveJob>> admitted) {
    // The regions are let go before the reply, so that a client that
    // unregisters right after it sees its memory released.
    std::shared_ptr<Region> matrix = std::move(matrix_);
    std::shared_ptr<Region> result = std::move(result_);
    if (!admitted.ok()) {
      matrix.reset();
      result.reset();
      Finish(ToGrpcStatus(admitted.status(), context_));
      return;
    }
    std::unique_ptr<ActiveJob> job = std::move(*admitted);
    absl::Status s;
    {
      Region::Use matrix_use(std::move(matrix));
      std::optional<Region::Use> result_use;  // one use when in place
      if (result.get() != &*matrix_use) result_use.emplace(std::move(result));
      result.reset();
      const Tile tile{.in = in_, .out = out_, .first_line = 0, .lines = job_.problem.lines()};
      s = cancelled_ ? Cancelled() : job->Process(tile, [this] { return cancelled_.load(); });
      if (s.code() == absl::StatusCode::kCancelled) s = Cancelled();
      if (s.ok()) s = matrix_use->CheckIntact();
      if (s.ok() && result_use.has_value()) s = (*result_use)->CheckIntact();
    }
    const int64_t bytes = job_.problem.matrix_bytes();
    job->stats().set_bytes_in(s.ok() ? bytes : 0);
    job->stats().set_bytes_out(s.ok() ? bytes : 0);
    if (request_.header().has_group()) *job->stats().mutable_group() = request_.header().group();
    job->End(s);
    if (s.ok()) {
      v1::MultiplyRegionResponse reply;
      *reply.mutable_stats() = job->stats();
      *response_ = wire::EncodeMessage(reply);
    }
    job.reset();  // the reservation goes back before the reply
    Finish(ToGrpcStatus(s, context_));
  }

  Engine* const engine_;
  RegionRegistry* const registry_;
  grpc::CallbackServerContext* const context_;
  const std::string owner_;
  grpc::ByteBuffer* const response_;
  std::atomic<int64_t>* const calls_;
  const absl::Time arrived_;
  const absl::Time deadline_;
  std::shared_ptr<RegionJobCall> self_;  // held until OnDone
  v1::MultiplyRegionRequest request_;
  JobRequest job_;
  JobMode mode_ = JobMode::kHostRegion;
  std::shared_ptr<Region> matrix_, result_;
  const std::byte* in_ = nullptr;
  std::byte* out_ = nullptr;
  std::mutex mu_;
  std::optional<Admission::Ticket> ticket_;
  std::atomic<bool> cancelled_{false};
};

}  // namespace

absl::Status ServeRegionCall(RegionMethod method, RegionRegistry* registry,
                             const std::string& owner, const grpc::ByteBuffer* request,
                             grpc::ByteBuffer* response) {
  if (registry == nullptr || !registry->enabled()) return RegionsOff();
  switch (method) {
    case RegionMethod::kRegister: {
      auto req = Parse<v1::RegisterRegionRequest>(request, "RegisterRegionRequest");
      if (!req.ok()) return req.status();
      auto status = registry->Register(owner, *req);
      if (!status.ok()) return status.status();
      v1::RegisterRegionResponse reply;
      *reply.mutable_region() = *status;
      *response = wire::EncodeMessage(reply);
      return absl::OkStatus();
    }
    case RegionMethod::kUnregister: {
      auto req = Parse<v1::UnregisterRegionRequest>(request, "UnregisterRegionRequest");
      if (!req.ok()) return req.status();
      auto n = registry->Unregister(owner, req->name());
      if (!n.ok()) return n.status();
      v1::UnregisterRegionResponse reply;
      reply.set_unregistered(*n);
      *response = wire::EncodeMessage(reply);
      return absl::OkStatus();
    }
    case RegionMethod::kStatus: {
      auto req = Parse<v1::GetRegionStatusRequest>(request, "GetRegionStatusRequest");
      if (!req.ok()) return req.status();
      auto reply = registry->Status(owner, req->name());
      if (!reply.ok()) return reply.status();
      *response = wire::EncodeMessage(*reply);
      return absl::OkStatus();
    }
  }
  return absl::InternalError("unknown region method");
}

grpc::ServerUnaryReactor* ServeMultiplyRegion(Engine* engine, RegionRegistry* registry,
                                              grpc::CallbackServerContext* context,
                                              const std::string& owner, absl::Time deadline,
                                              const grpc::ByteBuffer* request,
                                              grpc::ByteBuffer* response,
                                              std::atomic<int64_t>* calls) {
  auto call = std::make_shared<RegionJobCall>(engine, registry, context, owner, deadline,
                                              response, calls);
  call->Begin(request);
  return call.get();
}

}  // namespace dgmm
