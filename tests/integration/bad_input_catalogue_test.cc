// The bad-input catalogue: malformed and hostile requests for both RPCs,
// sent to the real server over loopback, each with the status code and the
// message fragment the contract (proto/dgmm/v1/dgmm.proto) promises. After
// the whole catalogue the server must still be healthy, hold no reserved
// bytes and compute right answers.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

using std::chrono::milliseconds;
using Code = grpc::StatusCode;
using StreamMsgs = std::vector<v1::MultiplyStreamRequest>;

// Small limits so every row is cheap. Streamed jobs reserve
// 2 * 4 blocks * 4 KiB = 32 KiB plus their diagonal, so a diagonal of 32 KiB
// makes a job that can never fit the 48 KiB budget.
constexpr int64_t kMaxBlock = 4096;
constexpr int64_t kMaxUnary = 16384;
constexpr int64_t kMaxDim = 4096;
// What gRPC itself used to hold a message to (max(unary, block + 64 KiB));
// the handlers now check every message themselves, past it as below it.
constexpr int64_t kTransportLimit = kMaxBlock + 65536;
const std::vector<std::string> kServerFlags = {
    "--backend=cpu",  "--max_block_bytes=4KiB",     "--max_unary_message_bytes=16KiB",
    "--max_dim=4096", "--host_memory_budget=48KiB", "--threads=2",
    "--max_queue=4"};

int64_t ElemSize(const v1::JobHeader& h) { return h.dtype() == v1::DTYPE_FLOAT64 ? 8 : 4; }
int64_t LineBytes(const v1::JobHeader& h) {
  return (h.layout() == v1::LAYOUT_COL_MAJOR ? h.rows() : h.cols()) * ElemSize(h);
}

// ------------------------------------------------------------ request makers

RandomJob Job(int64_t rows, int64_t cols, v1::DType dtype = v1::DTYPE_FLOAT32,
              v1::Layout layout = v1::LAYOUT_ROW_MAJOR, v1::Side side = v1::SIDE_RIGHT) {
  return MakeJob(rows, cols, dtype, layout, side, static_cast<uint64_t>(rows * 131 + cols));
}

v1::MultiplyRequest Unary(const RandomJob& job) {
  v1::MultiplyRequest r;
  *r.mutable_header() = job.header;
  r.set_matrix(job.matrix);
  return r;
}

// A 4x6 float32 job with `edit` applied to its header.
v1::MultiplyRequest UnaryWith(const std::function<void(v1::JobHeader*)>& edit) {
  v1::MultiplyRequest r = Unary(Job(4, 6));
  edit(r.mutable_header());
  return r;
}

v1::MultiplyStreamRequest Header(const RandomJob& job) {
  v1::MultiplyStreamRequest m;
  *m.mutable_header() = job.header;
  return m;
}

v1::MultiplyStreamRequest HeaderWith(const std::function<void(v1::JobHeader*)>& edit) {
  v1::MultiplyStreamRequest m = Header(Job(10, 8));
  edit(m.mutable_header());
  return m;
}

// Lines [first, first + lines) of the job's matrix, claimed to start at
// `claimed_first` (defaults to `first`).
v1::MultiplyStreamRequest Block(const RandomJob& job, int64_t first, int64_t lines,
                                std::optional<int64_t> claimed_first = std::nullopt) {
  const int64_t lb = LineBytes(job.header);
  v1::MultiplyStreamRequest m;
  m.mutable_block()->set_first_line(claimed_first.value_or(first));
  m.mutable_block()->set_data(job.matrix.substr(first * lb, lines * lb));
  return m;
}

v1::MultiplyStreamRequest RawBlock(int64_t first_line, std::string data) {
  v1::MultiplyStreamRequest m;
  m.mutable_block()->set_first_line(first_line);
  m.mutable_block()->set_data(std::move(data));
  return m;
}

