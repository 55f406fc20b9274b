// The zero-copy encoders and decoders agree with the generated proto classes.
#include "proto/wire.h"

#include <cstring>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dgmm::wire {
namespace {

using ::testing::HasSubstr;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// A ByteBuffer of `bytes` cut into slices of `piece` bytes, so decoders are
// exercised across slice boundaries.
grpc::ByteBuffer Buffer(const std::string& bytes, size_t piece = 7) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < bytes.size(); i += piece) {
    slices.emplace_back(bytes.data() + i, std::min(piece, bytes.size() - i));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

v1::JobHeader SampleHeader() {
  v1::JobHeader h;
  h.set_rows(3);
  h.set_cols(2);
  h.set_dtype(v1::DTYPE_FLOAT32);
  h.set_layout(v1::LAYOUT_COL_MAJOR);
  h.set_side(v1::SIDE_LEFT);
  h.set_diagonal(std::string(12, '\x01'));
  h.set_backend(v1::BACKEND_CPU);
  return h;
}

TEST(WireTest, MultiplyRequestParsesAsTheGeneratedMessageAndBorrowsTheMatrix) {
  const std::string matrix(24, 'm');
  SliceLoans loans;
  std::string encoded;
  {
    grpc::ByteBuffer buffer =
        EncodeMultiplyRequest(SampleHeader(), matrix.data(), matrix.size(), &loans);
    encoded = Flatten(buffer);
  }
  loans.WaitUntilReturned();  // Returns once the buffer is gone.
  v1::MultiplyRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(encoded));
  EXPECT_EQ(parsed.header().SerializeAsString(), SampleHeader().SerializeAsString());
  EXPECT_EQ(parsed.matrix(), matrix);
}

TEST(WireTest, StreamHeaderAndBlocksParseAsTheGeneratedMessages) {
  v1::MultiplyStreamRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(EncodeStreamHeader(SampleHeader()))));
  ASSERT_TRUE(parsed.has_header());
  EXPECT_EQ(parsed.header().rows(), 3);

  SliceLoans loans;
  const std::string data(300, 'x');  // Lengths past one varint byte.
  for (int64_t first_line : {int64_t{0}, int64_t{5}, int64_t{1} << 40}) {
    ASSERT_TRUE(parsed.ParseFromString(
        Flatten(EncodeStreamBlock(first_line, data.data(), data.size(), &loans))));
    ASSERT_TRUE(parsed.has_block());
    EXPECT_EQ(parsed.block().first_line(), first_line);
    EXPECT_EQ(parsed.block().data(), data);
  }
}

TEST(WireTest, DecodesMultiplyResponseStraightIntoTheOutput) {
  v1::MultiplyResponse response;
  response.set_result(std::string(40, 'r'));
  response.mutable_stats()->set_device("cpu");
  response.mutable_stats()->set_job_id(42);
  grpc::ByteBuffer buffer = Buffer(response.SerializeAsString());
  std::string out(40, '\0');
  v1::JobStats stats;
  ASSERT_TRUE(DecodeMultiplyResponse(&buffer, out.data(), out.size(), &stats).ok());
  EXPECT_EQ(out, response.result());
  EXPECT_EQ(stats.job_id(), 42u);
  EXPECT_EQ(stats.device(), "cpu");
}

TEST(WireTest, MultiplyResponseOfTheWrongSizeIsInternal) {
  v1::MultiplyResponse response;
  response.set_result(std::string(39, 'r'));
  grpc::ByteBuffer buffer = Buffer(response.SerializeAsString());
  std::string out(40, '\0');
  v1::JobStats stats;
  absl::Status s = DecodeMultiplyResponse(&buffer, out.data(), out.size(), &stats);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(s.message()), HasSubstr("39 bytes"));
}

