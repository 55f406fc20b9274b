#include "service/rpc/oip_model.h"

#include <algorithm>
#include <array>
#include <limits>
#include <optional>
#include <string>
#include <tuple>

#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dgmm::oip {
namespace {

struct Datatype {
  const char* name;
  v1::DType dtype;
  int64_t size;
  inference::DataType config;
};
constexpr std::array<Datatype, 4> kDatatypes = {{
    {"FP16", v1::DTYPE_FLOAT16, 2, inference::TYPE_FP16},
    {"BF16", v1::DTYPE_BFLOAT16, 2, inference::TYPE_BF16},
    {"FP32", v1::DTYPE_FLOAT32, 4, inference::TYPE_FP32},
    {"FP64", v1::DTYPE_FLOAT64, 8, inference::TYPE_FP64},
}};

const Datatype* FindDatatype(absl::string_view name) {
  for (const Datatype& t : kDatatypes) {
    if (name == t.name) return &t;
  }
  return nullptr;
}

const Datatype& DatatypeOf(v1::DType dtype) {
  for (const Datatype& t : kDatatypes) {
    if (t.dtype == dtype) return t;
  }
  return kDatatypes[2];
}

// NumPy's result type of two of these (float16 with bfloat16: float32).
v1::DType ResultOf(v1::DType a, v1::DType b) {
  if (a == b) return a;
  if (a == v1::DTYPE_FLOAT64 || b == v1::DTYPE_FLOAT64) return v1::DTYPE_FLOAT64;
  return v1::DTYPE_FLOAT32;
}

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("model 'dgmm': ", what));
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// rows*cols*size, or INT64_MAX when that overflows.
int64_t BytesOf(const std::vector<int64_t>& shape, int64_t size) {
  int64_t n = size;
  for (int64_t d : shape) {
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      return std::numeric_limits<int64_t>::max();
    }
    n *= d;
  }
  return n;
}

// The datatype of `t`, or INVALID_ARGUMENT naming what the model takes (and,
// for a complex one, dgmm's own API).
absl::StatusOr<const Datatype*> InputDatatype(const InputView& t) {
  if (const Datatype* d = FindDatatype(t.datatype)) return d;
  const std::string upper = absl::AsciiStrToUpper(t.datatype);
  if (absl::StartsWith(upper, "COMPLEX") || upper == "C64" || upper == "C128") {
    return Invalid(absl::StrCat(
        "input '", t.name, "' has datatype '", t.datatype,
        "': the Open Inference Protocol has no complex datatype, so this endpoint takes real "
        "tensors only; send complex64 or complex128 jobs through dgmm's own API "
        "(dgmm.v1.Dgmm, as the dgmm clients do)"));
  }
  return Invalid(absl::StrCat("input '", t.name, "' has datatype '", t.datatype,
                              "'; the model takes FP16, BF16, FP32 or FP64"));
}

}  // namespace

absl::Status FindModel(absl::string_view name, absl::string_view version) {
  if (name != kModelName) {
    return absl::NotFoundError(
        absl::StrCat("unknown model '", name, "': this server serves one model, 'dgmm'"));
  }
  if (!version.empty() && version != kModelVersion) {
    return absl::NotFoundError(absl::StrCat("unknown version '", version,
                                            "' of model 'dgmm': it has version '1'"));
  }
  return absl::OkStatus();
}

