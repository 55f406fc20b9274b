#include "proto/wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace dgmm::wire {
namespace {

using google::protobuf::MessageLite;
using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// Field numbers from dgmm.proto.
constexpr int kMultiplyRequestHeader = 1;
constexpr int kMultiplyRequestMatrix = 2;
constexpr int kMultiplyResponseResult = 1;
constexpr int kMultiplyResponseStats = 2;
constexpr int kStreamRequestHeader = 1;
constexpr int kStreamRequestBlock = 2;
constexpr int kStreamResponseAccepted = 1;
constexpr int kStreamResponseBlock = 2;
constexpr int kStreamResponseStats = 3;
constexpr int kBlockFirstLine = 1;
constexpr int kBlockData = 2;

constexpr uint32_t LengthDelimitedTag(int field) {
  return WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_LENGTH_DELIMITED);
}
constexpr uint32_t VarintTag(int field) {
  return WireFormatLite::MakeTag(field, WireFormatLite::WIRETYPE_VARINT);
}

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

size_t VarintSize(uint64_t value) {
  size_t n = 1;
  while (value >= 0x80) {
    value >>= 7;
    ++n;
  }
  return n;
}

// Header field `field` of a length-delimited value of `size` bytes.
void AppendLengthDelimitedPrefix(int field, uint64_t size, std::string* out) {
  AppendVarint(LengthDelimitedTag(field), out);
  AppendVarint(size, out);
}

// How a decoder reports a malformed message: the client gets INTERNAL (the
// server broke the contract), the server INVALID_ARGUMENT (the client did).
using MalformedFn = absl::Status (*)(absl::string_view what);

absl::Status Malformed(absl::string_view what) {
  return absl::InternalError(absl::StrCat("malformed response from the server: ", what));
}

absl::Status MalformedRequest(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed MultiplyStreamRequest: ", what));
}

absl::Status MalformedUnary(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed MultiplyRequest: ", what));
}


// Reads the length of a length-delimited field of a message of
// `message_bytes` bytes: false unless it fits an int and the bytes are really
// there, so nothing is ever sized, limited or cast by a length that lies.
bool ReadLength(CodedInputStream* in, size_t message_bytes, int* length) {
  if (!in->ReadVarintSizeAsInt(length)) return false;
  return static_cast<size_t>(*length) <= message_bytes - static_cast<size_t>(in->CurrentPosition());
}

// Reads a length-delimited embedded message into *message.
bool ReadEmbedded(CodedInputStream* in, size_t message_bytes, MessageLite* message) {
  int length = 0;
  if (!ReadLength(in, message_bytes, &length)) return false;
  const CodedInputStream::Limit limit = in->PushLimit(length);
  const bool ok = message->MergeFromCodedStream(in) && in->ConsumedEntireMessage();
  in->PopLimit(limit);
  return ok;
}