// `m` with an extra field on the wire: `field` (length-delimited) holding
// `bytes`, written after the known fields. It can make a message the typed
// classes would never build: a second oneof member, a block whose bytes are
// not a Block, a second matrix, or a field the server does not know (which
// it must skip). Both RPCs are decoded by hand (proto/wire.h).
template <typename Message>
Message WithRawField(Message m, int field, std::string bytes) {
  m.GetReflection()->MutableUnknownFields(&m)->AddLengthDelimited(field, std::move(bytes));
  return m;
}
// Every block of `job`, `lines_per_block` lines at a time.
StreamMsgs WholeStream(const RandomJob& job, int64_t lines_per_block) {
  StreamMsgs msgs = {Header(job)};
  const int64_t lines =
      job.header.layout() == v1::LAYOUT_COL_MAJOR ? job.header.cols() : job.header.rows();
  for (int64_t first = 0; first < lines; first += lines_per_block) {
    msgs.push_back(Block(job, first, std::min(lines_per_block, lines - first)));
  }
  return msgs;
}

// A job whose matrix and diagonal hold NaN, infinities, signed zeros, the
// largest finite value and the smallest subnormal: valid input, whose result
// must be the IEEE-754 products.
RandomJob SpecialValuesJob(v1::DType dtype, v1::Layout layout, v1::Side side) {
  RandomJob job = Job(3, 4, dtype, layout, side);
  const double inf = std::numeric_limits<double>::infinity();
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double big = dtype == v1::DTYPE_FLOAT64 ? std::numeric_limits<double>::max()
                                                : std::numeric_limits<float>::max();
  const double tiny = dtype == v1::DTYPE_FLOAT64 ? std::numeric_limits<double>::denorm_min()
                                                 : std::numeric_limits<float>::denorm_min();
  const std::vector<double> matrix = {nan, inf,  -inf, 0.0,  big, 1.0,
                                      0.0, -0.0, tiny, -inf, inf, 1.0};
  const std::vector<double> diag = {2.0, 0.0, -1.0, inf};
  auto encode = [dtype](const std::vector<double>& v, size_t n) {
    std::string out;
    for (size_t i = 0; i < n; ++i) {
      if (dtype == v1::DTYPE_FLOAT64) {
        out.append(reinterpret_cast<const char*>(&v[i]), 8);
      } else {
        const float f = static_cast<float>(v[i]);
        out.append(reinterpret_cast<const char*>(&f), 4);
      }
    }
    return out;
  };
  job.matrix = encode(matrix, 12);
  job.header.set_diagonal(encode(diag, side == v1::SIDE_LEFT ? 3 : 4));
  return job;
}

// Exact comparison with the IEEE-754 product, computed in float64 (exact for
// float32 operands) and rounded to the job's dtype; any NaN matches any NaN,
// and the sign of zeros and infinities must agree.
std::string IeeeMismatch(const RandomJob& job, const std::string& result) {
  const v1::JobHeader& h = job.header;
  if (result.size() != job.matrix.size()) {
    return "result has " + std::to_string(result.size()) + " bytes, want " +
           std::to_string(job.matrix.size());
  }
  const bool row_major = h.layout() != v1::LAYOUT_COL_MAJOR;
  for (int64_t i = 0; i < h.rows(); ++i) {
    for (int64_t j = 0; j < h.cols(); ++j) {
      const int64_t at = row_major ? i * h.cols() + j : j * h.rows() + i;
      const double d = LoadElement(h.diagonal(), h.side() == v1::SIDE_LEFT ? i : j, h.dtype());
      double want = LoadElement(job.matrix, at, h.dtype()) * d;
      if (h.dtype() == v1::DTYPE_FLOAT32) want = static_cast<float>(want);
      const double got = LoadElement(result, at, h.dtype());
      const bool same = (std::isnan(want) && std::isnan(got)) ||
                        (want == got && std::signbit(want) == std::signbit(got));
      if (!same) {
        return "element (" + std::to_string(i) + ", " + std::to_string(j) + ") is " +
               std::to_string(got) + ", want " + std::to_string(want);
      }
    }
  }
  return "";
}

// ------------------------------------------------------------------- calls

struct Outcome {
  grpc::Status status;
  std::string result;  // the result payload, assembled for streams
};

Outcome CallUnary(v1::Dgmm::Stub* stub, const v1::MultiplyRequest& request, milliseconds deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  v1::MultiplyResponse response;
  Outcome out;
  out.status = stub->Multiply(&ctx, request, &response);
  out.result = response.result();
  return out;
}

