// The request validator, case by case: every malformed header gets
// INVALID_ARGUMENT (or RESOURCE_EXHAUSTED for shapes over the limits) with a
// message that says what was wrong and what was expected.
#include "service/core/validator.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>

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

// ------------------------------------------------ element types

int64_t WireSize(v1::DType t) {
  switch (t) {
    case v1::DTYPE_FLOAT16:
    case v1::DTYPE_BFLOAT16:
      return 2;
    case v1::DTYPE_FLOAT32:
      return 4;
    case v1::DTYPE_FLOAT64:
    case v1::DTYPE_COMPLEX64:
      return 8;
    case v1::DTYPE_COMPLEX128:
      return 16;
    default:
      return 0;
  }
}

// A header of `a` with diagonals of `d` of the right lengths for `side`.
v1::JobHeader TypedHeader(int64_t rows, int64_t cols, v1::DType a, v1::DType d, v1::Side side) {
  v1::JobHeader h;
  h.set_rows(rows);
  h.set_cols(cols);
  h.set_dtype(a);
  h.set_diagonal_dtype(d);
  h.set_side(side);
  const int64_t n = side == v1::SIDE_RIGHT ? cols : rows;
  h.set_diagonal(std::string(static_cast<size_t>(n * WireSize(d)), '\x01'));
  if (side == v1::SIDE_BOTH) {
    h.set_right_diagonal(std::string(static_cast<size_t>(cols * WireSize(d)), '\x02'));
  }
  return h;
}

TEST(ValidateHeader, EveryDTypeMapsToItsScalarWithItsSizes) {
  const std::pair<v1::DType, DType> all[] = {
      {v1::DTYPE_FLOAT16, DType::kFloat16},     {v1::DTYPE_BFLOAT16, DType::kBFloat16},
      {v1::DTYPE_FLOAT32, DType::kFloat32},     {v1::DTYPE_FLOAT64, DType::kFloat64},
      {v1::DTYPE_COMPLEX64, DType::kComplex64}, {v1::DTYPE_COMPLEX128, DType::kComplex128}};
  for (const auto& [wire, type] : all) {
    v1::JobHeader h = TypedHeader(3, 5, wire, v1::DTYPE_UNSPECIFIED, v1::SIDE_RIGHT);
    h.set_diagonal(std::string(static_cast<size_t>(5 * WireSize(wire)), '\x01'));
    auto r = ValidateHeader(h, {}, false);
    ASSERT_TRUE(r.ok()) << v1::DType_Name(wire) << ": " << r.status();
    EXPECT_EQ(r->problem.dtype, type);
    EXPECT_EQ(r->problem.diag_dtype(), type);
    EXPECT_EQ(r->problem.out_dtype(), type);
    EXPECT_EQ(r->problem.matrix_bytes(), 15 * WireSize(wire));
    EXPECT_EQ(r->problem.out_matrix_bytes(), 15 * WireSize(wire));
    EXPECT_EQ(r->problem.diag_bytes(), 5 * WireSize(wire));
  }
  v1::JobHeader h = Header(2, 2);
  h.set_dtype(static_cast<v1::DType>(7));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "unknown dtype 7; expected DTYPE_FLOAT32 (1), DTYPE_FLOAT64 (2), DTYPE_FLOAT16 (3)");
  h = Header(2, 2);
  h.set_diagonal_dtype(static_cast<v1::DType>(9));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "unknown diagonal_dtype 9");
  h = Header(2, 2);
  h.set_result_dtype(static_cast<v1::DType>(-1));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "unknown result_dtype -1");
}