absl::Status ToJob(const InferRequestView& request, const grpc::ByteBuffer& message,
                   InferJob* job) {
  if (absl::Status s = FindModel(request.model_name, request.model_version); !s.ok()) return s;
  v1::Side side = v1::SIDE_RIGHT;
  for (const auto& [key, value] : request.parameters) {
    if (key != "side") continue;  // other parameters are not the model's
    const std::string& v = value.string_param();
    if (value.parameter_choice_case() != inference::InferParameter::kStringParam ||
        (v != "right" && v != "left" && v != "both")) {
      return Invalid("the parameter 'side' is a string: \"right\" (the default), \"left\" or "
                     "\"both\"");
    }
    side = v == "left" ? v1::SIDE_LEFT : v == "both" ? v1::SIDE_BOTH : v1::SIDE_RIGHT;
  }
  for (const RequestedOutputView& o : request.outputs) {
    if (o.name != "C") {
      return Invalid(absl::StrCat("unknown output '", o.name, "'; the model has one output, 'C'"));
    }
    if (!o.parameters.empty()) {
      return Invalid(absl::StrCat("output 'C' takes no parameters (got '", o.parameters[0],
                                  "'; classification and shared memory are not offered)"));
    }
  }
  const bool both = side == v1::SIDE_BOTH;
  const std::vector<std::string> names =
      both ? std::vector<std::string>{"A", "l", "r"} : std::vector<std::string>{"A", "d"};
  const bool raw = !request.raw_input_contents.empty();
  if (raw && request.raw_input_contents.size() != request.inputs.size()) {
    return Invalid(absl::StrCat("raw_input_contents has ", request.raw_input_contents.size(),
                                " entries for ", request.inputs.size(),
                                " inputs; it needs one per input, in their order"));
  }
  // The inputs by name, each with where its bytes lie and its datatype.
  struct Found {
    const InputView* view = nullptr;
    std::vector<Span> data;
    const Datatype* type = nullptr;
  };
  std::vector<Found> found(names.size());
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const InputView& t = request.inputs[i];
    const auto at = std::find(names.begin(), names.end(), t.name);
    if (at == names.end()) {
      return Invalid(absl::StrCat("unexpected input '", t.name, "'; side ",
                                  both ? "\"both\" takes A, l and r" : "\"right\" or \"left\" takes A and d"));
    }
    Found& f = found[static_cast<size_t>(at - names.begin())];
    if (f.view != nullptr) return Invalid(absl::StrCat("input '", t.name, "' is given twice"));
    f.view = &t;
    if (!t.parameters.empty()) {
      return Invalid(absl::StrCat("input '", t.name, "' takes no parameters (got '",
                                  t.parameters[0], "'; shared memory is not offered)"));
    }
    absl::StatusOr<const Datatype*> type = InputDatatype(t);
    if (!type.ok()) return type.status();
    f.type = *type;
    if (raw) {
      if (t.contents != Contents::kNone) {
        return Invalid(absl::StrCat("input '", t.name,
                                    "' has contents while raw_input_contents is set; use one"));
      }
      f.data = {request.raw_input_contents[i]};
    } else {
      const Contents want = f.type->dtype == v1::DTYPE_FLOAT32   ? Contents::kFp32
                            : f.type->dtype == v1::DTYPE_FLOAT64 ? Contents::kFp64
                                                                 : Contents::kNone;
      if (want == Contents::kNone) {
        return Invalid(absl::StrCat("input '", t.name, "' is ", t.datatype,
                                    ", which travels in raw_input_contents only"));
      }
      if (t.contents != want && !(t.contents == Contents::kNone && BytesOf(t.shape, 1) == 0)) {
        return Invalid(absl::StrCat("input '", t.name, "' is ", t.datatype, ": its elements go in ",
                                    want == Contents::kFp32 ? "fp32" : "fp64",
                                    "_contents or raw_input_contents"));
      }
      f.data = t.typed;
    }
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (found[i].view == nullptr) {
      return Invalid(absl::StrCat("missing input '", names[i], "' (side ",
                                  both ? "\"both\" takes A [rows, cols], l [rows] and r [cols]"
                                       : "\"right\" takes A [rows, cols] and d [cols], \"left\" "
                                         "A and d [rows]",
                                  ")"));
    }
  }
  const Found& a = found[0];
  if (a.view->shape.size() != 2 || a.view->shape[0] < 1 || a.view->shape[1] < 1) {
    return Invalid(absl::StrCat("input 'A' has shape ", ShapeString(a.view->shape),
                                "; it is a matrix [rows, cols] of at least one element"));
  }
  const int64_t rows = a.view->shape[0];
  const int64_t cols = a.view->shape[1];
  for (size_t i = 1; i < names.size(); ++i) {
    const InputView& t = *found[i].view;
    const int64_t want = names[i] == "r" || (names[i] == "d" && side == v1::SIDE_RIGHT) ? cols : rows;
    if (t.shape.size() != 1 || t.shape[0] != want) {
      return Invalid(absl::StrCat("input '", t.name, "' has shape ", ShapeString(t.shape), "; A is ",
                                  ShapeString(a.view->shape), ", so side \"",
                                  side == v1::SIDE_LEFT ? "left" : both ? "both" : "right",
                                  "\" needs '", t.name, "' of shape [", want, "]"));
    }
  }
  if (both && found[1].type != found[2].type) {
    return Invalid(absl::StrCat("l is ", found[1].type->name, " and r is ", found[2].type->name,
                                "; the two diagonals have one datatype"));
  }
  for (const Found& f : found) {
    const int64_t want = BytesOf(f.view->shape, f.type->size);
    const size_t have = SpanBytes(f.data);
    if (static_cast<uint64_t>(want) != have) {
      return Invalid(absl::StrCat("input '", f.view->name, "' has ", have, " bytes; shape ",
                                  ShapeString(f.view->shape), " of ", f.type->name, " needs ",
                                  want));
    }
  }
  v1::JobHeader& h = job->header;
  h.set_rows(rows);
  h.set_cols(cols);
  h.set_dtype(a.type->dtype);
  h.set_layout(v1::LAYOUT_ROW_MAJOR);
  h.set_side(side);
  h.set_diagonal_dtype(found[1].type->dtype);
  const v1::DType c = ResultOf(a.type->dtype, found[1].type->dtype);
  h.set_result_dtype(c);
  for (const auto& [f, field] : {std::pair{&found[1], h.mutable_diagonal()},
                                 std::pair{both ? &found[2] : nullptr, h.mutable_right_diagonal()}}) {
    if (f == nullptr) continue;
    field->resize(SpanBytes(f->data));
    if (absl::Status s = CopySpans(message, f->data, reinterpret_cast<std::byte*>(field->data()));
        !s.ok()) {
      return s;
    }
  }
  job->matrix = a.data;
  job->matrix_bytes = static_cast<int64_t>(SpanBytes(a.data));
  inference::ModelInferResponse& head = job->head;
  head.set_model_name(kModelName);
  head.set_model_version(kModelVersion);
  head.set_id(request.id);
  auto* out = head.add_outputs();
  out->set_name("C");
  out->set_datatype(DatatypeOf(c).name);
  out->add_shape(rows);
  out->add_shape(cols);
  return absl::OkStatus();
}