// Writes `msgs` (stopping at the first failed write), half-closes when told,
// then reads until the server ends the call.
Outcome CallStream(v1::Dgmm::Stub* stub, const StreamMsgs& msgs, bool half_close,
                   milliseconds deadline) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + deadline);
  auto stream = stub->MultiplyStream(&ctx);
  for (const auto& m : msgs) {
    if (!stream->Write(m)) break;
  }
  if (half_close) stream->WritesDone();
  Outcome out;
  v1::MultiplyStreamResponse resp;
  while (stream->Read(&resp)) {
    if (resp.has_block()) out.result += resp.block().data();
  }
  out.status = stream->Finish();
  return out;
}

// ------------------------------------------------------------------- rows

struct Row {
  std::string name;
  // Exactly one of these is set.
  std::function<v1::MultiplyRequest()> unary;
  std::function<StreamMsgs()> stream;
  bool half_close = true;
  milliseconds deadline{15000};
  Code code;
  std::string fragment;
  // For rows that must succeed: checks the result; returns "" when right.
  std::function<std::string(const std::string& result)> check;
};

Row U(std::string name, std::function<v1::MultiplyRequest()> req, Code code, std::string fragment) {
  Row r;
  r.name = std::move(name);
  r.unary = std::move(req);
  r.code = code;
  r.fragment = std::move(fragment);
  return r;
}

Row S(std::string name, std::function<StreamMsgs()> msgs, Code code, std::string fragment,
      bool half_close = true) {
  Row r;
  r.name = std::move(name);
  r.stream = std::move(msgs);
  r.code = code;
  r.fragment = std::move(fragment);
  r.half_close = half_close;
  return r;
}

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();
constexpr Code kInvalid = Code::INVALID_ARGUMENT;
constexpr Code kExhausted = Code::RESOURCE_EXHAUSTED;