// Reads a Block, copying its data to where `placer` says. first_line may be
// absent (proto3 omits zero) or, in principle, follow the data. With
// `place_by_line`, where the data goes depends on the line, so data seen
// before its line is staged and placed once the line is known; without, the
// placer is called as soon as the data's size is known (with the line seen
// so far), and the data never staged. A block with its data twice is
// malformed.
absl::Status ReadBlock(CodedInputStream* in, size_t message_bytes, const BlockPlacer& placer,
                       bool place_by_line, MalformedFn malformed, int64_t* first_line_out,
                       size_t* size_out) {
  int length = 0;
  if (!ReadLength(in, message_bytes, &length)) return malformed("block longer than the message");
  const CodedInputStream::Limit limit = in->PushLimit(length);
  int64_t first_line = 0;
  bool first_line_known = false;
  bool placed = false;
  bool have_data = false;
  std::string staged;
  size_t size = 0;
  while (const uint32_t tag = in->ReadTag()) {
    if (tag == VarintTag(kBlockFirstLine)) {
      uint64_t value = 0;
      if (!in->ReadVarint64(&value)) return malformed("truncated block.first_line");
      first_line = static_cast<int64_t>(value);
      first_line_known = true;
    } else if (tag == LengthDelimitedTag(kBlockData)) {
      int data_size = 0;
      if (!in->ReadVarintSizeAsInt(&data_size) || data_size > in->BytesUntilLimit()) {
        return malformed("block.data longer than the block");
      }
      if (have_data) return malformed("block.data twice in one block");
      have_data = true;
      size = static_cast<size_t>(data_size);
      void* destination = nullptr;
      if (first_line_known || !place_by_line) {
        absl::StatusOr<void*> placement = placer(first_line, size);
        if (!placement.ok()) return placement.status();
        destination = *placement;
        placed = true;
      } else {
        staged.resize(size);
        destination = staged.data();
        placed = false;
      }
      if (size > 0 && !in->ReadRaw(destination, static_cast<int>(size))) {
        return malformed("truncated block.data");
      }
    } else if (!WireFormatLite::SkipField(in, tag)) {
      return malformed("bad field in block");
    }
  }
  if (!in->ConsumedEntireMessage()) return malformed("bad block");
  in->PopLimit(limit);
  if (!placed) {
    // The data was staged (first_line absent, i.e. zero, or after it), or
    // there was none: the placer judges a zero-size block.
    absl::StatusOr<void*> placement = placer(first_line, size);
    if (!placement.ok()) return placement.status();
    if (size > 0) std::memcpy(*placement, staged.data(), size);
  }
  *first_line_out = first_line;
  *size_out = size;
  return absl::OkStatus();
}

// Reads the fields of a MultiplyRequest up to the stream's limit (the whole
// message, or one job of a MultiplyBatchRequest) into *view. With `out`
// null, skips the matrix; otherwise copies it (exactly `out_bytes`) into
// `out`. *matrix_at: where the matrix's bytes start in the stream. The one
// place a MultiplyRequest's errors are worded, for Multiply and MultiplyBatch.
absl::Status ReadMultiplyFields(CodedInputStream* in, size_t total, MultiplyRequestView* view,
                                void* out, size_t out_bytes, size_t* matrix_at) {
  while (const uint32_t tag = in->ReadTag()) {
    if (tag == LengthDelimitedTag(kMultiplyRequestHeader)) {
      if (!ReadEmbedded(in, total, &view->header)) return MalformedUnary("bad header");
    } else if (tag == LengthDelimitedTag(kMultiplyRequestMatrix)) {
      int size = 0;
      if (!ReadLength(in, total, &size)) return MalformedUnary("matrix longer than the message");
      if (view->has_matrix) return MalformedUnary("the matrix is given twice");
      view->has_matrix = true;
      view->matrix_bytes = static_cast<size_t>(size);
      if (matrix_at != nullptr) *matrix_at = static_cast<size_t>(in->CurrentPosition());
      const bool copied = out != nullptr && view->matrix_bytes == out_bytes ? in->ReadRaw(out, size)
                                                                            : in->Skip(size);
      if (!copied) return MalformedUnary("truncated matrix");
    } else if (!WireFormatLite::SkipField(in, tag)) {
      return MalformedUnary("bad field");
    }
  }
  return absl::OkStatus();
}

// Walks a MultiplyRequest. With `out` null, only reads the header and the
// matrix's size; otherwise also copies the matrix (exactly `out_bytes`) into
// `out`. gRPC's reader API takes a non-const buffer; a copy of the ByteBuffer
// shares its slices, so the caller's stays untouched.
absl::StatusOr<MultiplyRequestView> WalkMultiplyRequest(const grpc::ByteBuffer& message,
                                                        void* out, size_t out_bytes) {
  grpc::ByteBuffer buffer(message);
  const size_t total = buffer.Length();
  grpc::ProtoBufferReader reader(&buffer);
  CodedInputStream in(&reader);
  MultiplyRequestView view;
  if (absl::Status s = ReadMultiplyFields(&in, total, &view, out, out_bytes, nullptr); !s.ok()) {
    return s;
  }
  if (!in.ConsumedEntireMessage()) return MalformedUnary("truncated or bad tag");
  if (out != nullptr && (!view.has_matrix || view.matrix_bytes != out_bytes)) {
    return absl::InternalError("the request's matrix is not the one peeked at");
  }
  return view;
}

