#include "service/rpc/oip_wire.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/wire_format_lite.h>
#include <grpcpp/support/proto_buffer_reader.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace dgmm::oip {
namespace {

using google::protobuf::internal::WireFormatLite;
using google::protobuf::io::CodedInputStream;

// Field numbers of grpc_predict_v2.proto.
constexpr int kRequestModelName = 1;
constexpr int kRequestModelVersion = 2;
constexpr int kRequestId = 3;
constexpr int kRequestParameters = 4;
constexpr int kRequestInputs = 5;
constexpr int kRequestOutputs = 6;
constexpr int kRequestRawInputContents = 7;
constexpr int kInputName = 1;
constexpr int kInputDatatype = 2;
constexpr int kInputShape = 3;
constexpr int kInputParameters = 4;
constexpr int kInputContents = 5;
constexpr int kOutputName = 1;
constexpr int kOutputParameters = 2;
constexpr int kMapKey = 1;
constexpr int kMapValue = 2;
constexpr int kContentsFp32 = 6;
constexpr int kContentsFp64 = 7;
constexpr int kResponseRawOutputContents = 6;

// Results up to this size go into one slice with the framing.
constexpr size_t kInlineResultBytes = size_t{16} << 10;

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed ModelInferRequest: ", what));
}

// The stream's length-delimited value: its length, if it fits what is left
// under the innermost limit (PeekInferRequest pushes the message's).
bool ReadLength(CodedInputStream* in, int* length) {
  return in->ReadVarintSizeAsInt(length) && *length <= in->BytesUntilLimit();
}

bool ReadString(CodedInputStream* in, std::string* out) {
  int length = 0;
  return ReadLength(in, &length) && in->ReadString(out, length);
}

// Runs `field(tag)` over the fields of an embedded message; false on a
// malformed one.
template <typename Field>
bool ReadEmbedded(CodedInputStream* in, Field field) {
  int length = 0;
  if (!ReadLength(in, &length)) return false;
  const CodedInputStream::Limit limit = in->PushLimit(length);
  while (const uint32_t tag = in->ReadTag()) {
    if (!field(tag)) return false;
  }
  const bool ok = in->ConsumedEntireMessage();
  in->PopLimit(limit);
  return ok;
}

// A map<string, InferParameter> entry: its key, and its value when `value`.
bool ReadParameter(CodedInputStream* in, std::string* key, inference::InferParameter* value) {
  return ReadEmbedded(in, [&](uint32_t tag) {
    if (tag == WireFormatLite::MakeTag(kMapKey, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
      return ReadString(in, key);
    }
    if (value != nullptr &&
        tag == WireFormatLite::MakeTag(kMapValue, WireFormatLite::WIRETYPE_LENGTH_DELIMITED)) {
      int length = 0;
      if (!ReadLength(in, &length)) return false;
      const CodedInputStream::Limit limit = in->PushLimit(length);
      const bool ok = value->MergeFromCodedStream(in) && in->ConsumedEntireMessage();
      in->PopLimit(limit);
      return ok;
    }
    return WireFormatLite::SkipField(in, tag);
  });
}

bool ReadShape(CodedInputStream* in, uint32_t tag, std::vector<int64_t>* shape) {
  uint64_t v = 0;
  if (WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_VARINT) {
    if (!in->ReadVarint64(&v)) return false;
    shape->push_back(static_cast<int64_t>(v));
    return true;
  }
  int length = 0;
  if (!ReadLength(in, &length)) return false;
  const CodedInputStream::Limit limit = in->PushLimit(length);
  while (in->BytesUntilLimit() > 0) {
    if (!in->ReadVarint64(&v)) return false;
    shape->push_back(static_cast<int64_t>(v));
  }
  in->PopLimit(limit);
  return true;
}

// InferTensorContents: where packed fp32 or fp64 elements lie.
absl::Status ReadContents(CodedInputStream* in, InputView* t) {
  absl::Status error;
  const bool ok = ReadEmbedded(in, [&](uint32_t tag) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const auto type = WireFormatLite::GetTagWireType(tag);
    if (field != kContentsFp32 && field != kContentsFp64) {
      t->contents = Contents::kOther;
      return WireFormatLite::SkipField(in, tag);
    }
    const Contents kind = field == kContentsFp32 ? Contents::kFp32 : Contents::kFp64;
    if (type != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
      error = absl::InvalidArgumentError(absl::StrCat(
          "input '", t->name, "' has its ", field == kContentsFp32 ? "fp32" : "fp64",
          "_contents unpacked (one tag per element); send them packed, as proto3 encoders do, "
          "or in raw_input_contents"));
      return false;
    }
    int length = 0;
    if (!ReadLength(in, &length)) return false;
    if (t->contents != Contents::kNone && t->contents != kind) {
      t->contents = Contents::kOther;
    } else {
      t->contents = kind;
      if (length > 0) {
        t->typed.push_back(
            Span{static_cast<size_t>(in->CurrentPosition()), static_cast<size_t>(length)});
      }
    }
    return in->Skip(length);
  });
  if (!error.ok()) return error;
  return ok ? absl::OkStatus() : Malformed("bad contents");
}

