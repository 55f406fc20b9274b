// The request validator, case by case: every malformed header gets
// INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for shapes over the limits) with a
// message that says what was wrong and what was expected.
#include "service/job/validator.h"

#include <algorithm>
#include <limits>
#include <string>

#include "gtest/gtest.h"

namespace dgmm {
namespace {

v1::JobHeader Header(int64_t rows, int64_t cols, v1::DType dtype = v1::DTYPE_FLOAT32,
                     v1::Side side = v1::SIDE_RIGHT) {
  v1::JobHeader h;
  h.set_rows(rows);
  h.set_cols(cols);
  h.set_dtype(dtype);
  h.set_side(side);
  const int64_t n = std::max<int64_t>(0, side == v1::SIDE_LEFT ? rows : cols);
  const int64_t size = dtype == v1::DTYPE_FLOAT64 ? 8 : 4;
  h.set_diagonal(std::string(static_cast<std::size_t>(n * size), '\x01'));
  return h;
}

void ExpectError(const absl::StatusOr<JobRequest>& r, absl::StatusCode code,
                 const std::string& fragment) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), code) << r.status();
  EXPECT_NE(std::string(r.status().message()).find(fragment), std::string::npos)
      << "message: " << r.status().message() << "\nexpected to contain: " << fragment;
}

TEST(ValidateHeader, AcceptsWellFormedHeaderAndAppliesDefaults) {
  v1::JobHeader h = Header(3, 5);
  h.clear_side();
  auto r = ValidateHeader(h, RequestLimits{}, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->problem.rows, 3);
  EXPECT_EQ(r->problem.cols, 5);
  EXPECT_EQ(r->problem.layout, Layout::kRowMajor);
  EXPECT_EQ(r->problem.side, Side::kRight);
  EXPECT_FALSE(r->backend.has_value());
  EXPECT_EQ(r->diagonal.size(), 20u);
}

TEST(ValidateHeader, RejectsZeroAndNegativeDims) {
  ExpectError(ValidateHeader(Header(0, 5), {}, false), absl::StatusCode::kInvalidArgument,
              "rows and cols must both be >= 1");
  ExpectError(ValidateHeader(Header(4, -2), {}, false), absl::StatusCode::kInvalidArgument,
              "4x-2");
}

TEST(ValidateHeader, RejectsUnsetAndUnknownDType) {
  v1::JobHeader h = Header(2, 2);
  h.set_dtype(v1::DTYPE_UNSPECIFIED);
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "dtype is not set");
  h.set_dtype(static_cast<v1::DType>(7));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "unknown dtype 7");
}

TEST(ValidateHeader, RejectsUnknownLayoutSideAndBackend) {
  v1::JobHeader h = Header(2, 2);
  h.set_layout(static_cast<v1::Layout>(9));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "unknown layout 9");
  h = Header(2, 2);
  h.set_side(static_cast<v1::Side>(-1));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "unknown side -1");
  h = Header(2, 2);
  h.set_backend(static_cast<v1::Backend>(42));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "unknown backend 42");
}

TEST(ValidateHeader, RejectsShapeWhoseByteCountOverflows) {
  v1::JobHeader h = Header(1, 1);
  h.set_rows(int64_t{1} << 40);
  h.set_cols(int64_t{1} << 40);
  h.clear_diagonal();
  RequestLimits huge;
  huge.max_dim = std::numeric_limits<int64_t>::max();
  ExpectError(ValidateHeader(h, huge, false), absl::StatusCode::kInvalidArgument,
              "overflows a 64-bit byte count");
  // Elements fit, bytes do not.
  h.set_rows(int64_t{1} << 31);
  h.set_cols(int64_t{1} << 31);
  h.set_dtype(v1::DTYPE_FLOAT64);
  ExpectError(ValidateHeader(h, huge, false), absl::StatusCode::kInvalidArgument,
              "overflows");
}

TEST(ValidateHeader, ShapeOverMaxDimIsResourceExhausted) {
  RequestLimits limits;
  limits.max_dim = 100;
  ExpectError(ValidateHeader(Header(101, 3), limits, false),
              absl::StatusCode::kResourceExhausted, "limit of 100");
}

