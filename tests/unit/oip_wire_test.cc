// service/rpc/oip_wire.h against the classes generated from
// proto/inference/grpc_predict_v2.proto: a request the generated class
// serializes is read field for field, its tensors' bytes found where they
// are; a response encoded by hand parses back as the generated class.
#include "service/rpc/oip_wire.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "proto/wire.h"

namespace dgmm::oip {
namespace {

grpc::ByteBuffer Bytes(const std::string& s) {
  grpc::Slice slice(s);
  return grpc::ByteBuffer(&slice, 1);
}

// `s` cut into slices of `piece` bytes, as gRPC's reads may leave it.
grpc::ByteBuffer Pieces(const std::string& s, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t i = 0; i < s.size(); i += piece) slices.emplace_back(s.substr(i, piece));
  return grpc::ByteBuffer(slices.data(), slices.size());
}

std::string Copied(const grpc::ByteBuffer& message, const std::vector<Span>& spans) {
  std::string out(SpanBytes(spans), '\0');
  EXPECT_TRUE(CopySpans(message, spans, reinterpret_cast<std::byte*>(out.data())).ok());
  return out;
}

TEST(OipWire, ReadsEveryFieldAndFindsTheTensorsBytes) {
  inference::ModelInferRequest r;
  r.set_model_name("dgmm");
  r.set_model_version("1");
  r.set_id("req-7");
  (*r.mutable_parameters())["side"].set_string_param("left");
  (*r.mutable_parameters())["priority"].set_int64_param(3);
  auto* a = r.add_inputs();
  a->set_name("A");
  a->set_datatype("FP32");
  a->add_shape(2);
  a->add_shape(3);
  auto* d = r.add_inputs();
  d->set_name("d");
  d->set_datatype("FP64");
  d->add_shape(2);
  (*d->mutable_parameters())["x"].set_bool_param(true);
  for (double v : {1.5, -2.25}) d->mutable_contents()->add_fp64_contents(v);
  r.add_outputs()->set_name("C");
  std::string matrix(24, '\0');
  for (size_t i = 0; i < matrix.size(); ++i) matrix[i] = static_cast<char>(i * 7);
  r.add_raw_input_contents(matrix);
  r.add_raw_input_contents("xy");
  const std::string encoded = r.SerializeAsString();
  for (size_t piece : {encoded.size(), size_t{5}, size_t{1}}) {
    const grpc::ByteBuffer message = Pieces(encoded, piece);
    absl::StatusOr<InferRequestView> view = PeekInferRequest(message);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ(view->model_name, "dgmm");
    EXPECT_EQ(view->model_version, "1");
    EXPECT_EQ(view->id, "req-7");
    ASSERT_EQ(view->parameters.size(), 2u);
    ASSERT_EQ(view->inputs.size(), 2u);
    EXPECT_EQ(view->inputs[0].name, "A");
    EXPECT_EQ(view->inputs[0].shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(view->inputs[0].contents, Contents::kNone);
    EXPECT_EQ(view->inputs[1].datatype, "FP64");
    EXPECT_EQ(view->inputs[1].parameters, std::vector<std::string>{"x"});
    EXPECT_EQ(view->inputs[1].contents, Contents::kFp64);
    const std::string typed = Copied(message, view->inputs[1].typed);
    ASSERT_EQ(typed.size(), 16u);
    double first;
    std::memcpy(&first, typed.data(), 8);
    EXPECT_EQ(first, 1.5);
    ASSERT_EQ(view->outputs.size(), 1u);
    EXPECT_EQ(view->outputs[0].name, "C");
    ASSERT_EQ(view->raw_input_contents.size(), 2u);
    EXPECT_EQ(Copied(message, {view->raw_input_contents[0]}), matrix);
    EXPECT_EQ(Copied(message, view->raw_input_contents), matrix + "xy");
  }
}

TEST(OipWire, RefusesMalformedMessagesAndUnpackedContents) {
  inference::ModelInferRequest r;
  r.set_model_name("dgmm");
  r.add_raw_input_contents(std::string(100, 'a'));
  const std::string encoded = r.SerializeAsString();
  for (size_t cut : {encoded.size() - 1, encoded.size() - 50, size_t{3}}) {
    auto view = PeekInferRequest(Bytes(encoded.substr(0, cut)));
    EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument) << cut;
  }
  // inputs { name: "A" contents { fp32_contents (unpacked): 1.0 } }
  using std::string_literals::operator""s;
  std::string unpacked = "\x2a\x0a\x0a\x01"
                         "A"
                         "\x2a\x05\x35\x00\x00\x80\x3f"s;
  unpacked[1] = static_cast<char>(unpacked.size() - 2);
  auto view = PeekInferRequest(Bytes(unpacked));
  EXPECT_EQ(view.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(view.status().message().find("unpacked"), std::string::npos) << view.status();
}

TEST(OipWire, ResponseParsesAsTheGeneratedClass) {
  for (size_t bytes : {size_t{12}, size_t{100000}}) {
    inference::ModelInferResponse head;
    head.set_model_name("dgmm");
    head.set_id("r");
    auto* c = head.add_outputs();
    c->set_name("C");
    c->set_datatype("FP32");
    c->add_shape(1);
    c->add_shape(static_cast<int64_t>(bytes / 4));
    std::string result(bytes, '\0');
    for (size_t i = 0; i < bytes; ++i) result[i] = static_cast<char>(i % 251);
    grpc::ByteBuffer encoded = EncodeInferResponse(head, grpc::Slice(result));
    inference::ModelInferResponse parsed;
    ASSERT_TRUE(wire::ParseMessage(encoded, &parsed));
    EXPECT_EQ(parsed.id(), "r");
    EXPECT_EQ(parsed.outputs(0).shape(1), static_cast<int64_t>(bytes / 4));
    ASSERT_EQ(parsed.raw_output_contents_size(), 1);
    EXPECT_EQ(parsed.raw_output_contents(0), result);
  }
}

}  // namespace
}  // namespace dgmm::oip
