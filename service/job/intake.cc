#include "service/job/intake.h"

#include <cstring>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/core/outcome.h"

namespace dgmm {
namespace {

// Bytes [offset, offset + bytes) of `region`, if they lie within it and are
// aligned for elements of `align` bytes.
absl::StatusOr<std::byte*> Span(const Region& region, const v1::RegionRef& ref, int64_t bytes,
                                int64_t align, const char* what) {
  if (ref.offset() < 0 || ref.offset() > region.byte_size() ||
      bytes > region.byte_size() - ref.offset()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the %s needs %d bytes at offset %d of region '%s', which has %d bytes",
                        what, bytes, ref.offset(), region.name(), region.byte_size()));
  }
  std::byte* p = region.data() + ref.offset();
  if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(align) != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the %s in region '%s' at offset %d is not aligned to its %d-byte elements",
                        what, region.name(), ref.offset(), align));
  }
  return p;
}

}  // namespace

absl::Status RegionsOffError() {
  return absl::FailedPreconditionError(
      "shared-memory and CUDA IPC regions are off on this server (it runs with "
      "--allow_regions=false); stream the job instead");
}

// The order of the checks, for every RPC (intake.h).
const Intake::Step Intake::kSteps[] = {&Intake::Served, &Intake::Header, &Intake::Sources,
                                       &Intake::Fits, &Intake::Payload};

absl::Status Intake::Check(const JobDraft& draft, IntakenJob* out) const {
  bool header_valid = false;
  for (Step step : kSteps) {
    absl::Status s = (this->*step)(draft, out);
    if (!s.ok()) {
      if (header_valid) {
        engine_->Refused(0, s, out->job);
      } else {
        engine_->metrics().Refused(0, s);
      }
      return s;
    }
    if (step == &Intake::Header) header_valid = true;
  }
  return absl::OkStatus();
}

absl::Status Intake::Served(const JobDraft& d, IntakenJob*) const {
  const RequestLimits& limits = engine_->options().limits;
  if (d.kind == JobKind::kUnary && d.small && d.message_bytes > limits.max_small_message_bytes()) {
    return WithOutcome(
        absl::ResourceExhaustedError(absl::StrCat(
            "MultiplySmall request of ", d.message_bytes,
            " bytes exceeds this server's max small message of ", limits.max_small_message_bytes(),
            " bytes; send it with ",
            d.message_bytes > limits.max_unary_message_bytes ? "MultiplyStream" : "Multiply")),
        Outcome::kMessageTooLarge);
  }
  if (d.kind == JobKind::kUnary && d.message_bytes > limits.max_unary_message_bytes) {
    return WithOutcome(
        absl::ResourceExhaustedError(absl::StrCat(
            d.method, " request of ", d.message_bytes,
            " bytes exceeds this server's max unary message of ", limits.max_unary_message_bytes,
            " bytes (--max_unary_message_bytes); ", d.too_large_advice)),
        Outcome::kMessageTooLarge);
  }
  if (d.kind == JobKind::kRegion && (regions_ == nullptr || !regions_->enabled())) {
    return RegionsOffError();
  }
  return absl::OkStatus();
}

absl::Status Intake::Header(const JobDraft& d, IntakenJob* out) const {
  if (!d.decoded.ok()) return d.decoded;
  const DiagonalIn diagonal_in =
      d.kind == JobKind::kRegion && (d.region->has_diagonal() || d.region->has_right_diagonal())
          ? DiagonalIn::kRegion
          : DiagonalIn::kHeader;
  auto job = ValidateHeader(*d.header, engine_->options().limits,
                            /*streamed=*/d.kind == JobKind::kStream, diagonal_in);
  if (!job.ok()) return job.status();
  if (d.kind == JobKind::kRegion) {
    const bool both = job->problem.two_sided();
    if (d.region->has_right_diagonal() && !both) {
      return absl::InvalidArgumentError(
          absl::StrCat("a right_diagonal ref is for SIDE_BOTH only; this job's side is ",
                       SideName(job->problem.side)));
    }
    if (both && d.region->has_diagonal() != d.region->has_right_diagonal()) {
      return absl::InvalidArgumentError(
          "a SIDE_BOTH job has both diagonals inline (header.diagonal and "
          "header.right_diagonal) or both in regions (diagonal and right_diagonal refs)");
    }
  }
  out->job = *job;
  out->job.call = d.call;
  out->mode = d.kind == JobKind::kStream ? JobMode::kStreamed : JobMode::kWhole;
  return absl::OkStatus();
}