absl::Status ReadInput(CodedInputStream* in, InputView* t) {
  absl::Status error;
  const bool ok = ReadEmbedded(in, [&](uint32_t tag) {
    switch (WireFormatLite::GetTagFieldNumber(tag)) {
      case kInputName:
        return ReadString(in, &t->name);
      case kInputDatatype:
        return ReadString(in, &t->datatype);
      case kInputShape:
        return ReadShape(in, tag, &t->shape);
      case kInputParameters: {
        std::string key;
        if (!ReadParameter(in, &key, nullptr)) return false;
        t->parameters.push_back(std::move(key));
        return true;
      }
      case kInputContents:
        if (WireFormatLite::GetTagWireType(tag) != WireFormatLite::WIRETYPE_LENGTH_DELIMITED) {
          return false;
        }
        error = ReadContents(in, t);
        return error.ok();
      default:
        return WireFormatLite::SkipField(in, tag);
    }
  });
  if (!error.ok()) return error;
  return ok ? absl::OkStatus() : Malformed("bad input tensor");
}

bool ReadRequestedOutput(CodedInputStream* in, RequestedOutputView* o) {
  return ReadEmbedded(in, [&](uint32_t tag) {
    switch (WireFormatLite::GetTagFieldNumber(tag)) {
      case kOutputName:
        return ReadString(in, &o->name);
      case kOutputParameters: {
        std::string key;
        if (!ReadParameter(in, &key, nullptr)) return false;
        o->parameters.push_back(std::move(key));
        return true;
      }
      default:
        return WireFormatLite::SkipField(in, tag);
    }
  });
}

bool IsLengthDelimited(uint32_t tag) {
  return WireFormatLite::GetTagWireType(tag) == WireFormatLite::WIRETYPE_LENGTH_DELIMITED;
}

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

}  // namespace

absl::StatusOr<InferRequestView> PeekInferRequest(const grpc::ByteBuffer& message) {
  // gRPC's reader takes a non-const buffer; a copy shares the slices.
  grpc::ByteBuffer buffer(message);
  grpc::ProtoBufferReader reader(&buffer);
  CodedInputStream in(&reader);
  if (buffer.Length() > INT32_MAX) return Malformed("over 2 GiB");
  // Every length is checked against what is left under a limit.
  in.PushLimit(static_cast<int>(buffer.Length()));
  InferRequestView view;
  while (const uint32_t tag = in.ReadTag()) {
    const int field = WireFormatLite::GetTagFieldNumber(tag);
    const bool delimited = IsLengthDelimited(tag);
    bool ok = true;
    if (!delimited || field < kRequestModelName || field > kRequestRawInputContents) {
      ok = WireFormatLite::SkipField(&in, tag);
    } else if (field == kRequestModelName) {
      ok = ReadString(&in, &view.model_name);
    } else if (field == kRequestModelVersion) {
      ok = ReadString(&in, &view.model_version);
    } else if (field == kRequestId) {
      ok = ReadString(&in, &view.id);
    } else if (field == kRequestParameters) {
      auto& [key, value] = view.parameters.emplace_back();
      ok = ReadParameter(&in, &key, &value);
    } else if (field == kRequestInputs) {
      if (absl::Status s = ReadInput(&in, &view.inputs.emplace_back()); !s.ok()) return s;
    } else if (field == kRequestOutputs) {
      ok = ReadRequestedOutput(&in, &view.outputs.emplace_back());
    } else {  // kRequestRawInputContents
      int length = 0;
      ok = ReadLength(&in, &length);
      if (ok) {
        view.raw_input_contents.push_back(
            Span{static_cast<size_t>(in.CurrentPosition()), static_cast<size_t>(length)});
        ok = in.Skip(length);
      }
    }
    if (!ok) return Malformed(absl::StrCat("bad field ", field));
  }
  if (!in.ConsumedEntireMessage() || static_cast<size_t>(in.CurrentPosition()) != buffer.Length()) {
    return Malformed("truncated or bad tag");
  }
  return view;
}

size_t SpanBytes(const std::vector<Span>& spans) {
  size_t n = 0;
  for (const Span& s : spans) n += s.size;
  return n;
}

absl::Status CopySpans(const grpc::ByteBuffer& message, const std::vector<Span>& spans,
                       std::byte* out) {
  grpc::ByteBuffer buffer(message);
  grpc::ProtoBufferReader reader(&buffer);
  CodedInputStream in(&reader);
  size_t at = 0;
  for (const Span& s : spans) {
    if (s.offset < at || !in.Skip(static_cast<int>(s.offset - at)) ||
        !in.ReadRaw(out, static_cast<int>(s.size))) {
      return absl::InternalError("a tensor's bytes are not where the request was read");
    }
    out += s.size;
    at = s.offset + s.size;
  }
  return absl::OkStatus();
}

grpc::ByteBuffer EncodeInferResponse(const inference::ModelInferResponse& head,
                                     grpc::Slice raw_output) {
  std::string prefix = head.SerializeAsString();
  AppendVarint(WireFormatLite::MakeTag(kResponseRawOutputContents,
                                       WireFormatLite::WIRETYPE_LENGTH_DELIMITED),
               &prefix);
  AppendVarint(raw_output.size(), &prefix);
  if (raw_output.size() <= kInlineResultBytes) {
    prefix.append(reinterpret_cast<const char*>(raw_output.begin()), raw_output.size());
    grpc::Slice one(prefix);
    return grpc::ByteBuffer(&one, 1);
  }
  grpc::Slice slices[2] = {grpc::Slice(prefix), std::move(raw_output)};
  return grpc::ByteBuffer(slices, 2);
}

}  // namespace dgmm::oip