TEST(ValidateHeader, DiagonalLengthMustMatchTheSide) {
  v1::JobHeader h = Header(3, 5, v1::DTYPE_FLOAT32, v1::SIDE_LEFT);
  h.set_diagonal(std::string(20, '\0'));  // cols elements, but LEFT needs rows
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "needs 3 elements (one per row) = 12 bytes");
  h = Header(3, 5, v1::DTYPE_FLOAT64);
  h.set_diagonal(std::string(39, '\0'));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "diagonal has 39 bytes");
}

TEST(ValidateHeader, StreamedLineMustFitInABlock) {
  RequestLimits limits;
  limits.max_block_bytes = 64;
  ExpectError(ValidateHeader(Header(2, 17), limits, true), absl::StatusCode::kInvalidArgument,
              "over the server's max block of 64");
  EXPECT_TRUE(ValidateHeader(Header(2, 16), limits, true).ok());
  EXPECT_TRUE(ValidateHeader(Header(2, 17), limits, false).ok());
}

TEST(ValidateMatrixPayload, RejectsWrongLength) {
  Problem p{.rows = 3, .cols = 4, .dtype = DType::kFloat64};
  EXPECT_TRUE(ValidateMatrixPayload(p, 96).ok());
  absl::Status s = ValidateMatrixPayload(p, 95);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("needs rows*cols*8 = 96 bytes"), std::string::npos) << s;
}

TEST(StreamAssembler, AcceptsInOrderWholeLinesAndRequiresEveryLine) {
  Problem p{.rows = 5, .cols = 2, .dtype = DType::kFloat32};  // lines of 8 bytes
  StreamAssembler a(p, 16);
  EXPECT_EQ(*a.Accept(0, 16), 2);
  EXPECT_EQ(a.Finish().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*a.Accept(2, 16), 2);
  EXPECT_EQ(*a.Accept(4, 8), 1);
  EXPECT_TRUE(a.Finish().ok());
}

TEST(StreamAssembler, RejectsGapsPartialLinesEmptyOversizedAndExtraBlocks) {
  Problem p{.rows = 4, .cols = 2, .dtype = DType::kFloat32};
  StreamAssembler a(p, 16);
  EXPECT_NE(std::string(a.Accept(1, 8).status().message()).find("starts at row 1"),
            std::string::npos);
  EXPECT_NE(std::string(a.Accept(0, 12).status().message()).find("not a whole number"),
            std::string::npos);
  EXPECT_NE(std::string(a.Accept(0, 0).status().message()).find("empty"), std::string::npos);
  EXPECT_NE(std::string(a.Accept(0, 24).status().message()).find("exceeds max_block_bytes"),
            std::string::npos);
  ASSERT_TRUE(a.Accept(0, 16).ok());
  ASSERT_TRUE(a.Accept(2, 16).ok());
  auto extra = a.Accept(4, 8);
  EXPECT_EQ(extra.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(extra.status().message()).find("only 4 rows"), std::string::npos)
      << extra.status();
}

TEST(StreamAssembler, RejectsSizesThatWouldWrapNegative) {
  // Found by tests/fuzz/stream_assembler_fuzzer: 2^63 + k bytes used to pass
  // as a negative line count.
  Problem p{.rows = 1, .cols = 1, .dtype = DType::kFloat32};
  StreamAssembler a(p, 4);
  auto r = a.Accept(0, std::size_t{18374686479671623680u});
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(a.lines_received(), 0);
}

TEST(StreamAssembler, ColumnMajorBlocksHoldColumns) {
  Problem p{.rows = 3, .cols = 4, .dtype = DType::kFloat64, .layout = Layout::kColMajor};
  StreamAssembler a(p, 1 << 20);
  EXPECT_EQ(*a.Accept(0, 48), 2);  // a column is 3 doubles = 24 bytes
  auto bad = a.Accept(3, 24);
  EXPECT_NE(std::string(bad.status().message()).find("starts at column 3"), std::string::npos);
}

}  // namespace
}  // namespace dgmm