// MultiplyBatchRequest, MultiplyBatchResult and JobStatus field numbers.
constexpr int kBatchRequestJobs = 1;
constexpr int kBatchResponseResults = 1;
constexpr int kBatchResultStatus = 1;
constexpr int kBatchResultResult = 2;
constexpr int kBatchResultStats = 3;
constexpr int kJobStatusCode = 1;
constexpr int kJobStatusMessage = 2;

absl::Status MalformedBatch(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed MultiplyBatchRequest: ", what));
}

// Matrices up to this size are copied into the request's framing instead of
// lent as slices of their own (a slice and its loan cost more than a copy).
constexpr size_t kInlineMatrixBytes = size_t{16} << 10;

}  // namespace

absl::StatusOr<MultiplyRequestView> PeekMultiplyRequest(const grpc::ByteBuffer& buffer) {
  return WalkMultiplyRequest(buffer, nullptr, 0);
}

absl::Status CopyMultiplyMatrix(const grpc::ByteBuffer& buffer, void* out, size_t bytes) {
  return WalkMultiplyRequest(buffer, out, bytes).status();
}

grpc::ByteBuffer EncodeMultiplyResponse(grpc::Slice result, const v1::JobStats& stats) {
  std::string prefix;
  AppendLengthDelimitedPrefix(kMultiplyResponseResult, result.size(), &prefix);
  std::string suffix;
  const std::string encoded_stats = stats.SerializeAsString();
  AppendLengthDelimitedPrefix(kMultiplyResponseStats, encoded_stats.size(), &suffix);
  suffix += encoded_stats;
  if (result.size() <= kInlineMatrixBytes) {
    // A small result is copied into one slice with its framing: its buffer
    // goes back now, and gRPC writes one slice.
    prefix.append(reinterpret_cast<const char*>(result.begin()), result.size());
    prefix += suffix;
    grpc::Slice one(prefix);
    return grpc::ByteBuffer(&one, 1);
  }
  grpc::Slice slices[3] = {grpc::Slice(prefix), std::move(result), grpc::Slice(suffix)};
  return grpc::ByteBuffer(slices, 3);
}

grpc::Slice SliceLoans::Lend(const void* data, size_t size) {
  {
    absl::MutexLock lock(&mu_);
    ++outstanding_;
  }
  // gRPC's slice API takes a mutable pointer; it never writes through it.
  return grpc::Slice(const_cast<void*>(data), size, &SliceLoans::Return, this);
}

void SliceLoans::Return(void* self) {
  SliceLoans* loans = static_cast<SliceLoans*>(self);
  absl::MutexLock lock(&loans->mu_);
  --loans->outstanding_;
}

void SliceLoans::WaitUntilReturned() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int64_t* outstanding) { return *outstanding == 0; }, &outstanding_));
}