TEST(WireTest, DecodesEachKindOfStreamResponse) {
  std::string out(64, '.');
  std::vector<std::pair<int64_t, size_t>> placed;
  BlockPlacer placer = [&](int64_t first_line, size_t size) -> absl::StatusOr<void*> {
    placed.emplace_back(first_line, size);
    return out.data() + first_line * 8;
  };

  v1::MultiplyStreamResponse message;
  message.mutable_accepted()->set_job_id(7);
  message.mutable_accepted()->set_max_block_bytes(4096);
  grpc::ByteBuffer accepted = Buffer(message.SerializeAsString());
  absl::StatusOr<StreamResponse> r = DecodeStreamResponse(&accepted, placer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, StreamResponse::Kind::kAccepted);
  EXPECT_EQ(r->accepted.max_block_bytes(), 4096);

  // first_line 0 is omitted on the wire; a later block carries it.
  for (int64_t line : {0, 2}) {
    message.mutable_block()->set_first_line(line);
    message.mutable_block()->set_data(std::string(16, static_cast<char>('a' + line)));
    grpc::ByteBuffer block = Buffer(message.SerializeAsString(), 3);
    r = DecodeStreamResponse(&block, placer);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->kind, StreamResponse::Kind::kBlock);
    EXPECT_EQ(r->first_line, line);
    EXPECT_EQ(r->size, 16u);
  }
  EXPECT_EQ(out.substr(0, 32), std::string(16, 'a') + std::string(16, 'c'));
  EXPECT_EQ(placed, (std::vector<std::pair<int64_t, size_t>>{{0, 16}, {2, 16}}));

  message.mutable_stats()->set_compute_ns(99);
  grpc::ByteBuffer stats = Buffer(message.SerializeAsString());
  r = DecodeStreamResponse(&stats, placer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, StreamResponse::Kind::kStats);
  EXPECT_EQ(r->stats.compute_ns(), 99);
}

TEST(WireTest, StreamResponseDecodingReportsThePlacersErrorAndGarbage) {
  v1::MultiplyStreamResponse message;
  message.mutable_block()->set_first_line(3);
  message.mutable_block()->set_data("abcd");
  grpc::ByteBuffer block = Buffer(message.SerializeAsString());
  absl::StatusOr<StreamResponse> r = DecodeStreamResponse(
      &block,
      [](int64_t, size_t) -> absl::StatusOr<void*> { return absl::InternalError("no room"); });
  EXPECT_EQ(r.status().message(), "no room");

  grpc::ByteBuffer garbage = Buffer(std::string("\x12\xff\xff\x01xyz", 7));
  r = DecodeStreamResponse(&garbage,
                           [](int64_t, size_t) -> absl::StatusOr<void*> { return nullptr; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);

  grpc::ByteBuffer empty = Buffer(std::string());
  r = DecodeStreamResponse(&empty,
                           [](int64_t, size_t) -> absl::StatusOr<void*> { return nullptr; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
}

// ------------------------------------------------- the server's side (stream)

TEST(WireTest, StreamRequestDecodesHeadersAndBlocksAcrossSliceBoundaries) {
  std::vector<std::pair<int64_t, size_t>> placed;
  std::string out(400, '.');
  BlockPlacer placer = [&](int64_t first_line, size_t size) -> absl::StatusOr<void*> {
    placed.emplace_back(first_line, size);
    return out.data();
  };
  grpc::ByteBuffer header = Buffer(Flatten(EncodeStreamHeader(SampleHeader())), 5);
  absl::StatusOr<StreamRequest> r = DecodeStreamRequest(&header, placer);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->kind, StreamRequest::Kind::kHeader);
  EXPECT_EQ(r->header.SerializeAsString(), SampleHeader().SerializeAsString());
  EXPECT_TRUE(placed.empty());

  SliceLoans loans;
  for (int64_t first_line : {int64_t{0}, int64_t{9}, int64_t{1} << 40}) {
    std::string data(300, '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + first_line);
    grpc::ByteBuffer block =
        Buffer(Flatten(EncodeStreamBlock(first_line, data.data(), data.size(), &loans)), 7);
    placed.clear();
    r = DecodeStreamRequest(&block, placer);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->kind, StreamRequest::Kind::kBlock);
    EXPECT_EQ(r->first_line, first_line);
    EXPECT_EQ(r->size, 300u);
    EXPECT_EQ(out.substr(0, 300), data);
    EXPECT_EQ(placed, (std::vector<std::pair<int64_t, size_t>>{{first_line, 300}}));
  }
}

TEST(WireTest, StreamRequestWithTheLineAfterTheDataIsPlacedOnceWithoutStaging) {
  // Legal protobuf, though no serializer writes it: data (field 2) first.
  const std::string data = "0123456789abcdef";
  std::string inner = std::string("\x12\x10") + data + "\x08\x05";
  std::string bytes = std::string("\x12") + static_cast<char>(inner.size()) + inner;
  grpc::ByteBuffer block = Buffer(bytes, 3);
  std::string out(16, '.');
  int calls = 0;
  absl::StatusOr<StreamRequest> r =
      DecodeStreamRequest(&block, [&](int64_t first_line, size_t size) -> absl::StatusOr<void*> {
        ++calls;
        EXPECT_EQ(first_line, 0);  // not seen yet
        EXPECT_EQ(size, 16u);
        return out.data();
      });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(r->first_line, 5);
  EXPECT_EQ(out, data);
}

TEST(WireTest, StreamRequestErrorsAreInvalidArgumentAndARefusedBlockIsNotCopied) {
  SliceLoans loans;
  const std::string data(64, 'd');
  grpc::ByteBuffer block = EncodeStreamBlock(2, data.data(), data.size(), &loans);
  absl::StatusOr<StreamRequest> r = DecodeStreamRequest(
      &block, [](int64_t, size_t) -> absl::StatusOr<void*> {
        return absl::InvalidArgumentError("too big");
      });
  EXPECT_EQ(r.status(), absl::InvalidArgumentError("too big"));

  auto never = [](int64_t, size_t) -> absl::StatusOr<void*> {
    ADD_FAILURE() << "placer called for a malformed message";
    return nullptr;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("\x12\x05\x12\x80\x80\x80\x01", 7), "block.data longer than the block"},
      {std::string("\x12\x7f\x08\x01", 4), "block longer than the message"},
      {std::string("\x12\x02\x08\xff", 4), "truncated block.first_line"},
      // A block length of 2^32 + 2, which a 32-bit read would take for 2.
      {std::string("\x12\x82\x80\x80\x80\x10\x08\x01", 8), "block longer than the message"},
      {std::string("\x0a\x7f\x08\x01", 4), "bad header"},
      {std::string("\x0a\x02\x08", 3), "bad header"},
      {std::string("\xff\xff", 2), "malformed MultiplyStreamRequest"},
      {std::string(), "neither a header nor a block"},
  };
  for (const auto& [bytes, fragment] : cases) {
    grpc::ByteBuffer buffer = Buffer(bytes, 2);
    r = DecodeStreamRequest(&buffer, never);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(fragment));
  }
  // Two members of the oneof in one message.
  const std::string two = Flatten(EncodeStreamHeader(SampleHeader())) +
                          Flatten(EncodeStreamBlock(0, data.data(), data.size(), &loans));
  grpc::ByteBuffer both = Buffer(two);
  r = DecodeStreamRequest(&both, never);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("more than one header or block"));
}

