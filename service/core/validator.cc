#include "service/core/validator.h"

#include <limits>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/core/outcome.h"

namespace dgmm {
namespace {

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(what);
}

constexpr absl::string_view kDTypes =
    "DTYPE_FLOAT32 (1), DTYPE_FLOAT64 (2), DTYPE_FLOAT16 (3), DTYPE_BFLOAT16 (4), "
    "DTYPE_COMPLEX64 (5) or DTYPE_COMPLEX128 (6)";

// `field` names the header field in the messages. DTYPE_UNSPECIFIED is
// nullopt (the caller says whether that is allowed).
absl::StatusOr<std::optional<DType>> ToDType(int v, absl::string_view field) {
  switch (v) {
    case v1::DTYPE_UNSPECIFIED:
      return std::optional<DType>();
    case v1::DTYPE_FLOAT32:
      return std::optional<DType>(DType::kFloat32);
    case v1::DTYPE_FLOAT64:
      return std::optional<DType>(DType::kFloat64);
    case v1::DTYPE_FLOAT16:
      return std::optional<DType>(DType::kFloat16);
    case v1::DTYPE_BFLOAT16:
      return std::optional<DType>(DType::kBFloat16);
    case v1::DTYPE_COMPLEX64:
      return std::optional<DType>(DType::kComplex64);
    case v1::DTYPE_COMPLEX128:
      return std::optional<DType>(DType::kComplex128);
    default:
      return Invalid(absl::StrCat("unknown ", field, " ", v, "; expected ", kDTypes));
  }
}

// A's, the diagonals' and C's dtypes: the defaults filled in, the pair
// checked (docs/protocol.md "Element types").
absl::Status ResolveDTypes(const v1::JobHeader& header, Problem* p) {
  auto a = ToDType(header.dtype(), "dtype");
  if (!a.ok()) return a.status();
  if (!a->has_value()) return Invalid(absl::StrCat("dtype is not set; expected ", kDTypes));
  auto d = ToDType(header.diagonal_dtype(), "diagonal_dtype");
  if (!d.ok()) return d.status();
  auto c = ToDType(header.result_dtype(), "result_dtype");
  if (!c.ok()) return c.status();
  p->dtype = **a;
  p->diagonal_dtype = d->value_or(p->dtype);
  const DType promoted = ResultType(p->dtype, p->diag_dtype());
  p->result_dtype = c->value_or(promoted);
  if (!KernelSupports(promoted, p->out_dtype())) {
    return Invalid(
        absl::StrCat("result_dtype ", DTypeName(p->out_dtype()), " cannot hold the product of a ",
                     DTypeName(p->dtype), " matrix and a ", DTypeName(p->diag_dtype()),
                     " diagonal: their result type (NumPy's result_type) is ", DTypeName(promoted),
                     ", and a stated result_dtype must be that or a type it widens to exactly"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Layout> ToLayout(int v) {
  switch (v) {
    case v1::LAYOUT_UNSPECIFIED:
    case v1::LAYOUT_ROW_MAJOR:
      return Layout::kRowMajor;
    case v1::LAYOUT_COL_MAJOR:
      return Layout::kColMajor;
    default:
      return Invalid(absl::StrCat(
          "unknown layout ", v, "; expected LAYOUT_ROW_MAJOR (1) or LAYOUT_COL_MAJOR (2)"));
  }
}

absl::StatusOr<Side> ToSide(int v) {
  switch (v) {
    case v1::SIDE_UNSPECIFIED:
    case v1::SIDE_RIGHT:
      return Side::kRight;
    case v1::SIDE_LEFT:
      return Side::kLeft;
    case v1::SIDE_BOTH:
      return Side::kBoth;
    default:
      return Invalid(absl::StrCat("unknown side ", v,
                                  "; expected SIDE_RIGHT (1), SIDE_LEFT (2) or SIDE_BOTH (3)"));
  }
}

absl::StatusOr<std::optional<BackendKind>> ToBackend(int v) {
  switch (v) {
    case v1::BACKEND_AUTO:
      return std::optional<BackendKind>();
    case v1::BACKEND_CPU:
      return std::optional<BackendKind>(BackendKind::kCpu);
    case v1::BACKEND_CUDA_KERNEL:
      return std::optional<BackendKind>(BackendKind::kCudaKernel);
    case v1::BACKEND_CUBLAS:
      return std::optional<BackendKind>(BackendKind::kCublas);
    default:
      return Invalid(absl::StrCat("unknown backend ", v,
                                  "; expected BACKEND_AUTO (0), BACKEND_CPU (1), "
                                  "BACKEND_CUDA_KERNEL (2) or BACKEND_CUBLAS (3)"));
  }
}

// JobHeader.group of a job of `lines` lines (docs/protocol.md, striping).
absl::Status ValidateGroup(const v1::JobGroup& g, int64_t lines) {
  const std::string& id = g.id();
  if (id.empty() || id.size() > 64) {
    return Invalid(absl::StrCat("group.id has ", id.size(),
                                " characters; it must have 1 to 64 of [A-Za-z0-9._-]"));
  }
  for (const char c : id) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == '-';
    if (!ok) {
      return Invalid(absl::StrFormat(
          "group.id contains the character 0x%02x; only [A-Za-z0-9._-] are allowed",
          static_cast<unsigned char>(c)));
    }
  }
  if (g.first_line() < 0) {
    return Invalid(absl::StrCat("group.first_line is ", g.first_line(), "; it must be >= 0"));
  }
  if (g.total_lines() < lines || g.first_line() > g.total_lines() - lines) {
    return Invalid(absl::StrCat("group.total_lines is ", g.total_lines(),
                                "; it must be >= group.first_line (", g.first_line(),
                                ") + this part's ", lines, " lines"));
  }
  if (g.parts() < 1) {
    return Invalid(absl::StrCat("group.parts is ", g.parts(), "; it must be >= 1"));
  }
  return absl::OkStatus();
}

}  // namespace

v1::Backend WireBackend(BackendKind b) {
  switch (b) {
    case BackendKind::kCpu:
      return v1::BACKEND_CPU;
    case BackendKind::kCudaKernel:
      return v1::BACKEND_CUDA_KERNEL;
    case BackendKind::kCublas:
      return v1::BACKEND_CUBLAS;
  }
  return v1::BACKEND_AUTO;
}

absl::StatusOr<JobRequest> ValidateHeader(const v1::JobHeader& header,
                                          const RequestLimits& limits,
                                          bool streamed, DiagonalIn diagonal_in) {
  JobRequest job;
  Problem& p = job.problem;
  if (header.rows() <= 0 || header.cols() <= 0) {
    return Invalid(absl::StrCat("matrix shape ", header.rows(), "x", header.cols(),
                                " is invalid; rows and cols must both be >= 1"));
  }
  if (absl::Status t = ResolveDTypes(header, &p); !t.ok()) return t;
  auto layout = ToLayout(header.layout());
  if (!layout.ok()) return layout.status();
  auto side = ToSide(header.side());
  if (!side.ok()) return side.status();
  auto backend = ToBackend(header.backend());
  if (!backend.ok()) return backend.status();
  p.rows = header.rows();
  p.cols = header.cols();
  p.layout = *layout;
  p.side = *side;
  job.backend = *backend;

  int64_t elements = 0;
  int64_t bytes = 0;
  if (__builtin_mul_overflow(p.rows, p.cols, &elements) ||
      __builtin_mul_overflow(elements, static_cast<int64_t>(p.elem_size()), &bytes) ||
      __builtin_mul_overflow(elements, static_cast<int64_t>(p.out_elem_size()), &bytes)) {
    return Invalid(absl::StrCat(
        "matrix shape ", p.rows, "x", p.cols, " of ", DTypeName(p.dtype),
        p.out_dtype() == p.dtype ? "" : absl::StrCat(" (result ", DTypeName(p.out_dtype()), ")"),
        " overflows a 64-bit byte count; rows*cols*element size "
        "must be < 2^63"));
  }
  if (p.rows > limits.max_dim || p.cols > limits.max_dim) {
    return WithOutcome(absl::ResourceExhaustedError(absl::StrCat(
                           "matrix shape ", p.rows, "x", p.cols,
                           " exceeds this server's limit of ", limits.max_dim,
                           " rows or columns (--max_dim)")),
                       Outcome::kTooLarge);
  }
  if (job.backend == BackendKind::kCublas && !CublasTakes(p)) {
    return Invalid(absl::StrCat(
        "BACKEND_CUBLAS runs cuBLAS's S, D, C and Z dgmm: float32, float64, complex64 or "
        "complex128, one dtype for the matrix, the diagonal and the result, one side; this job "
        "is a ",
        DTypeName(p.dtype), " matrix with a ", DTypeName(p.diag_dtype()), " diagonal and a ",
        DTypeName(p.out_dtype()), " result, side ", SideName(p.side),
        ". Use BACKEND_CUDA_KERNEL, BACKEND_CPU or BACKEND_AUTO"));
  }
  const int64_t want = p.diag_len();
  const int64_t have_bytes = static_cast<int64_t>(header.diagonal().size());
  const int64_t have_right = static_cast<int64_t>(header.right_diagonal().size());
  if (!p.two_sided() && have_right != 0) {
    return Invalid(absl::StrCat("right_diagonal has ", have_right, " bytes but side ",
                                SideName(p.side),
                                " has one diagonal (header.diagonal); right_diagonal is for "
                                "SIDE_BOTH only"));
  }
  if (diagonal_in == DiagonalIn::kRegion) {
    if (have_bytes != 0 || have_right != 0) {
      return Invalid(
          "the diagonal is either inline (header.diagonal) or in a region (diagonal), not both; "
          "for SIDE_BOTH both diagonals are inline (header.diagonal and header.right_diagonal) "
          "or both in regions (the diagonal and right_diagonal refs)");
    }
  } else if (have_bytes != p.diag_bytes()) {
    return Invalid(absl::StrFormat(
        "diagonal has %d bytes but side %s of a %dx%d %s matrix%s needs %d elements "
        "(%s) = %d bytes",
        have_bytes, SideName(p.side), p.rows, p.cols, DTypeName(p.dtype),
        p.diag_dtype() == p.dtype
            ? ""
            : absl::StrCat(" with a ", DTypeName(p.diag_dtype()), " diagonal"),
        want, p.side == Side::kRight ? "one per column" : "one per row", p.diag_bytes()));
  } else if (p.two_sided() && have_right != p.right_diag_bytes()) {
    return Invalid(absl::StrFormat(
        "right_diagonal has %d bytes but side both of a %dx%d matrix needs %d %s elements "
        "(one per column) = %d bytes",
        have_right, p.rows, p.cols, p.cols, DTypeName(p.diag_dtype()), p.right_diag_bytes()));
  }
  if (streamed && p.line_bytes() > limits.max_block_bytes) {
    // Advise only what can work: the other layout if its lines fit a block,
    // Multiply if the whole request fits one message.
    const bool row_major = p.layout == Layout::kRowMajor;
    const int64_t other_line = (row_major ? p.rows : p.cols) * p.elem_size();
    std::string advice;
    if (other_line <= limits.max_block_bytes) {
      absl::StrAppendFormat(&advice, "; in %s-major layout a line is %d bytes and streams",
                            row_major ? "column" : "row", other_line);
    }
    if (limits.max_unary_message_bytes > 0 &&
        p.matrix_bytes() + p.diag_bytes() + p.right_diag_bytes() < limits.max_unary_message_bytes) {
      absl::StrAppend(&advice, advice.empty() ? "; " : ", or ",
                      "send it in one Multiply request");
    }
    return Invalid(absl::StrFormat(
        "one %s line of this matrix is %d bytes, over the server's max block of %d "
        "bytes, so it cannot be streamed in whole lines%s",
        row_major ? "row" : "column", p.line_bytes(), limits.max_block_bytes,
        advice.empty() ? std::string(" (--max_block_bytes)") : advice));
  }
  if (header.has_group()) {
    if (absl::Status g = ValidateGroup(header.group(), p.lines()); !g.ok()) return g;
    const v1::JobGroup& g = header.group();
    job.group = JobGroup{.id = g.id(),
                         .first_line = g.first_line(),
                         .total_lines = g.total_lines(),
                         .parts = g.parts()};
  }
  job.diagonal = header.diagonal();
  job.right_diagonal = header.right_diagonal();
  return job;
}

absl::Status ValidateMatrixPayload(const Problem& p, std::size_t payload_bytes) {
  if (static_cast<int64_t>(payload_bytes) != p.matrix_bytes()) {
    return Invalid(absl::StrFormat(
        "matrix payload has %d bytes but a %dx%d %s matrix needs rows*cols*%d = %d bytes",
        payload_bytes, p.rows, p.cols, DTypeName(p.dtype), p.elem_size(),
        p.matrix_bytes()));
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> StreamAssembler::Accept(int64_t first_line,
                                                std::size_t data_bytes) {
  const absl::string_view unit = problem_.layout == Layout::kRowMajor ? "row" : "column";
  if (first_line != next_line_) {
    return Invalid(absl::StrFormat(
        "block starts at %s %d but %d %ss have been received; blocks must be sent in "
        "order without gaps or overlaps",
        unit, first_line, next_line_, unit));
  }
  if (data_bytes == 0) return Invalid("block is empty; every block must hold at least one line");
  if (absl::Status s = CheckSize(data_bytes); !s.ok()) return s;
  const int64_t bytes = static_cast<int64_t>(data_bytes);
  if (bytes % problem_.line_bytes() != 0) {
    return Invalid(absl::StrFormat(
        "block of %d bytes is not a whole number of %ss of %d bytes", bytes, unit,
        problem_.line_bytes()));
  }
  const int64_t lines = bytes / problem_.line_bytes();
  if (lines > problem_.lines() - next_line_) {
    return Invalid(absl::StrFormat(
        "block holds %ss %d..%d but the matrix has only %d %ss", unit, first_line,
        first_line + lines - 1, problem_.lines(), unit));
  }
  next_line_ += lines;
  return lines;
}

absl::Status StreamAssembler::CheckSize(std::size_t data_bytes) const {
  // Compared unsigned: a size of 2^63 or more must not turn negative.
  if (data_bytes > static_cast<std::size_t>(max_block_bytes_)) {
    return Invalid(absl::StrFormat("block of %d bytes exceeds max_block_bytes %d", data_bytes,
                                   max_block_bytes_));
  }
  return absl::OkStatus();
}

absl::Status StreamAssembler::Finish() const {
  if (!complete()) {
    return Invalid(absl::StrFormat(
        "stream half-closed after %d of %d %ss; send every line before closing",
        next_line_, problem_.lines(),
        problem_.layout == Layout::kRowMajor ? "row" : "column"));
  }
  return absl::OkStatus();
}

}  // namespace dgmm