absl::Status Intake::Sources(const JobDraft& d, IntakenJob* out) const {
  if (d.kind != JobKind::kRegion) return absl::OkStatus();
  const v1::MultiplyRegionRequest& r = *d.region;
  if (!r.has_matrix() || !r.has_result()) {
    return absl::InvalidArgumentError("MultiplyRegionRequest needs a matrix and a result ref");
  }
  if (r.matrix().process_address() != 0 || r.result().process_address() != 0) {
    return ProcessSources(d, out);
  }
  auto matrix = regions_->Find(d.owner, r.matrix().name());
  if (!matrix.ok()) return matrix.status();
  auto result = regions_->Find(d.owner, r.result().name());
  if (!result.ok()) return result.status();
  for (const Region* r : {matrix->get(), result->get()}) {
    if (absl::Status usable = r->Usable(); !usable.ok()) return usable;
  }
  const Region& m = **matrix;
  const absl::Status mixed = absl::InvalidArgumentError(
      "the matrix, result and diagonal regions of one job must be of one kind (and, for "
      "GPU memory, on one GPU)");
  if ((*result)->kind() != m.kind() || (*result)->device() != m.device()) return mixed;
  std::shared_ptr<Region> diagonal_region, right_region;
  for (const auto& [has, ref, place] :
       {std::tuple{r.has_diagonal(), &r.diagonal(), &diagonal_region},
        std::tuple{r.has_right_diagonal(), &r.right_diagonal(), &right_region}}) {
    if (!has) continue;
    auto diagonal = regions_->Find(d.owner, ref->name());
    if (!diagonal.ok()) return diagonal.status();
    if (absl::Status usable = (*diagonal)->Usable(); !usable.ok()) return usable;
    *place = *diagonal;
    if ((*diagonal)->kind() != v1::REGION_KIND_SYSTEM_SHM) {
      return absl::InvalidArgumentError(
          "a diagonal in GPU memory (a CUDA IPC or VMM region) is not supported: send it inline "
          "(header.diagonal)");
    }
    if (m.kind() != v1::REGION_KIND_SYSTEM_SHM) return mixed;
  }
  out->matrix = *matrix;
  out->result = *result;
  out->diagonal_region = std::move(diagonal_region);
  out->right_region = std::move(right_region);
  if (m.on_gpu()) {
    out->mode = JobMode::kDeviceRegion;
    out->job.gpu = m.device();
  } else {
    out->mode = JobMode::kHostRegion;
  }
  return absl::OkStatus();
}

absl::Status Intake::ProcessSources(const JobDraft& d, IntakenJob* out) const {
  const v1::MultiplyRegionRequest& r = *d.region;
  const auto by_address = [](const v1::RegionRef& ref) {
    return ref.process_address() != 0 && ref.name().empty() && ref.offset() == 0;
  };
  if (!by_address(r.matrix()) || !by_address(r.result())) {
    return absl::InvalidArgumentError(
        "a job in process memory names both its matrix and its result by process_address "
        "alone (no region name, offset 0)");
  }
  if (r.has_diagonal() || r.has_right_diagonal()) {
    return absl::InvalidArgumentError(
        "the diagonal of a job in process memory goes inline (header.diagonal, and "
        "header.right_diagonal for SIDE_BOTH)");
  }
  if (d.process_memory == nullptr) {
    return absl::FailedPreconditionError(
        "this session may not name its process's memory: its hello must ask for it "
        "(LocalHello.process_memory) and be granted it (LocalHelloReply.process_memory); use a "
        "region");
  }
  out->process_memory = d.process_memory;
  out->mode = JobMode::kHostRegion;
  return absl::OkStatus();
}

absl::Status Intake::Fits(const JobDraft&, IntakenJob* out) const {
  return engine_->CheckFits(out->job, out->mode);
}