TEST(ValidateHeader, ADiagonalPromotedIntoTheMatrixDTypeIsTaken) {
  // (A, d): NumPy's result_type(A, d) is A.
  const std::pair<v1::DType, v1::DType> taken[] = {
      {v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT32},     {v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT16},
      {v1::DTYPE_FLOAT32, v1::DTYPE_BFLOAT16},    {v1::DTYPE_COMPLEX64, v1::DTYPE_FLOAT32},
      {v1::DTYPE_COMPLEX64, v1::DTYPE_FLOAT16},   {v1::DTYPE_COMPLEX128, v1::DTYPE_FLOAT64},
      {v1::DTYPE_COMPLEX128, v1::DTYPE_COMPLEX64}};
  for (const auto& [a, d] : taken) {
    auto r = ValidateHeader(TypedHeader(4, 3, a, d, v1::SIDE_LEFT), {}, false);
    ASSERT_TRUE(r.ok()) << v1::DType_Name(a) << " with " << v1::DType_Name(d) << ": " << r.status();
    EXPECT_EQ(static_cast<int>(r->problem.out_dtype()), static_cast<int>(r->problem.dtype));
    EXPECT_EQ(r->problem.diag_bytes(), 4 * WireSize(d));
    EXPECT_FALSE(r->problem.plain());
  }
  // The result stated as the promoted type is the same job.
  v1::JobHeader h = TypedHeader(4, 3, v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT32, v1::SIDE_RIGHT);
  h.set_result_dtype(v1::DTYPE_FLOAT64);
  EXPECT_TRUE(ValidateHeader(h, {}, false).ok());
}

TEST(ValidateHeader, AResultOfAWiderDTypeThanTheMatrixIsTaken) {
  // (A, d, C): NumPy's result_type(A, d) is C, wider than A.
  const std::tuple<v1::DType, v1::DType, DType> promoted[] = {
      {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64, DType::kFloat64},
      {v1::DTYPE_FLOAT16, v1::DTYPE_FLOAT32, DType::kFloat32},
      {v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16, DType::kFloat32},
      {v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16, DType::kFloat32},
      {v1::DTYPE_FLOAT32, v1::DTYPE_COMPLEX64, DType::kComplex64},
      {v1::DTYPE_FLOAT64, v1::DTYPE_COMPLEX64, DType::kComplex128},
      {v1::DTYPE_FLOAT32, v1::DTYPE_COMPLEX128, DType::kComplex128},
      {v1::DTYPE_FLOAT16, v1::DTYPE_COMPLEX64, DType::kComplex64}};
  for (const auto& [a, d, c] : promoted) {
    auto r = ValidateHeader(TypedHeader(4, 3, a, d, v1::SIDE_LEFT), {}, false);
    ASSERT_TRUE(r.ok()) << v1::DType_Name(a) << " with " << v1::DType_Name(d) << ": " << r.status();
    EXPECT_EQ(static_cast<int>(r->problem.out_dtype()), static_cast<int>(c)) << v1::DType_Name(a);
    EXPECT_EQ(r->problem.matrix_bytes(), 12 * WireSize(a));
    EXPECT_EQ(r->problem.out_matrix_bytes(), 12 * static_cast<int64_t>(ElementSize(c)));
    EXPECT_FALSE(r->problem.plain());
  }
  // A stated wider result: a type the promotion widens to exactly.
  v1::JobHeader h = TypedHeader(2, 3, v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT32, v1::SIDE_RIGHT);
  h.set_result_dtype(v1::DTYPE_FLOAT64);
  auto r = ValidateHeader(h, {}, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(static_cast<int>(r->problem.out_dtype()), static_cast<int>(DType::kFloat64));
  h.set_result_dtype(v1::DTYPE_COMPLEX128);
  r = ValidateHeader(h, {}, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->problem.out_line_bytes(), 3 * 16);
  h = TypedHeader(2, 3, v1::DTYPE_FLOAT16, v1::DTYPE_FLOAT16, v1::SIDE_BOTH);
  h.set_result_dtype(v1::DTYPE_COMPLEX128);
  EXPECT_TRUE(ValidateHeader(h, {}, false).ok());
}

TEST(ValidateHeader, AStatedResultThePromotionCannotWidenToIsRefusedAndSaysSo) {
  // A stated result narrower than the promotion cannot hold the product.
  v1::JobHeader h = TypedHeader(2, 3, v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT64, v1::SIDE_RIGHT);
  h.set_result_dtype(v1::DTYPE_FLOAT32);
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "result_dtype float32 cannot hold the product of a float64 matrix and a float64 "
              "diagonal: their result type (NumPy's result_type) is float64");
  h = TypedHeader(2, 3, v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64, v1::SIDE_RIGHT);
  h.set_result_dtype(v1::DTYPE_FLOAT32);
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "result_dtype float32 cannot hold the product of a float32 matrix and a float64 "
              "diagonal: their result type (NumPy's result_type) is float64");
  h = TypedHeader(2, 3, v1::DTYPE_COMPLEX64, v1::DTYPE_COMPLEX64, v1::SIDE_RIGHT);
  h.set_result_dtype(v1::DTYPE_FLOAT64);
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "result_dtype float64 cannot hold");
  // float16 with bfloat16 is float32: neither half type holds it.
  h = TypedHeader(2, 3, v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16, v1::SIDE_RIGHT);
  h.set_result_dtype(v1::DTYPE_BFLOAT16);
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "result_dtype bfloat16 cannot hold");
  // cuBLAS has no dgmm of a promoted result.
  h = TypedHeader(2, 3, v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64, v1::SIDE_RIGHT);
  h.set_backend(v1::BACKEND_CUBLAS);
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "a float32 matrix with a float64 diagonal and a float64 result");
}