TEST(WireTest, ServerBlocksAndSmallMessagesParseAsTheGeneratedResponse) {
  const std::string data(1000, 'r');
  v1::MultiplyStreamResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(EncodeStreamBlock(77, grpc::Slice(data)))));
  ASSERT_TRUE(parsed.has_block());
  EXPECT_EQ(parsed.block().first_line(), 77);
  EXPECT_EQ(parsed.block().data(), data);

  v1::MultiplyStreamResponse stats;
  stats.mutable_stats()->set_bytes_in(5);
  ASSERT_TRUE(parsed.ParseFromString(Flatten(EncodeMessage(stats))));
  EXPECT_EQ(parsed.stats().bytes_in(), 5);
}

// --------------------------------------------------- the server's side (unary)

TEST(WireTest, UnaryRequestIsPeekedWithoutCopyingAndCopiedOnce) {
  std::string matrix(24, '\0');
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<char>(i * 11);
  SliceLoans loans;
  grpc::ByteBuffer encoded =
      Buffer(Flatten(EncodeMultiplyRequest(SampleHeader(), matrix.data(), matrix.size(), &loans)),
             5);
  absl::StatusOr<MultiplyRequestView> view = PeekMultiplyRequest(encoded);
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_EQ(view->header.SerializeAsString(), SampleHeader().SerializeAsString());
  EXPECT_TRUE(view->has_matrix);
  EXPECT_EQ(view->matrix_bytes, 24u);
  std::string out(24, '.');
  ASSERT_TRUE(CopyMultiplyMatrix(encoded, out.data(), out.size()).ok());
  EXPECT_EQ(out, matrix);
  // The buffer is read, not consumed: it can be read again.
  EXPECT_EQ(Flatten(encoded).size(), encoded.Length());
  EXPECT_EQ(CopyMultiplyMatrix(encoded, out.data(), 23).code(), absl::StatusCode::kInternal);

  v1::MultiplyRequest no_matrix;
  *no_matrix.mutable_header() = SampleHeader();
  grpc::ByteBuffer header_only = Buffer(no_matrix.SerializeAsString());
  view = PeekMultiplyRequest(header_only);
  ASSERT_TRUE(view.ok());
  EXPECT_FALSE(view->has_matrix);
  EXPECT_EQ(view->matrix_bytes, 0u);
}