grpc::ByteBuffer EncodeMultiplyRequest(const v1::JobHeader& header, const void* matrix,
                                       size_t matrix_bytes, SliceLoans* loans) {
  std::string prefix;
  const std::string encoded_header = header.SerializeAsString();
  AppendLengthDelimitedPrefix(kMultiplyRequestHeader, encoded_header.size(), &prefix);
  prefix += encoded_header;
  AppendLengthDelimitedPrefix(kMultiplyRequestMatrix, matrix_bytes, &prefix);
  if (matrix_bytes <= kInlineMatrixBytes) {
    // A small matrix is copied into the framing: no loan to wait for.
    prefix.append(static_cast<const char*>(matrix), matrix_bytes);
    grpc::Slice one(prefix);
    return grpc::ByteBuffer(&one, 1);
  }
  grpc::Slice slices[2] = {grpc::Slice(prefix), loans->Lend(matrix, matrix_bytes)};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer EncodeStreamHeader(const v1::JobHeader& header) {
  std::string encoded;
  const std::string encoded_header = header.SerializeAsString();
  AppendLengthDelimitedPrefix(kStreamRequestHeader, encoded_header.size(), &encoded);
  encoded += encoded_header;
  grpc::Slice slice(encoded);
  return grpc::ByteBuffer(&slice, 1);
}

grpc::ByteBuffer EncodeStreamBlock(int64_t first_line, const void* data, size_t size,
                                   SliceLoans* loans) {
  return EncodeStreamBlock(first_line, loans->Lend(data, size));
}

grpc::ByteBuffer EncodeStreamBlock(int64_t first_line, grpc::Slice data) {
  const size_t size = data.size();
  const uint64_t line = static_cast<uint64_t>(first_line);
  size_t block_size = VarintSize(LengthDelimitedTag(kBlockData)) + VarintSize(size) + size;
  if (line != 0) block_size += VarintSize(VarintTag(kBlockFirstLine)) + VarintSize(line);
  std::string prefix;
  AppendLengthDelimitedPrefix(kStreamRequestBlock, block_size, &prefix);
  if (line != 0) {
    AppendVarint(VarintTag(kBlockFirstLine), &prefix);
    AppendVarint(line, &prefix);
  }
  AppendLengthDelimitedPrefix(kBlockData, size, &prefix);
  grpc::Slice slices[2] = {grpc::Slice(prefix), std::move(data)};
  return grpc::ByteBuffer(slices, 2);
}

grpc::ByteBuffer EncodeMessage(const google::protobuf::MessageLite& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

bool ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::MessageLite* message) {
  grpc::ByteBuffer copy(buffer);  // shares the slices; the reader consumes its own
  grpc::ProtoBufferReader reader(&copy);
  return message->ParseFromZeroCopyStream(&reader);
}

absl::Status DecodeMultiplyResponse(grpc::ByteBuffer* buffer, void* out, size_t out_bytes,
                                    v1::JobStats* stats) {
  grpc::ProtoBufferReader reader(buffer);
  CodedInputStream in(&reader);
  bool have_result = false;
  while (const uint32_t tag = in.ReadTag()) {
    if (tag == LengthDelimitedTag(kMultiplyResponseResult)) {
      int size = 0;
      if (!ReadLength(&in, buffer->Length(), &size)) return Malformed("truncated result");
      if (static_cast<size_t>(size) != out_bytes) {
        return absl::InternalError(
            absl::StrCat("the server returned a result of ", size, " bytes; expected ", out_bytes));
      }
      if (!in.ReadRaw(out, size)) return Malformed("truncated result");
      have_result = true;
    } else if (tag == LengthDelimitedTag(kMultiplyResponseStats)) {
      if (!ReadEmbedded(&in, buffer->Length(), stats)) return Malformed("bad stats");
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return Malformed("bad field in MultiplyResponse");
    }
  }
  if (!in.ConsumedEntireMessage()) return Malformed("bad MultiplyResponse");
  if (!have_result) {
    return absl::InternalError(
        absl::StrCat("the server returned no result; expected ", out_bytes, " bytes"));
  }
  return absl::OkStatus();
}

absl::StatusOr<StreamResponse> DecodeStreamResponse(grpc::ByteBuffer* buffer,
                                                    const BlockPlacer& placer) {
  grpc::ProtoBufferReader reader(buffer);
  CodedInputStream in(&reader);
  StreamResponse response;
  bool have_kind = false;
  while (const uint32_t tag = in.ReadTag()) {
    if (tag == LengthDelimitedTag(kStreamResponseAccepted)) {
      if (!ReadEmbedded(&in, buffer->Length(), &response.accepted)) {
        return Malformed("bad accepted");
      }
      response.kind = StreamResponse::Kind::kAccepted;
    } else if (tag == LengthDelimitedTag(kStreamResponseBlock)) {
      if (absl::Status s =
              ReadBlock(&in, buffer->Length(), placer, /*place_by_line=*/true, &Malformed,
                        &response.first_line, &response.size);
          !s.ok()) {
        return s;
      }
      response.kind = StreamResponse::Kind::kBlock;
    } else if (tag == LengthDelimitedTag(kStreamResponseStats)) {
      if (!ReadEmbedded(&in, buffer->Length(), &response.stats)) return Malformed("bad stats");
      response.kind = StreamResponse::Kind::kStats;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return Malformed("bad field in MultiplyStreamResponse");
    } else {
      continue;
    }
    have_kind = true;
  }
  if (!in.ConsumedEntireMessage()) return Malformed("bad MultiplyStreamResponse");
  if (!have_kind) return Malformed("MultiplyStreamResponse with no accepted, block or stats");
  return response;
}

absl::StatusOr<StreamRequest> DecodeStreamRequest(grpc::ByteBuffer* buffer,
                                                  const BlockPlacer& placer) {
  grpc::ProtoBufferReader reader(buffer);
  CodedInputStream in(&reader);
  StreamRequest request;
  int kinds = 0;
  while (const uint32_t tag = in.ReadTag()) {
    if (tag == LengthDelimitedTag(kStreamRequestHeader)) {
      if (kinds++ > 0) return MalformedRequest("it holds more than one header or block");
      if (!ReadEmbedded(&in, buffer->Length(), &request.header)) {
        return MalformedRequest("bad header");
      }
      request.kind = StreamRequest::Kind::kHeader;
    } else if (tag == LengthDelimitedTag(kStreamRequestBlock)) {
      if (kinds++ > 0) return MalformedRequest("it holds more than one header or block");
      if (absl::Status s = ReadBlock(&in, buffer->Length(), placer, /*place_by_line=*/false,
                                     &MalformedRequest, &request.first_line, &request.size);
          !s.ok()) {
        return s;
      }
      request.kind = StreamRequest::Kind::kBlock;
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return MalformedRequest("bad field");
    }
  }
  if (!in.ConsumedEntireMessage()) return MalformedRequest("truncated or bad tag");
  if (kinds == 0) return absl::InvalidArgumentError("message holds neither a header nor a block");
  return request;
}

absl::StatusOr<std::vector<BatchJobView>> PeekMultiplyBatchRequest(const grpc::ByteBuffer& message,
                                                                   size_t max_jobs,
                                                                   size_t* total_jobs) {
  grpc::ByteBuffer buffer(message);
  const size_t total = buffer.Length();
  grpc::ProtoBufferReader reader(&buffer);
  CodedInputStream in(&reader);
  std::vector<BatchJobView> jobs;
  size_t count = 0;
  while (const uint32_t tag = in.ReadTag()) {
    if (tag == LengthDelimitedTag(kBatchRequestJobs)) {
      int length = 0;
      if (!ReadLength(&in, total, &length)) return MalformedBatch("a job longer than the message");
      ++count;
      if (count > max_jobs) {
        // Past the limit: counted, not read.
        if (!in.Skip(length)) return MalformedBatch("truncated job");
        continue;
      }
      BatchJobView& job = jobs.emplace_back();
      job.message_bytes = static_cast<size_t>(length);
      const CodedInputStream::Limit limit = in.PushLimit(length);
      job.decoded = ReadMultiplyFields(&in, total, &job.request, nullptr, 0, &job.matrix_offset);
      if (job.decoded.ok() && !in.ConsumedEntireMessage()) {
        job.decoded = MalformedUnary("truncated or bad tag");
      }
      // A job that did not decode is skipped whole: its framing is known.
      if (in.BytesUntilLimit() > 0 && !in.Skip(in.BytesUntilLimit())) {
        return MalformedBatch("truncated job");
      }
      in.PopLimit(limit);
    } else if (!WireFormatLite::SkipField(&in, tag)) {
      return MalformedBatch("bad field");
    }
  }
  if (!in.ConsumedEntireMessage()) return MalformedBatch("truncated or bad tag");
  if (total_jobs != nullptr) *total_jobs = count;
  return jobs;
}

BatchMatrixReader::BatchMatrixReader(const grpc::ByteBuffer& message)
    : buffer_(message),
      reader_(std::make_unique<grpc::ProtoBufferReader>(&buffer_)),
      in_(std::make_unique<CodedInputStream>(reader_.get())) {}

BatchMatrixReader::~BatchMatrixReader() = default;

absl::Status BatchMatrixReader::Copy(size_t offset, void* out, size_t bytes) {
  const size_t at = static_cast<size_t>(in_->CurrentPosition());
  if (offset < at) return absl::InternalError("batch matrices must be copied in order");
  if (offset > at && !in_->Skip(static_cast<int>(offset - at))) {
    return MalformedBatch("truncated job");
  }
  if (bytes > 0 && !in_->ReadRaw(out, static_cast<int>(bytes))) {
    return MalformedBatch("truncated matrix");
  }
  return absl::OkStatus();
}

grpc::ByteBuffer EncodeMultiplyBatchResponse(const std::vector<BatchResultView>& results,
                                             const grpc::Slice& data) {
  std::vector<grpc::Slice> slices;
  std::string pending;  // framing and small results, up to the next large result
  const char* base = reinterpret_cast<const char*>(data.begin());
  for (const BatchResultView& r : results) {
    std::string status;
    if (r.code != 0) {
      AppendVarint(VarintTag(kJobStatusCode), &status);
      AppendVarint(static_cast<uint64_t>(r.code), &status);
      if (!r.message.empty()) {
        AppendLengthDelimitedPrefix(kJobStatusMessage, r.message.size(), &status);
        status.append(r.message.data(), r.message.size());
      }
    }
    const size_t stats_bytes = r.stats != nullptr ? r.stats->ByteSizeLong() : 0;
    size_t entry = 0;
    if (r.code != 0) {
      entry += VarintSize(LengthDelimitedTag(kBatchResultStatus)) + VarintSize(status.size()) +
               status.size();
    }
    if (r.has_result) {
      entry += VarintSize(LengthDelimitedTag(kBatchResultResult)) + VarintSize(r.bytes) + r.bytes;
    }
    if (r.stats != nullptr) {
      entry +=
          VarintSize(LengthDelimitedTag(kBatchResultStats)) + VarintSize(stats_bytes) + stats_bytes;
    }
    AppendLengthDelimitedPrefix(kBatchResponseResults, entry, &pending);
    if (r.code != 0) {
      AppendLengthDelimitedPrefix(kBatchResultStatus, status.size(), &pending);
      pending += status;
    }
    if (r.has_result) {
      AppendLengthDelimitedPrefix(kBatchResultResult, r.bytes, &pending);
      if (r.bytes <= kInlineMatrixBytes) {
        pending.append(base + r.offset, r.bytes);
      } else {
        slices.emplace_back(pending);
        pending.clear();
        slices.push_back(data.sub(r.offset, r.offset + r.bytes));
      }
    }
    if (r.stats != nullptr) {
      AppendLengthDelimitedPrefix(kBatchResultStats, stats_bytes, &pending);
      r.stats->AppendToString(&pending);
    }
  }
  if (!pending.empty() || slices.empty()) slices.emplace_back(pending);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer EncodeMultiplyBatchRequest(const std::vector<BatchRequestJob>& jobs,
                                            SliceLoans* loans) {
  std::vector<grpc::Slice> slices;
  std::string pending;
  for (const BatchRequestJob& job : jobs) {
    const size_t header_bytes = job.header->ByteSizeLong();
    const size_t request_bytes = VarintSize(LengthDelimitedTag(kMultiplyRequestHeader)) +
                                 VarintSize(header_bytes) + header_bytes +
                                 VarintSize(LengthDelimitedTag(kMultiplyRequestMatrix)) +
                                 VarintSize(job.matrix_bytes) + job.matrix_bytes;
    AppendLengthDelimitedPrefix(kBatchRequestJobs, request_bytes, &pending);
    AppendLengthDelimitedPrefix(kMultiplyRequestHeader, header_bytes, &pending);
    job.header->AppendToString(&pending);
    AppendLengthDelimitedPrefix(kMultiplyRequestMatrix, job.matrix_bytes, &pending);
    if (job.matrix_bytes <= kInlineMatrixBytes) {
      pending.append(static_cast<const char*>(job.matrix), job.matrix_bytes);
    } else {
      slices.emplace_back(pending);
      pending.clear();
      slices.push_back(loans->Lend(job.matrix, job.matrix_bytes));
    }
  }
  if (!pending.empty() || slices.empty()) slices.emplace_back(pending);
  return grpc::ByteBuffer(slices.data(), slices.size());
}

absl::Status DecodeMultiplyBatchResponse(grpc::ByteBuffer* buffer, size_t jobs,
                                         const BatchPlacer& placer,
                                         std::vector<BatchResultDecoded>* results) {
  results->assign(jobs, BatchResultDecoded());
  const size_t total = buffer->Length();
  grpc::ProtoBufferReader reader(buffer);
  CodedInputStream in(&reader);
  size_t i = 0;
  while (const uint32_t tag = in.ReadTag()) {
    if (tag != LengthDelimitedTag(kBatchResponseResults)) {
      if (!WireFormatLite::SkipField(&in, tag))
        return Malformed("bad field in MultiplyBatchResponse");
      continue;
    }
    int length = 0;
    if (!ReadLength(&in, total, &length)) return Malformed("truncated MultiplyBatchResult");
    if (i >= jobs) {
      return absl::InternalError(
          absl::StrCat("the server returned more than ", jobs, " batch results"));
    }
    BatchResultDecoded& r = (*results)[i];
    const CodedInputStream::Limit limit = in.PushLimit(length);
    v1::JobStatus status;
    while (const uint32_t field = in.ReadTag()) {
      if (field == LengthDelimitedTag(kBatchResultStatus)) {
        if (!ReadEmbedded(&in, total, &status)) return Malformed("bad batch result status");
      } else if (field == LengthDelimitedTag(kBatchResultResult)) {
        int size = 0;
        if (!ReadLength(&in, total, &size)) return Malformed("truncated batch result");
        absl::StatusOr<void*> place = placer(i, static_cast<size_t>(size));
        if (!place.ok()) {
          r.status = place.status();
          if (!in.Skip(size)) return Malformed("truncated batch result");
        } else {
          if (size > 0 && !in.ReadRaw(*place, size)) return Malformed("truncated batch result");
          r.has_result = true;
        }
      } else if (field == LengthDelimitedTag(kBatchResultStats)) {
        if (!ReadEmbedded(&in, total, &r.stats)) return Malformed("bad batch result stats");
      } else if (!WireFormatLite::SkipField(&in, field)) {
        return Malformed("bad field in MultiplyBatchResult");
      }
    }
    if (!in.ConsumedEntireMessage()) return Malformed("bad MultiplyBatchResult");
    in.PopLimit(limit);
    if (status.code() != 0) {
      r.status = absl::Status(static_cast<absl::StatusCode>(status.code()), status.message());
    } else if (r.status.ok() && !r.has_result) {
      // proto3 leaves an empty result out: the placer judges a result of 0 bytes.
      absl::StatusOr<void*> place = placer(i, 0);
      if (!place.ok()) {
        r.status = place.status();
      } else {
        r.has_result = true;
      }
    }
    ++i;
  }
  if (!in.ConsumedEntireMessage()) return Malformed("bad MultiplyBatchResponse");
  if (i != jobs) {
    return absl::InternalError(
        absl::StrCat("the server returned ", i, " batch results; expected ", jobs));
  }
  return absl::OkStatus();
}

std::vector<std::pair<std::string, int>> ExtraChannelArgs() {
  std::vector<std::pair<std::string, int>> args;
  const char* env = std::getenv("DGMM_GRPC_ARGS");
  if (env == nullptr) return args;
  for (absl::string_view item : absl::StrSplit(env, ',', absl::SkipWhitespace())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(item, '=');
    int value = 0;
    if (kv.first.empty() || !absl::SimpleAtoi(kv.second, &value)) continue;
    args.emplace_back(std::string(kv.first), value);
  }
  return args;
}

}  // namespace dgmm::wire