std::vector<Row> Catalogue() {
  std::vector<Row> rows;
  // A 10x8 float32 row-major job: rows are 32-byte lines.
  const RandomJob j = Job(10, 8);

  // ---- Multiply: the validator, one row per error.
  rows.push_back(U(
      "unary_no_header_at_all", [] { return v1::MultiplyRequest(); }, kInvalid,
      "matrix shape 0x0 is invalid"));
  rows.push_back(U(
      "unary_rows_zero", [] { return UnaryWith([](auto* h) { h->set_rows(0); }); }, kInvalid,
      "rows and cols must both be >= 1"));
  rows.push_back(U(
      "unary_cols_negative", [] { return UnaryWith([](auto* h) { h->set_cols(-3); }); }, kInvalid,
      "matrix shape 4x-3 is invalid"));
  rows.push_back(U(
      "unary_rows_int64_max", [] { return UnaryWith([](auto* h) { h->set_rows(kInt64Max); }); },
      kInvalid, "overflows a 64-bit byte count"));
  rows.push_back(U(
      "unary_rows_times_cols_overflows",
      [] {
        return UnaryWith([](auto* h) {
          h->set_rows(int64_t{1} << 40);
          h->set_cols(int64_t{1} << 40);
        });
      },
      kInvalid, "overflows a 64-bit byte count"));
  rows.push_back(U(
      "unary_times_element_size_overflows",
      [] {
        return UnaryWith([](auto* h) {  // 2^61 elements fit, 2^64 bytes do not
          h->set_rows(int64_t{1} << 31);
          h->set_cols(int64_t{1} << 30);
          h->set_dtype(v1::DTYPE_FLOAT64);
        });
      },
      kInvalid, "overflows a 64-bit byte count"));
  rows.push_back(U(
      "unary_dtype_unspecified",
      [] { return UnaryWith([](auto* h) { h->set_dtype(v1::DTYPE_UNSPECIFIED); }); }, kInvalid,
      "dtype is not set"));
  rows.push_back(U(
      "unary_dtype_unknown",
      [] { return UnaryWith([](auto* h) { h->set_dtype(static_cast<v1::DType>(7)); }); }, kInvalid,
      "unknown dtype 7"));
  rows.push_back(U(
      "unary_dtype_negative",
      [] { return UnaryWith([](auto* h) { h->set_dtype(static_cast<v1::DType>(-1)); }); }, kInvalid,
      "unknown dtype -1"));
  rows.push_back(U(
      "unary_layout_unknown",
      [] { return UnaryWith([](auto* h) { h->set_layout(static_cast<v1::Layout>(3)); }); },
      kInvalid, "unknown layout 3"));
  rows.push_back(U(
      "unary_side_unknown",
      [] { return UnaryWith([](auto* h) { h->set_side(static_cast<v1::Side>(9)); }); }, kInvalid,
      "unknown side 9"));
  rows.push_back(U(
      "unary_backend_unknown",
      [] { return UnaryWith([](auto* h) { h->set_backend(static_cast<v1::Backend>(42)); }); },
      kInvalid, "unknown backend 42"));
  rows.push_back(U(
      "unary_backend_cublas_on_cpu_server",
      [] { return UnaryWith([](auto* h) { h->set_backend(v1::BACKEND_CUBLAS); }); }, kInvalid,
      "needs a GPU but this server has none"));
  rows.push_back(U(
      "unary_backend_cuda_kernel_on_cpu_server",
      [] { return UnaryWith([](auto* h) { h->set_backend(v1::BACKEND_CUDA_KERNEL); }); }, kInvalid,
      "needs a GPU but this server has none"));
  rows.push_back(U(
      "unary_diagonal_short",
      [] { return UnaryWith([](auto* h) { h->mutable_diagonal()->resize(20); }); }, kInvalid,
      "diagonal has 20 bytes but side right of a 4x6 float32 matrix needs 6"));
  rows.push_back(U(
      "unary_diagonal_for_the_wrong_side",
      [] { return UnaryWith([](auto* h) { h->set_side(v1::SIDE_LEFT); }); }, kInvalid,
      "needs 4 elements (one per row)"));
  rows.push_back(U(
      "unary_diagonal_missing", [] { return UnaryWith([](auto* h) { h->clear_diagonal(); }); },
      kInvalid, "diagonal has 0 bytes"));
  rows.push_back(U(
      "unary_payload_one_byte_short",
      [] {
        v1::MultiplyRequest r = Unary(Job(4, 6));
        r.mutable_matrix()->pop_back();
        return r;
      },
      kInvalid, "matrix payload has 95 bytes but a 4x6 float32 matrix needs"));
  rows.push_back(U(
      "unary_payload_one_line_long",
      [] {
        v1::MultiplyRequest r = Unary(Job(4, 6));
        r.mutable_matrix()->append(24, '\0');
        return r;
      },
      kInvalid, "matrix payload has 120 bytes"));
  rows.push_back(U(
      "unary_payload_empty",
      [] {
        v1::MultiplyRequest r = Unary(Job(4, 6));
        r.clear_matrix();
        return r;
      },
      kInvalid, "matrix payload has 0 bytes"));
  rows.push_back(U(
      "unary_rows_over_max_dim",
      [] { return UnaryWith([](auto* h) { h->set_rows(kMaxDim + 1); }); }, kExhausted,
      "exceeds this server's limit of 4096 rows or columns"));
  rows.push_back(U(
      "unary_cols_over_max_dim",
      [] {
        return UnaryWith([](auto* h) {
          h->set_rows(1);
          h->set_cols(int64_t{1} << 40);
          h->set_side(v1::SIDE_LEFT);
        });
      },
      kExhausted, "exceeds this server's limit of 4096"));
  rows.push_back(U(
      "unary_message_over_unary_limit",
      [] {
        return Unary(Job(50, 100));  // 20 KB: over 16 KiB, under the transport's limit
      },
      kExhausted, "exceeds this server's max unary message of 16384 bytes"));
  rows.push_back(U(
      "unary_message_over_transport_limit",
      [] {
        v1::MultiplyRequest r = Unary(Job(4, 6));
        r.mutable_matrix()->assign(kTransportLimit + 1024, '\0');
        return r;
      },
      kExhausted, "exceeds this server's max unary message"));
  {
    const RandomJob special =
        SpecialValuesJob(v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT);
    Row r = U(
        "unary_nan_inf_payload_computes_ieee_products", [special] { return Unary(special); },
        Code::OK, "");
    r.check = [special](const std::string& result) { return IeeeMismatch(special, result); };
    rows.push_back(r);
  }

  // Wire-level rows for Multiply.
  rows.push_back(U(
      "unary_matrix_given_twice",
      [] {
        v1::MultiplyRequest r = Unary(Job(4, 6));
        return WithRawField(r, 2, r.matrix());
      },
      kInvalid, "malformed MultiplyRequest: the matrix is given twice"));
  rows.push_back(U(
      "unary_header_bytes_are_not_a_header",
      [] {
        v1::MultiplyRequest r = Unary(Job(4, 6));
        return WithRawField(r, 1, std::string("\x08\xff", 2));
      },
      kInvalid, "malformed MultiplyRequest: bad header"));
  {
    const RandomJob small = Job(4, 6);
    Row r = U(
        "unary_unknown_fields_are_skipped",
        [small] {
          v1::MultiplyRequest m = WithRawField(Unary(small), 15, "future");
          m.mutable_header()->GetReflection()->MutableUnknownFields(m.mutable_header())->AddVarint(
              99, 7);
          return m;
        },
        Code::OK, "");
    r.check = [small](const std::string& result) { return IeeeMismatch(small, result); };
    rows.push_back(r);
  }

  // ---- MultiplyStream: the header through the same validator.
  rows.push_back(S(
      "stream_header_rows_zero",
      [] { return StreamMsgs{HeaderWith([](auto* h) { h->set_rows(0); })}; }, kInvalid,
      "rows and cols must both be >= 1"));
  rows.push_back(S(
      "stream_header_rows_int64_max",
      [] { return StreamMsgs{HeaderWith([](auto* h) { h->set_rows(kInt64Max); })}; }, kInvalid,
      "overflows a 64-bit byte count"));
  rows.push_back(S(
      "stream_header_dtype_unknown",
      [] {
        return StreamMsgs{HeaderWith([](auto* h) { h->set_dtype(static_cast<v1::DType>(9)); })};
      },
      kInvalid, "unknown dtype 9"));
  rows.push_back(S(
      "stream_header_diagonal_short",
      [] { return StreamMsgs{HeaderWith([](auto* h) { h->mutable_diagonal()->resize(4); })}; },
      kInvalid, "diagonal has 4 bytes"));
  rows.push_back(S(
      "stream_header_over_max_dim",
      [] { return StreamMsgs{HeaderWith([](auto* h) { h->set_rows(kMaxDim * 2); })}; }, kExhausted,
      "exceeds this server's limit of 4096"));
  rows.push_back(S(
      "stream_backend_cublas_on_cpu_server",
      [] { return StreamMsgs{HeaderWith([](auto* h) { h->set_backend(v1::BACKEND_CUBLAS); })}; },
      kInvalid, "needs a GPU but this server has none"));
  rows.push_back(S(
      "stream_line_longer_than_max_block",
      [] {
        return StreamMsgs{Header(Job(2, 2000))};  // an 8000-byte row
      },
      kInvalid, "cannot be streamed in whole lines"));
  rows.push_back(S(
      "stream_job_too_large_for_budget",
      [] {
        // Column-major 2x4096 float64: 16-byte lines, but a 32 KiB diagonal on
        // top of the 32 KiB stream window: 64 KiB > the 48 KiB budget.
        return StreamMsgs{Header(Job(2, 4096, v1::DTYPE_FLOAT64, v1::LAYOUT_COL_MAJOR))};
      },
      kExhausted, "but the host budget's capacity is 49152 bytes"));

  // ---- MultiplyStream: the protocol.
  rows.push_back(S(
      "stream_closed_without_any_message", [] { return StreamMsgs{}; }, kInvalid,
      "stream closed before its header"));
  rows.push_back(S(
      "stream_block_before_header", [j] { return StreamMsgs{Block(j, 0, 2)}; }, kInvalid,
      "first message of MultiplyStream must be a header"));
  rows.push_back(S(
      "stream_two_headers",
      [j] {
        return StreamMsgs{Header(j), Header(j)};
      },
      kInvalid, "a second header arrived"));
  rows.push_back(S(
      "stream_header_after_a_block",
      [j] {
        return StreamMsgs{Header(j), Block(j, 0, 2), Header(j)};
      },
      kInvalid, "a second header arrived"));
  rows.push_back(S(
      "stream_neither_header_nor_block",
      [j] {
        return StreamMsgs{Header(j), v1::MultiplyStreamRequest()};
      },
      kInvalid, "neither a header nor a block"));
  rows.push_back(S(
      "stream_first_block_not_at_zero",
      [j] {
        return StreamMsgs{Header(j), Block(j, 1, 2)};
      },
      kInvalid, "block starts at row 1 but 0 rows have been received"));
  rows.push_back(S(
      "stream_gap",
      [j] {
        return StreamMsgs{Header(j), Block(j, 0, 2), Block(j, 3, 2)};
      },
      kInvalid, "block starts at row 3 but 2 rows"));
  rows.push_back(S(
      "stream_overlap",
      [j] {
        return StreamMsgs{Header(j), Block(j, 0, 4), Block(j, 2, 2)};
      },
      kInvalid, "block starts at row 2 but 4 rows"));
  rows.push_back(S(
      "stream_gap_in_column_major",
      [] {
        const RandomJob c = Job(8, 10, v1::DTYPE_FLOAT64, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT);
        return StreamMsgs{Header(c), Block(c, 0, 2), Block(c, 3, 2)};
      },
      kInvalid, "block starts at column 3 but 2 columns"));
  rows.push_back(S(
      "stream_negative_first_line",
      [j] {
        return StreamMsgs{Header(j), Block(j, 0, 2, /*claimed_first=*/-1)};
      },
      kInvalid, "block starts at row -1"));
  rows.push_back(S(
      "stream_huge_first_line",
      [j] {
        return StreamMsgs{Header(j), Block(j, 0, 2, kInt64Max)};
      },
      kInvalid, "block starts at row 9223372036854775807"));
  rows.push_back(S(
      "stream_int64_min_first_line_after_blocks",
      [j] {
        return StreamMsgs{Header(j), Block(j, 0, 2),
                          Block(j, 2, 2, std::numeric_limits<int64_t>::min())};
      },
      kInvalid, "block starts at row -9223372036854775808 but 2 rows"));
  rows.push_back(S(
      "stream_partial_line",
      [j] {
        v1::MultiplyStreamRequest b = Block(j, 0, 2);
        b.mutable_block()->mutable_data()->pop_back();
        return StreamMsgs{Header(j), b};
      },
      kInvalid, "block of 63 bytes is not a whole number of rows of 32 bytes"));
  rows.push_back(S(
      "stream_empty_block",
      [j] {
        return StreamMsgs{Header(j), RawBlock(0, "")};
      },
      kInvalid, "block is empty"));
  rows.push_back(S(
      "stream_block_over_max_block_bytes",
      [] {
        const RandomJob tall = Job(200, 8);  // 32-byte rows; 130 of them = 4160 bytes
        return StreamMsgs{Header(tall), Block(tall, 0, 130)};
      },
      kInvalid, "block of 4160 bytes exceeds max_block_bytes 4096"));
  rows.push_back(S(
      "stream_block_over_transport_limit",
      [j] {
        return StreamMsgs{Header(j), RawBlock(0, std::string(kTransportLimit + 1024, '\0'))};
      },
      kInvalid, "exceeds max_block_bytes"));
  rows.push_back(S(
      "stream_block_runs_past_last_line",
      [j] {
        v1::MultiplyStreamRequest extra = Block(j, 8, 2);
        extra.mutable_block()->mutable_data()->append(j.matrix.substr(0, 32));
        return StreamMsgs{Header(j), Block(j, 0, 8), extra};
      },
      kInvalid, "block holds rows 8..10 but the matrix has only 10 rows"));
  rows.push_back(S(
      "stream_block_after_the_last_line",
      [j] {
        return StreamMsgs{Header(j), Block(j, 0, 10), Block(j, 0, 1, /*claimed_first=*/10)};
      },
      kInvalid, "block holds rows 10..10 but the matrix has only 10 rows"));
  rows.push_back(S(
      "stream_early_half_close",
      [j] {
        return StreamMsgs{Header(j), Block(j, 0, 4)};
      },
      kInvalid, "half-closed after 4 of 10 rows"));
  rows.push_back(S(
      "stream_half_close_after_header_only", [j] { return StreamMsgs{Header(j)}; }, kInvalid,
      "half-closed after 0 of 10 rows"));
  {
    Row r = S(
        "stream_header_then_nothing_until_deadline", [j] { return StreamMsgs{Header(j)}; },
        Code::DEADLINE_EXCEEDED, "eadline", /*half_close=*/false);
    r.deadline = milliseconds(1500);
    rows.push_back(r);
  }
  {
    Row r = S(
        "stream_blocks_then_nothing_until_deadline",
        [j] {
          return StreamMsgs{Header(j), Block(j, 0, 3)};
        },
        Code::DEADLINE_EXCEEDED, "eadline", /*half_close=*/false);
    r.deadline = milliseconds(1500);
    rows.push_back(r);
  }
  // Wire-level rows: MultiplyStream is decoded by hand (proto/wire.h).
  rows.push_back(S(
      "stream_block_bytes_are_not_a_block",
      [j] {
        v1::MultiplyStreamRequest garbage;
        // field 2 (data) claiming 2^21 bytes inside a 4-byte block
        return StreamMsgs{Header(j), WithRawField(garbage, 2, std::string("\x12\x80\x80\x80\x01"))};
      },
      kInvalid, "malformed MultiplyStreamRequest: block.data longer than the block"));
  rows.push_back(S(
      "stream_block_first_line_truncated",
      [j] {
        return StreamMsgs{Header(j), WithRawField(v1::MultiplyStreamRequest(), 2,
                                                  std::string("\x08\xff"))};
      },
      kInvalid, "malformed MultiplyStreamRequest: truncated block.first_line"));
  rows.push_back(S(
      "stream_block_with_its_data_twice",
      [j] {
        v1::Block twice;
        twice.set_data(j.matrix.substr(0, 32));
        std::string bytes = twice.SerializeAsString() + twice.SerializeAsString();
        return StreamMsgs{Header(j), WithRawField(v1::MultiplyStreamRequest(), 2, bytes)};
      },
      kInvalid, "block.data twice in one block"));
  rows.push_back(S(
      "stream_header_and_block_in_one_message",
      [j] {
        v1::Block block;
        block.set_data(j.matrix.substr(0, 32));
        return StreamMsgs{Header(j), WithRawField(Header(j), 2, block.SerializeAsString())};
      },
      kInvalid, "more than one header or block"));
  rows.push_back(S(
      "stream_empty_first_message", [] { return StreamMsgs{v1::MultiplyStreamRequest()}; },
      kInvalid, "neither a header nor a block"));
  {
    // Fields this server does not know are skipped, as protobuf does: a later
    // client may send them.
    const RandomJob small = Job(3, 5);
    Row r = S(
        "stream_unknown_fields_are_skipped",
        [small] {
          StreamMsgs msgs = WholeStream(small, 2);
          for (size_t i = 1; i < msgs.size(); ++i) {
            msgs[i] = WithRawField(msgs[i], 15, "future");
            msgs[i].mutable_block()->GetReflection()->MutableUnknownFields(
                msgs[i].mutable_block())->AddVarint(9, 42);
          }
          return msgs;
        },
        Code::OK, "");
    r.check = [small](const std::string& result) { return IeeeMismatch(small, result); };
    rows.push_back(r);
  }
  for (auto dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
    const RandomJob special = SpecialValuesJob(dtype, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT);
    Row r = S(
        std::string("stream_nan_inf_payload_computes_ieee_products_") +
            (dtype == v1::DTYPE_FLOAT32 ? "f32" : "f64"),
        [special] { return WholeStream(special, 1); }, Code::OK, "");
    r.check = [special](const std::string& result) { return IeeeMismatch(special, result); };
    rows.push_back(r);
  }
  return rows;
}