TEST(WireTest, UnaryRequestErrorsAreInvalidArgument) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {std::string("\x12\x05" "ab", 4), "matrix longer than the message"},
      {std::string("\x12\x01" "a" "\x12\x01" "b", 6), "the matrix is given twice"},
      {std::string("\x0a\x02\x08", 3), "bad header"},
      // A header length past the end, and one of 2^32 - 1.
      {std::string("\x0a\x7f\x08\x01", 4), "bad header"},
      {std::string("\x0a\xff\xff\xff\xff\x0f\x08\x01", 8), "bad header"},
      // A matrix length of 2^32 + 2, which a 32-bit read would take for 2.
      {std::string("\x12\x82\x80\x80\x80\x10" "ab", 8), "matrix longer than the message"},
      {std::string("\xff\xff", 2), "malformed MultiplyRequest"},
  };
  for (const auto& [bytes, fragment] : cases) {
    grpc::ByteBuffer buffer = Buffer(bytes, 2);
    absl::StatusOr<MultiplyRequestView> view = PeekMultiplyRequest(buffer);
    EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument) << fragment;
    EXPECT_THAT(std::string(view.status().message()), HasSubstr(fragment));
  }
}

TEST(WireTest, UnaryResponseParsesAsTheGeneratedMessage) {
  const std::string result(5000, 'c');
  v1::JobStats stats;
  stats.set_bytes_out(5000);
  stats.set_device("cpu");
  v1::MultiplyResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(EncodeMultiplyResponse(grpc::Slice(result), stats))));
  EXPECT_EQ(parsed.result(), result);
  EXPECT_EQ(parsed.stats().bytes_out(), 5000);
  EXPECT_EQ(parsed.stats().device(), "cpu");
}

// MultiplyBatch: the client's request and the server's response parse as
// the generated messages; the server's peek and copy and the client's
// decoder read what the generated classes write, across slice boundaries.
TEST(WireTest, BatchRequestParsesAsTheGeneratedMessageSmallMatricesInlineLargeLent) {
  const std::string small(24, 's');
  const std::string large(40000, 'L');  // over the inline size: lent
  const v1::JobHeader header = SampleHeader();
  SliceLoans loans;
  std::string encoded;
  {
    grpc::ByteBuffer buffer = EncodeMultiplyBatchRequest(
        {{&header, small.data(), small.size()}, {&header, large.data(), large.size()},
         {&header, small.data(), 0}},
        &loans);
    encoded = Flatten(buffer);
  }
  loans.WaitUntilReturned();
  v1::MultiplyBatchRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(encoded));
  ASSERT_EQ(parsed.jobs_size(), 3);
  EXPECT_EQ(parsed.jobs(0).matrix(), small);
  EXPECT_EQ(parsed.jobs(1).matrix(), large);
  EXPECT_EQ(parsed.jobs(2).matrix(), "");
  EXPECT_EQ(parsed.jobs(1).header().SerializeAsString(), header.SerializeAsString());
  // The empty batch: an empty message.
  EXPECT_EQ(Flatten(EncodeMultiplyBatchRequest({}, &loans)), "");
}

