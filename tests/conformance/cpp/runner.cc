// dgmm_conformance_cpp: the C++ client's runner of the conformance suite
// (tests/conformance/README.md).
//   dgmm_conformance_cpp --case FILE --target TARGET
//     runs the case's job with dgmm::Client (random operands from the seed,
//     the output filled with NaN first, checked element by element against a
//     float64 reference computed here) and prints one JSON line.
//   dgmm_conformance_cpp --vectors FILE
//     checks the policy vectors against the library's policy functions.
// Exit status 0 unless the runner itself broke (vectors: 1 if any failed).
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdio>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "dgmm/client.h"
#include "service/core/scalar_types.h"
#include "tests/support/files.h"

namespace dgmm {
namespace {

using google::protobuf::ListValue;
using google::protobuf::Struct;
using google::protobuf::Value;

// A JSON string literal.
std::string Quote(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

const Value* Field(const Struct& s, const std::string& name) {
  auto it = s.fields().find(name);
  if (it == s.fields().end() || it->second.has_null_value()) return nullptr;
  return &it->second;
}

int64_t IntField(const Struct& s, const std::string& name, int64_t fallback) {
  const Value* v = Field(s, name);
  return v != nullptr && v->has_number_value() ? static_cast<int64_t>(v->number_value())
                                               : fallback;
}

std::string StringField(const Struct& s, const std::string& name) {
  const Value* v = Field(s, name);
  return v != nullptr && v->has_string_value() ? v->string_value() : "";
}

struct Outcome {
  std::string name;
  absl::Status status;
  TransferMode mode = TransferMode::kUnary;
  int stripes = 1;
  int attempts = 0;
  int resumed = 0;
  // OK jobs: whether every result line arrived exactly once
  // (JobResult::received_bytes, which counts a line received twice, equals
  // the matrix bytes).
  std::optional<bool> placed_once;
  bool checked = false;
  double max_abs_err = 0;
  // OK jobs: C's dtype as the client computes it (ResultDType of the job).
  std::string result_dtype;
};

void Print(const Outcome& o) {
  const std::string err =
      std::isfinite(o.max_abs_err) ? absl::StrFormat("%.17g", o.max_abs_err) : "1e308";
  std::printf(
      "{\"name\": %s, \"status\": %s, \"mode\": %s, \"stripes\": %d, \"attempts\": %d, "
      "\"checked\": %s, \"max_abs_err\": %s, \"message\": %s, \"resumed\": %d%s%s}\n",
      Quote(o.name).c_str(), Quote(absl::StatusCodeToString(o.status.code())).c_str(),
      Quote(TransferModeName(o.mode)).c_str(), o.stripes, o.attempts,
      o.checked ? "true" : "false", err.c_str(), Quote(std::string(o.status.message())).c_str(),
      o.resumed,
      !o.placed_once.has_value() ? ""
      : *o.placed_once           ? ", \"placed_once\": true"
                                 : ", \"placed_once\": false",
      o.result_dtype.empty() ? "" : absl::StrCat(", \"result_dtype\": ", Quote(o.result_dtype)).c_str());
  std::fflush(stdout);
}

// A case's element type: its wire name and size, complex or not, and how a
// value is stored (float16 through the kernel layer's own conversion,
// rounded to nearest).
struct CaseDType {
  v1::DType wire = v1::DTYPE_UNSPECIFIED;
  size_t size = 0;
  bool complex = false;
  double tolerance = 0;  // relative, per element: a rounding or two of it
};

// The case name of a dtype ("" for others).
std::string CaseDTypeName(v1::DType dtype) {
  switch (dtype) {
    case v1::DTYPE_FLOAT16:
      return "float16";
    case v1::DTYPE_FLOAT32:
      return "float32";
    case v1::DTYPE_FLOAT64:
      return "float64";
    case v1::DTYPE_COMPLEX64:
      return "complex64";
    case v1::DTYPE_COMPLEX128:
      return "complex128";
    default:
      return "";
  }
}

std::optional<CaseDType> CaseDTypeOf(const std::string& name) {
  if (name == "float16") return CaseDType{v1::DTYPE_FLOAT16, 2, false, 2e-3};
  if (name == "float32") return CaseDType{v1::DTYPE_FLOAT32, 4, false, 1e-6};
  if (name == "float64") return CaseDType{v1::DTYPE_FLOAT64, 8, false, 1e-15};
  if (name == "complex64") return CaseDType{v1::DTYPE_COMPLEX64, 8, true, 1e-6};
  if (name == "complex128") return CaseDType{v1::DTYPE_COMPLEX128, 16, true, 4e-15};
  return std::nullopt;
}

using Z = std::complex<double>;

void Store(const CaseDType& t, Z v, std::byte* at) {
  switch (t.wire) {
    case v1::DTYPE_FLOAT16: {
      const uint16_t h = FloatToHalfBits(static_cast<float>(v.real()));
      std::memcpy(at, &h, 2);
      return;
    }
    case v1::DTYPE_FLOAT32: {
      const float f = static_cast<float>(v.real());
      std::memcpy(at, &f, 4);
      return;
    }
    case v1::DTYPE_FLOAT64: {
      const double f = v.real();
      std::memcpy(at, &f, 8);
      return;
    }
    case v1::DTYPE_COMPLEX64: {
      const float f[2] = {static_cast<float>(v.real()), static_cast<float>(v.imag())};
      std::memcpy(at, f, 8);
      return;
    }
    default: {
      const double f[2] = {v.real(), v.imag()};
      std::memcpy(at, f, 16);
      return;
    }
  }
}

Z Load(const CaseDType& t, const std::byte* at) {
  switch (t.wire) {
    case v1::DTYPE_FLOAT16: {
      uint16_t h;
      std::memcpy(&h, at, 2);
      return HalfBitsToFloat(h);
    }
    case v1::DTYPE_FLOAT32: {
      float f;
      std::memcpy(&f, at, 4);
      return f;
    }
    case v1::DTYPE_FLOAT64: {
      double f;
      std::memcpy(&f, at, 8);
      return f;
    }
    case v1::DTYPE_COMPLEX64: {
      float f[2];
      std::memcpy(f, at, 8);
      return Z(f[0], f[1]);
    }
    default: {
      double f[2];
      std::memcpy(f, at, 16);
      return Z(f[0], f[1]);
    }
  }
}

// NumPy's result_type of two case dtypes, computed here (not with the
// client's PromoteDTypes): float16 with float32 gives float32; a real with a
// complex, the complex type whose parts are as wide as the wider of the two;
// otherwise the wider.
v1::DType Promote(const CaseDType& x, const CaseDType& y) {
  if (x.wire == y.wire) return x.wire;
  auto part_bytes = [](const CaseDType& t) { return t.complex ? t.size / 2 : t.size; };
  const size_t part = std::max<size_t>({part_bytes(x), part_bytes(y), 4});
  if (x.complex || y.complex) return part == 4 ? v1::DTYPE_COMPLEX64 : v1::DTYPE_COMPLEX128;
  return part == 4 ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT64;
}

// A: `t`; the diagonals: `dt`; C: their result type.
void RunTyped(const Struct& c, const CaseDType& t, const CaseDType& dt, const std::string& target,
              Outcome* o) {
  const int64_t rows = IntField(c, "rows", 0);
  const int64_t cols = IntField(c, "cols", 0);
  const std::string layout_name = StringField(c, "layout");
  const std::string side_name = StringField(c, "side");
  const v1::Layout layout = layout_name == "col" ? v1::LAYOUT_COL_MAJOR : v1::LAYOUT_ROW_MAJOR;
  const v1::Side side = side_name == "left"   ? v1::SIDE_LEFT
                        : side_name == "both" ? v1::SIDE_BOTH
                                              : v1::SIDE_RIGHT;
  if ((layout_name != "row" && layout_name != "col") ||
      (side_name != "right" && side_name != "left" && side_name != "both")) {
    o->status = absl::InvalidArgumentError(
        absl::StrCat("layout '", layout_name, "' or side '", side_name, "' is not valid"));
    return;
  }
  ClientOptions options;
  options.load_balancing_policy = "round_robin";
  static const Struct kEmpty;
  const Value* opts_value = Field(c, "options");
  const Struct& opts = opts_value != nullptr ? opts_value->struct_value() : kEmpty;
  options.stripes = static_cast<int>(IntField(opts, "stripes", 0));
  options.chunk_bytes = IntField(opts, "chunk_bytes", options.chunk_bytes);
  options.max_unary_message_bytes =
      IntField(opts, "max_unary_message_bytes", options.max_unary_message_bytes);
  options.retry.max_attempts =
      static_cast<int>(IntField(opts, "max_attempts", options.retry.max_attempts));
  if (const Value* d = Field(opts, "deadline_s"); d != nullptr && d->has_number_value()) {
    options.deadline = absl::Seconds(d->number_value());
  }
  const size_t elem = t.size;
  const size_t d_elem = dt.size;
  const CaseDType ct = *CaseDTypeOf(CaseDTypeName(Promote(t, dt)));
  const size_t c_elem = ct.size;
  const int64_t lines = layout == v1::LAYOUT_COL_MAJOR ? cols : rows;
  const bool shape_ok = rows >= 1 && cols >= 1;
  const int64_t matrix_bytes = shape_ok ? rows * cols * static_cast<int64_t>(elem) : 0;
  const int64_t diag_len = side == v1::SIDE_RIGHT ? cols : rows;
  const int64_t right_len = side == v1::SIDE_BOTH ? cols : 0;
  // What the policy plans, reported when the job fails.
  if (shape_ok) {
    o->stripes = ChooseStripes(matrix_bytes, lines, options.stripes);
    o->mode =
        ChooseTransferMode(matrix_bytes + (diag_len + right_len) * static_cast<int64_t>(d_elem),
                           options.max_unary_message_bytes, options.chunk_bytes,
                           matrix_bytes / lines);
  }
  absl::StatusOr<v1::Backend> backend = ParseBackendName(StringField(c, "backend"));
  if (!backend.ok()) {
    o->status = backend.status();
    return;
  }
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Create(target, options);
  if (!client.ok()) {
    o->status = client.status();
    return;
  }
  // Random operands in [0.5, 2) (both parts for complex) from the seed; the
  // output poisoned with NaN.
  std::mt19937_64 rng(static_cast<uint64_t>(IntField(c, "seed", 1)));
  std::uniform_real_distribution<double> uniform(0.5, 2.0);
  const size_t n = shape_ok ? static_cast<size_t>(rows * cols) : 1;
  auto draw = [&](size_t count, const CaseDType& of) {
    std::vector<std::byte> v(std::max<size_t>(count, 1) * of.size);
    for (size_t i = 0; i < count; ++i) {
      const double re = uniform(rng);
      Store(of, Z(re, of.complex ? uniform(rng) : 0.0), v.data() + i * of.size);
    }
    return v;
  };
  const std::vector<std::byte> a = draw(n, t);
  const std::vector<std::byte> d = draw(static_cast<size_t>(std::max<int64_t>(diag_len, 0)), dt);
  const std::vector<std::byte> r = draw(static_cast<size_t>(right_len), dt);
  std::vector<std::byte> out(n * c_elem);
  for (size_t i = 0; i < n; ++i) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    Store(ct, Z(nan, nan), out.data() + i * c_elem);
  }
  Job job;
  job.matrix = {a.data(), rows, cols, t.wire, layout};
  job.diagonal = d.data();
  job.diagonal_bytes = static_cast<size_t>(std::max<int64_t>(diag_len, 0)) * d_elem;
  job.diagonal_dtype = dt.wire;
  if (side == v1::SIDE_BOTH) {
    job.right_diagonal = r.data();
    job.right_diagonal_bytes = static_cast<size_t>(right_len) * d_elem;
  }
  job.side = side;
  job.backend = *backend;
  absl::StatusOr<JobResult> result = (*client)->Multiply(job, out.data(), out.size());
  if (!result.ok()) {
    o->status = result.status();
    o->attempts = AttemptsOf(result.status());
    return;
  }
  o->status = absl::OkStatus();
  o->mode = result->mode;
  o->stripes = result->stripes;
  o->attempts = result->attempts;
  o->resumed = result->resumed;
  // Every line once: the bytes received are C's, in its dtype.
  o->placed_once = result->received_bytes == static_cast<int64_t>(out.size());
  o->result_dtype = CaseDTypeName(ResultDType(job));
  // Element by element against float64 (complex128).
  bool all_ok = true;
  double worst = 0;
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const size_t k =
          static_cast<size_t>(layout == v1::LAYOUT_ROW_MAJOR ? i * cols + j : j * rows + i);
      const Z av = Load(t, a.data() + k * elem);
      Z ref;
      if (side == v1::SIDE_BOTH) {
        ref = (Load(dt, d.data() + static_cast<size_t>(i) * d_elem) * av) *
              Load(dt, r.data() + static_cast<size_t>(j) * d_elem);
      } else {
        ref = Load(dt, d.data() + static_cast<size_t>(side == v1::SIDE_RIGHT ? j : i) * d_elem) *
              av;
      }
      const double abs_err = std::abs(Load(ct, out.data() + k * c_elem) - ref);
      if (!(abs_err <= ct.tolerance * std::abs(ref))) all_ok = false;  // NaN fails too
      if (!(abs_err <= worst)) worst = std::isnan(abs_err) ? INFINITY : abs_err;
    }
  }
  o->checked = all_ok;
  o->max_abs_err = worst;
}