bool WaitUntil(const std::function<bool()>& pred, milliseconds timeout) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(milliseconds(20));
  }
  return pred();
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(const std::string& address,
                                                            const std::string& service) {
  auto health = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::health::v1::HealthCheckRequest req;
  req.set_service(service);
  grpc::health::v1::HealthCheckResponse resp;
  const grpc::Status s = health->Check(&ctx, req, &resp);
  EXPECT_TRUE(s.ok()) << s.error_message();
  return resp.status();
}

TEST(BadInputCatalogue, EveryRowGetsItsStatusAndTheServerStaysHealthy) {
  ServerProcess server(kServerFlags);
  auto stub = Connect(server.address());
  const std::vector<Row> rows = Catalogue();
  ASSERT_GE(rows.size(), 30u);

  int unary = 0;
  for (const Row& row : rows) {
    SCOPED_TRACE("row " + row.name);
    ASSERT_TRUE(static_cast<bool>(row.unary) != static_cast<bool>(row.stream)) << row.name;
    unary += row.unary ? 1 : 0;
    const Outcome out = row.unary
                            ? CallUnary(stub.get(), row.unary(), row.deadline)
                            : CallStream(stub.get(), row.stream(), row.half_close, row.deadline);
    EXPECT_EQ(out.status.error_code(), row.code) << row.name << ": got " << out.status.error_code()
                                                 << " \"" << out.status.error_message() << "\"";
    EXPECT_NE(out.status.error_message().find(row.fragment), std::string::npos)
        << row.name << ": message \"" << out.status.error_message() << "\" lacks \"" << row.fragment
        << "\"";
    if (row.check) {
      EXPECT_EQ(row.check(out.result), "") << row.name;
    }
    ASSERT_EQ(server.WaitForExit(0), -1)
        << "the server exited after row " << row.name << "; its log:\n"
        << server.Log();
  }
  std::printf("bad-input catalogue: %zu rows (%d Multiply, %zu MultiplyStream)\n", rows.size(),
              unary, rows.size() - unary);
  EXPECT_GE(unary, 10);
  EXPECT_GE(static_cast<int>(rows.size()) - unary, 10);

  // Healthy, nothing held, and still right.
  EXPECT_EQ(Health(server.address(), ""), grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_EQ(Health(server.address(), "dgmm.v1.Dgmm"),
            grpc::health::v1::HealthCheckResponse::SERVING);
  EXPECT_TRUE(WaitUntil([&] { return Reserved(stub.get()) == 0; }, milliseconds(5000)))
      << "reserved bytes after the catalogue: " << Reserved(stub.get());
  const v1::GetServerInfoResponse info = Info(stub.get());
  for (const auto& d : info.devices()) {
    EXPECT_EQ(d.queued_jobs(), 0);
    EXPECT_EQ(d.running_jobs(), 0);
    EXPECT_TRUE(d.in_service());
  }
  const RandomJob unary_job = Job(31, 29, v1::DTYPE_FLOAT64, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT);
  v1::MultiplyResponse response;
  const grpc::Status us = UnaryJob(stub.get(), unary_job, &response);
  ASSERT_TRUE(us.ok()) << us.error_message();
  EXPECT_LE(MaxRelError(unary_job, response.result()), 2.3e-16);
  const RandomJob stream_job = Job(300, 70, v1::DTYPE_FLOAT32);
  std::string result;
  const grpc::Status ss = StreamJob(stub.get(), stream_job, 13, &result, nullptr);
  ASSERT_TRUE(ss.ok()) << ss.error_message();
  EXPECT_LE(MaxRelError(stream_job, result), 1.2e-7);
}

// With the default limits the transport admits messages up to the unary
// limit (64 MiB), far above a block's 4 MiB: a block message over
// max_block_bytes plus its framing slack is refused as soon as it is read,
// before it is queued behind the blocks in compute.
TEST(BadInputCatalogue, OversizedBlockMessageIsRefusedAsItArrives) {
  ServerProcess server({"--backend=cpu", "--threads=2"});
  auto stub = Connect(server.address());
  const RandomJob job = Job(8, 4);  // 16-byte rows
  const std::string data((int64_t{4} << 20) + (int64_t{128} << 10), '\0');
  const Outcome out = CallStream(stub.get(), StreamMsgs{Header(job), RawBlock(0, data)},
                                 /*half_close=*/true, milliseconds(15000));
  EXPECT_EQ(out.status.error_code(), kInvalid) << out.status.error_message();
  EXPECT_NE(out.status.error_message().find("exceeds max_block_bytes 4194304 plus 65536 bytes"),
            std::string::npos)
      << out.status.error_message();
  EXPECT_TRUE(WaitUntil([&] { return Reserved(stub.get()) == 0; }, milliseconds(5000)));
}

}  // namespace
}  // namespace dgmm::testing