TEST(ValidateHeader, SideBothNeedsBothDiagonalsOfTheirLengths) {
  auto r = ValidateHeader(TypedHeader(4, 3, v1::DTYPE_COMPLEX64, v1::DTYPE_FLOAT32, v1::SIDE_BOTH),
                          {}, false);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->problem.side, Side::kBoth);
  EXPECT_EQ(r->diagonal.size(), 16u);
  EXPECT_EQ(r->right_diagonal.size(), 12u);
  EXPECT_EQ(r->problem.right_diag_bytes(), 12);

  v1::JobHeader h = TypedHeader(4, 3, v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT32, v1::SIDE_BOTH);
  h.clear_right_diagonal();
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "right_diagonal has 0 bytes but side both of a 4x3 matrix needs 3 float32 "
              "elements (one per column) = 12 bytes");
  h = TypedHeader(4, 3, v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT32, v1::SIDE_BOTH);
  h.set_diagonal(std::string(12, '\0'));  // cols, but the left one needs rows
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "diagonal has 12 bytes but side both of a 4x3 float32 matrix needs 4 elements");
  h = TypedHeader(4, 3, v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT32, v1::SIDE_LEFT);
  h.set_right_diagonal(std::string(12, '\0'));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "right_diagonal is for SIDE_BOTH only");
  h = TypedHeader(4, 3, v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT16, v1::SIDE_RIGHT);
  h.set_diagonal(std::string(24, '\0'));  // float64-sized, but d is float16
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "side right of a 4x3 float64 matrix with a float16 diagonal needs 3 elements (one "
              "per column) = 6 bytes");
  h = TypedHeader(4, 3, v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT32, v1::SIDE_BOTH);
  h.set_side(static_cast<v1::Side>(4));
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "expected SIDE_RIGHT (1), SIDE_LEFT (2) or SIDE_BOTH (3)");
}

TEST(ValidateHeader, CublasTakesOneDTypeOfItsFourAndOneSideOnly) {
  for (v1::DType t :
       {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64, v1::DTYPE_COMPLEX64, v1::DTYPE_COMPLEX128}) {
    v1::JobHeader h = TypedHeader(3, 2, t, t, v1::SIDE_LEFT);
    h.set_backend(v1::BACKEND_CUBLAS);
    auto r = ValidateHeader(h, {}, false);
    EXPECT_TRUE(r.ok()) << v1::DType_Name(t) << ": " << r.status();
  }
  for (v1::DType t : {v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    v1::JobHeader h = TypedHeader(3, 2, t, t, v1::SIDE_LEFT);
    h.set_backend(v1::BACKEND_CUBLAS);
    ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
                "BACKEND_CUBLAS runs cuBLAS's S, D, C and Z dgmm");
  }
  v1::JobHeader h = TypedHeader(3, 2, v1::DTYPE_FLOAT64, v1::DTYPE_FLOAT32, v1::SIDE_LEFT);
  h.set_backend(v1::BACKEND_CUBLAS);
  ExpectError(
      ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
      "this job is a float64 matrix with a float32 diagonal and a float64 result, side left");
  h = TypedHeader(3, 2, v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT32, v1::SIDE_BOTH);
  h.set_backend(v1::BACKEND_CUBLAS);
  ExpectError(ValidateHeader(h, {}, false), absl::StatusCode::kInvalidArgument,
              "side both. Use BACKEND_CUDA_KERNEL, BACKEND_CPU or BACKEND_AUTO");
  // The same jobs on the kernel are fine.
  h.set_backend(v1::BACKEND_CUDA_KERNEL);
  EXPECT_TRUE(ValidateHeader(h, {}, false).ok());
}