TEST(WireTest, BatchRequestIsPeekedJobByJobAndCopiedInOrder) {
  v1::MultiplyBatchRequest request;
  for (int i = 0; i < 3; ++i) {
    v1::MultiplyRequest* job = request.add_jobs();
    *job->mutable_header() = SampleHeader();
    job->mutable_header()->set_rows(i + 1);
    job->set_matrix(std::string(static_cast<size_t>(8 * (i + 1)), static_cast<char>('a' + i)));
  }
  // A job whose matrix is given twice: its own error, the others decode.
  v1::MultiplyRequest* twice = request.mutable_jobs(1);
  std::string bytes = twice->SerializeAsString() + std::string("\x12\x01z", 3);
  request.mutable_jobs(1)->Clear();
  std::string encoded = request.SerializeAsString();
  v1::MultiplyBatchRequest with_bad;
  ASSERT_TRUE(with_bad.ParseFromString(encoded));
  // Rebuild with job 1's raw bytes in place.
  std::string raw;
  for (int i = 0; i < 3; ++i) {
    const std::string job = i == 1 ? bytes : request.jobs(i).SerializeAsString();
    raw += '\x0a';
    raw += static_cast<char>(job.size());
    raw += job;
  }
  size_t total = 0;
  absl::StatusOr<std::vector<BatchJobView>> views =
      PeekMultiplyBatchRequest(Buffer(raw), 100, &total);
  ASSERT_TRUE(views.ok()) << views.status();
  ASSERT_EQ(views->size(), 3u);
  EXPECT_EQ(total, 3u);
  EXPECT_TRUE((*views)[0].decoded.ok());
  EXPECT_EQ((*views)[0].request.header.rows(), 1);
  EXPECT_EQ((*views)[0].request.matrix_bytes, 8u);
  EXPECT_EQ((*views)[1].decoded.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string((*views)[1].decoded.message()), HasSubstr("the matrix is given twice"));
  EXPECT_TRUE((*views)[2].decoded.ok());
  EXPECT_EQ((*views)[2].request.matrix_bytes, 24u);
  BatchMatrixReader reader(Buffer(raw));
  std::string first(8, '\0'), third(24, '\0');
  ASSERT_TRUE(reader.Copy((*views)[0].matrix_offset, first.data(), 8).ok());
  ASSERT_TRUE(reader.Copy((*views)[2].matrix_offset, third.data(), 24).ok());
  EXPECT_EQ(first, std::string(8, 'a'));
  EXPECT_EQ(third, std::string(24, 'c'));
  EXPECT_FALSE(reader.Copy((*views)[0].matrix_offset, first.data(), 8).ok());  // backwards
  // Past max_jobs: counted, not read.
  views = PeekMultiplyBatchRequest(Buffer(raw), 2, &total);
  ASSERT_TRUE(views.ok());
  EXPECT_EQ(views->size(), 2u);
  EXPECT_EQ(total, 3u);
  // Broken framing is the batch's INVALID_ARGUMENT.
  views = PeekMultiplyBatchRequest(Buffer(raw.substr(0, raw.size() - 3)), 100, &total);
  EXPECT_EQ(views.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(views.status().message()), HasSubstr("malformed MultiplyBatchRequest"));
}

TEST(WireTest, BatchResponseParsesAsTheGeneratedMessageAndDecodesIntoPlace) {
  v1::JobStats stats;
  stats.set_job_id(42);
  stats.set_device("cpu");
  const std::string result(20, 'r');
  const std::string large(20000, 'L');  // over the inline size: a sub-slice of the data
  const grpc::Slice data(result + std::string(44, 'x') + large);
  std::vector<BatchResultView> views(4);
  views[0] = {.code = 0,
              .message = "",
              .stats = &stats,
              .has_result = true,
              .offset = 0,
              .bytes = result.size()};
  views[1] = {.code = 3, .message = "bad diagonal"};
  views[2] = {
      .code = 0, .message = "", .stats = &stats, .has_result = true, .offset = 0, .bytes = 0};
  views[3] = {.code = 0,
              .message = "",
              .stats = &stats,
              .has_result = true,
              .offset = 64,
              .bytes = large.size()};
  grpc::ByteBuffer encoded = EncodeMultiplyBatchResponse(views, data);
  v1::MultiplyBatchResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(encoded)));
  ASSERT_EQ(parsed.results_size(), 4);
  EXPECT_EQ(parsed.results(3).result(), large);
  parsed.mutable_results()->RemoveLast();
  EXPECT_EQ(parsed.results(0).result(), result);
  EXPECT_EQ(parsed.results(0).stats().job_id(), 42u);
  EXPECT_FALSE(parsed.results(0).has_status());
  EXPECT_EQ(parsed.results(1).status().code(), 3);
  EXPECT_EQ(parsed.results(1).status().message(), "bad diagonal");
  EXPECT_EQ(parsed.results(2).result(), "");

  grpc::ByteBuffer again = Buffer(parsed.SerializeAsString());
  std::string out0(20, '\0');
  std::vector<BatchResultDecoded> decoded;
  absl::Status s = DecodeMultiplyBatchResponse(
      &again, 3,
      [&](size_t i, size_t size) -> absl::StatusOr<void*> {
        if (i == 0 && size == 20) return out0.data();
        if (i == 2 && size == 0) return out0.data();
        return absl::InternalError("misplaced");
      },
      &decoded);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(decoded[0].status.ok());
  EXPECT_EQ(out0, result);
  EXPECT_EQ(decoded[0].stats.job_id(), 42u);
  EXPECT_EQ(decoded[1].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(decoded[1].status.message(), "bad diagonal");
  EXPECT_TRUE(decoded[2].status.ok()) << decoded[2].status;
  // A count other than the jobs sent is INTERNAL.
  grpc::ByteBuffer short_count = Buffer(parsed.SerializeAsString());
  s = DecodeMultiplyBatchResponse(
      &short_count, 4, [&](size_t, size_t) -> absl::StatusOr<void*> { return out0.data(); },
      &decoded);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace dgmm::wire