absl::Status Intake::Payload(const JobDraft& d, IntakenJob* out) const {
  switch (d.kind) {
    case JobKind::kUnary:
      return ValidateMatrixPayload(out->job.problem, static_cast<size_t>(d.matrix_bytes));
    case JobKind::kStream:
      return absl::OkStatus();  // block by block, as they come
    case JobKind::kRegion:
      return RegionPayload(*d.region, out);
  }
  return absl::OkStatus();
}

absl::Status Intake::RegionPayload(const v1::MultiplyRegionRequest& r, IntakenJob* out) const {
  const Problem& p = out->job.problem;
  const int64_t elem = static_cast<int64_t>(p.elem_size());
  const int64_t out_elem = static_cast<int64_t>(p.out_elem_size());
  const int64_t diag_elem = static_cast<int64_t>(p.diag_elem_size());
  // Copied into the job, so that the client may change them once the reply
  // is out, and checked intact after the copy (a shrink shows here).
  for (const auto& [region, ref, bytes, copy, view, what] :
       {std::tuple{&out->diagonal_region, &r.diagonal(), p.diag_bytes(), &out->diagonal,
                   &out->job.diagonal, "diagonal"},
        std::tuple{&out->right_region, &r.right_diagonal(), p.right_diag_bytes(),
                   &out->right_diagonal, &out->job.right_diagonal, "right diagonal"}}) {
    if (*region == nullptr) continue;
    Region::Use use(std::move(*region));
    auto span = Span(*use, *ref, bytes, diag_elem, what);
    if (!span.ok()) return span.status();
    copy->assign(reinterpret_cast<const char*>(*span), static_cast<size_t>(bytes));
    if (absl::Status intact = use->CheckIntact(); !intact.ok()) return intact;
    *view = *copy;
  }
  const int64_t bytes = p.matrix_bytes();
  const int64_t out_bytes = p.out_matrix_bytes();
  if (out->process_memory != nullptr) {
    const uint64_t a = r.matrix().process_address();
    const uint64_t b = r.result().process_address();
    for (const auto& [at, what, size, align] :
         {std::tuple{a, "matrix", bytes, elem}, std::tuple{b, "result", out_bytes, out_elem}}) {
      if (at % static_cast<uint64_t>(align) != 0) {
        return absl::InvalidArgumentError(
            absl::StrFormat("the %s at process address %#x is not aligned to its %d-byte elements",
                            what, at, align));
      }
      if (at > UINT64_MAX - static_cast<uint64_t>(size)) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the %s's %d bytes at process address %#x run past the end of the address space", what,
            size, at));
      }
    }
    // In place (the same address) only when C has A's element size; a
    // wider C must not overlap A at all.
    const uint64_t n = static_cast<uint64_t>(bytes);
    const uint64_t m = static_cast<uint64_t>(out_bytes);
    if ((a != b || m != n) && a < b + m && b < a + n) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the result [%#x, %#x) %s the matrix [%#x, %#x) in process memory; %s", b, b + m,
          a == b ? "starts at" : "partly overlaps", a, a + n,
          m == n ? "in place means the same address"
                 : "a result of a wider dtype than the matrix's cannot be computed in place: "
                   "give it memory of its own"));
    }
    out->in = reinterpret_cast<const std::byte*>(a);
    out->out = reinterpret_cast<std::byte*>(b);
    return absl::OkStatus();
  }
  auto in = Span(*out->matrix, r.matrix(), bytes, elem, "matrix");
  if (!in.ok()) return in.status();
  auto result = Span(*out->result, r.result(), out_bytes, out_elem, "result");
  if (!result.ok()) return result.status();
  if (out->result->SameObject(*out->matrix)) {
    const int64_t a = out->matrix->object_offset() + r.matrix().offset();
    const int64_t b = out->result->object_offset() + r.result().offset();
    if ((a != b || out_bytes != bytes) && a < b + out_bytes && b < a + bytes) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the result [%d, %d) %s the matrix [%d, %d) in the same memory; %s", b, b + out_bytes,
          a == b ? "starts at" : "partly overlaps", a, a + bytes,
          out_bytes == bytes
              ? "in place means the same region and offset"
              : "a result of a wider dtype than the matrix's cannot be computed in place: give it "
                "a place of its own"));
    }
  }
  out->in = *in;
  out->out = *result;
  return absl::OkStatus();
}

}  // namespace dgmm