TEST(ValidateHeader, StreamedLinesAreCountedInTheMatrixDType) {
  RequestLimits limits;
  limits.max_block_bytes = 64;
  // 4 complex128 = 64 bytes fit; 5 do not.
  EXPECT_TRUE(
      ValidateHeader(TypedHeader(2, 4, v1::DTYPE_COMPLEX128, v1::DTYPE_FLOAT16, v1::SIDE_RIGHT),
                     limits, true)
          .ok());
  ExpectError(
      ValidateHeader(TypedHeader(2, 5, v1::DTYPE_COMPLEX128, v1::DTYPE_FLOAT16, v1::SIDE_RIGHT),
                     limits, true),
      absl::StatusCode::kInvalidArgument, "one row line of this matrix is 80 bytes");
  // 32 float16 = 64 bytes fit.
  EXPECT_TRUE(
      ValidateHeader(TypedHeader(2, 32, v1::DTYPE_FLOAT16, v1::DTYPE_FLOAT16, v1::SIDE_BOTH),
                     limits, true)
          .ok());
}

TEST(PrepareDiagonals, WidensExactlyToTheResultComputeTypeAndAlignsTheRightOne) {
  // float16 A and d: the diagonals become float32 (the compute type).
  Problem p{.rows = 3, .cols = 2, .dtype = DType::kFloat16, .side = Side::kBoth};
  const uint16_t left[3] = {0x3c00 /*1*/, 0x0001 /*2^-24*/, 0xfc00 /*-inf*/};
  const uint16_t right[2] = {0x7bff /*65504*/, 0x8000 /*-0*/};
  const std::string prepared =
      PrepareDiagonals(p, absl::string_view(reinterpret_cast<const char*>(left), 6),
                       absl::string_view(reinterpret_cast<const char*>(right), 4));
  ASSERT_EQ(static_cast<int64_t>(prepared.size()), p.prepared_diag_bytes());
  EXPECT_EQ(p.right_diag_offset(), kPreparedDiagAlign);
  EXPECT_EQ(p.prepared_diag_bytes(), kPreparedDiagAlign + 8);
  float l[3], r[2];
  std::memcpy(l, prepared.data(), 12);
  std::memcpy(r, prepared.data() + p.right_diag_offset(), 8);
  EXPECT_EQ(l[0], 1.0f);
  EXPECT_EQ(l[1], std::ldexp(1.0f, -24));
  EXPECT_EQ(l[2], -std::numeric_limits<float>::infinity());
  EXPECT_EQ(r[0], 65504.0f);
  EXPECT_TRUE(std::signbit(r[1]) && r[1] == 0.0f);

  // float32 d promoted into complex128 A: imaginary parts +0.
  Problem q{.rows = 2, .cols = 2, .dtype = DType::kComplex128, .side = Side::kLeft};
  q.diagonal_dtype = DType::kFloat32;
  const float d[2] = {0.1f, -3.0f};
  const std::string widened =
      PrepareDiagonals(q, absl::string_view(reinterpret_cast<const char*>(d), 8), {});
  ASSERT_EQ(widened.size(), 32u);
  double w[4];
  std::memcpy(w, widened.data(), 32);
  EXPECT_EQ(w[0], static_cast<double>(0.1f));
  EXPECT_EQ(w[1], 0.0);
  EXPECT_FALSE(std::signbit(w[1]));
  EXPECT_EQ(w[2], -3.0);
  EXPECT_EQ(w[3], 0.0);

  // A plain job's diagonal is its bytes as sent.
  Problem plain{.rows = 2, .cols = 3, .dtype = DType::kFloat64, .side = Side::kRight};
  const double pd[3] = {1.5, -2.25, 1e300};
  EXPECT_EQ(PrepareDiagonals(plain, absl::string_view(reinterpret_cast<const char*>(pd), 24), {}),
            std::string(reinterpret_cast<const char*>(pd), 24));
}

}  // namespace
}  // namespace dgmm