inference::ModelMetadataResponse Metadata() {
  inference::ModelMetadataResponse m;
  m.set_name(kModelName);
  m.add_versions(std::string(kModelVersion));
  m.set_platform("dgmm");
  for (const auto& [name, rank] : {std::pair{"A", 2}, std::pair{"d", 1}}) {
    auto* t = m.add_inputs();
    t->set_name(name);
    t->set_datatype("FP32");
    for (int i = 0; i < rank; ++i) t->add_shape(-1);
  }
  auto* c = m.add_outputs();
  c->set_name("C");
  c->set_datatype("FP32");
  c->add_shape(-1);
  c->add_shape(-1);
  return m;
}

inference::ModelConfigResponse Config() {
  inference::ModelConfigResponse r;
  inference::ModelConfig& c = *r.mutable_config();
  c.set_name(kModelName);
  c.set_platform("dgmm");
  c.set_backend("dgmm");
  c.set_max_batch_size(0);
  for (const auto& [name, rank, optional] :
       {std::tuple{"A", 2, false}, std::tuple{"d", 1, false}, std::tuple{"l", 1, true},
        std::tuple{"r", 1, true}}) {
    auto* in = c.add_input();
    in->set_name(name);
    in->set_data_type(inference::TYPE_FP32);
    for (int i = 0; i < rank; ++i) in->add_dims(-1);
    in->set_optional(optional);
  }
  auto* out = c.add_output();
  out->set_name("C");
  out->set_data_type(inference::TYPE_FP32);
  out->add_dims(-1);
  out->add_dims(-1);
  return r;
}

}  // namespace dgmm::oip