int RunCase(const std::string& path, const std::string& target) {
  const std::optional<std::string> text = dgmm::testing::ReadFile(path);
  if (!text.has_value()) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 2;
  }
  Struct c;
  if (!google::protobuf::util::JsonStringToMessage(*text, &c).ok()) {
    std::fprintf(stderr, "%s is not a JSON object\n", path.c_str());
    return 2;
  }
  Outcome o;
  o.name = StringField(c, "name");
  const std::string dtype = StringField(c, "dtype");
  // The diagonals' dtype: "diagonal_dtype", default A's.
  std::string diagonal_dtype = StringField(c, "diagonal_dtype");
  if (diagonal_dtype.empty()) diagonal_dtype = dtype;
  const std::optional<CaseDType> t = CaseDTypeOf(dtype);
  const std::optional<CaseDType> dt = CaseDTypeOf(diagonal_dtype);
  if (t.has_value() && dt.has_value()) {
    RunTyped(c, *t, *dt, target, &o);
  } else {
    o.status = absl::InvalidArgumentError(absl::StrCat("dtype '", dtype, "' or diagonal_dtype '",
                                                       diagonal_dtype, "' is not valid"));
  }
  Print(o);
  return 0;
}

int RunVectors(const std::string& path) {
  const std::optional<std::string> text = dgmm::testing::ReadFile(path);
  if (!text.has_value()) {
    std::fprintf(stderr, "cannot read %s\n", path.c_str());
    return 2;
  }
  // A top-level array, read as the "v" field of an object.
  Struct wrapper;
  if (!google::protobuf::util::JsonStringToMessage(absl::StrCat("{\"v\": ", *text, "}"), &wrapper)
           .ok()) {
    std::fprintf(stderr, "%s is not a JSON array\n", path.c_str());
    return 2;
  }
  const ListValue& list = wrapper.fields().at("v").list_value();
  std::vector<std::string> failed;
  int index = 0;
  for (const Value& item : list.values()) {
    const Struct& v = item.struct_value();
    const int64_t matrix_bytes = IntField(v, "matrix_bytes", 0);
    const int64_t diag_bytes = IntField(v, "diag_bytes", 0);
    const int64_t line_bytes = IntField(v, "line_bytes", 1);
    const int64_t lines = IntField(v, "lines", 1);
    const int64_t unary = IntField(v, "unary_limit", int64_t{16} << 20);
    const int64_t chunk = IntField(v, "chunk_bytes", int64_t{4} << 20);
    const int option = static_cast<int>(IntField(v, "stripes_option", 0));
    const TransferMode mode =
        ChooseTransferMode(matrix_bytes + diag_bytes, unary, chunk, line_bytes);
    const int k = ChooseStripes(matrix_bytes, lines, option);
    const std::vector<LineRange> ranges = SplitLines(lines, k);
    std::vector<std::string> problems;
    if (StringField(v, "expect_mode") != TransferModeName(mode)) {
      problems.push_back(absl::StrCat("mode ", TransferModeName(mode)));
    }
    if (IntField(v, "expect_stripes", -1) != k) problems.push_back(absl::StrCat("stripes ", k));
    const Value* want = Field(v, "expect_ranges");
    bool ranges_ok = want != nullptr &&
                     want->list_value().values_size() == static_cast<int>(ranges.size());
    for (size_t i = 0; ranges_ok && i < ranges.size(); ++i) {
      const ListValue& pair = want->list_value().values(static_cast<int>(i)).list_value();
      ranges_ok = pair.values_size() == 2 &&
                  static_cast<int64_t>(pair.values(0).number_value()) == ranges[i].first_line &&
                  static_cast<int64_t>(pair.values(1).number_value()) == ranges[i].lines;
    }
    if (!ranges_ok) problems.push_back("ranges");
    if (Field(v, "expect_lines_per_block") != nullptr) {
      const int64_t per_block = std::max<int64_t>(1, chunk / line_bytes);
      if (IntField(v, "expect_lines_per_block", -1) != per_block) {
        problems.push_back(absl::StrCat("lines_per_block ", per_block));
      }
    }
    if (!problems.empty()) {
      failed.push_back(absl::StrCat(index, ": ", absl::StrJoin(problems, ", ")));
    }
    ++index;
  }
  std::vector<std::string> quoted;
  for (const std::string& f : failed) quoted.push_back(Quote(f));
  std::printf("{\"vectors\": %d, \"failed\": [%s]}\n", index, absl::StrJoin(quoted, ", ").c_str());
  return failed.empty() ? 0 : 1;
}

}  // namespace
}  // namespace dgmm

int main(int argc, char** argv) {
  dgmm::ConfigureGrpcForQuickExit();
  std::string case_path, target, vectors;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--case") {
      case_path = argv[i + 1];
    } else if (flag == "--target") {
      target = argv[i + 1];
    } else if (flag == "--vectors") {
      vectors = argv[i + 1];
    }
  }
  if (!vectors.empty()) return dgmm::RunVectors(vectors);
  if (case_path.empty() || target.empty()) {
    std::fprintf(stderr,
                 "usage: dgmm_conformance_cpp --case FILE --target TARGET | --vectors FILE\n");
    return 2;
  }
  return dgmm::RunCase(case_path, target);
}
