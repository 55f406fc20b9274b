#include "dgmm/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace dgmm {
namespace {

constexpr absl::string_view kMagic("\x93NUMPY", 6);
// Larger headers are not .npy files dgmm can use (NumPy itself refuses
// headers over 10000 bytes unless told otherwise).
constexpr size_t kMaxHeaderBytes = size_t{1} << 20;
// Keeps element counts and byte sizes far from overflow.
constexpr int64_t kMaxElements = int64_t{1} << 58;

absl::Status Malformed(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("malformed .npy header: ", what));
}

std::string ShapeText(const std::vector<int64_t>& shape) {
  if (shape.size() == 1) return absl::StrCat("(", shape[0], ",)");
  return absl::StrCat("(", absl::StrJoin(shape, ", "), ")");
}

// The descr NumPy writes for each dtype dgmm reads. bfloat16 is
// ml_dtypes.bfloat16, which NumPy saves as a 2-byte void ('<V2' or '|V2').
struct DescrOf {
  const char* descr;
  v1::DType dtype;
  size_t bytes;
  const char* name;
};
constexpr DescrOf kDescrs[] = {
    {"<f2", v1::DTYPE_FLOAT16, 2, "float16"},     {"<V2", v1::DTYPE_BFLOAT16, 2, "bfloat16"},
    {"<f4", v1::DTYPE_FLOAT32, 4, "float32"},     {"<f8", v1::DTYPE_FLOAT64, 8, "float64"},
    {"<c8", v1::DTYPE_COMPLEX64, 8, "complex64"}, {"<c16", v1::DTYPE_COMPLEX128, 16, "complex128"},
    {"|V2", v1::DTYPE_BFLOAT16, 2, "bfloat16"},
};

const DescrOf* Find(v1::DType dtype) {
  for (const DescrOf& d : kDescrs) {
    if (d.dtype == dtype) return &d;
  }
  return nullptr;
}

size_t ElementBytes(v1::DType dtype) {
  const DescrOf* d = Find(dtype);
  return d != nullptr ? d->bytes : 0;
}

const char* NameOf(v1::DType dtype) {
  const DescrOf* d = Find(dtype);
  return d != nullptr ? d->name : "?";
}

constexpr absl::string_view kReads =
    "float16 ('<f2'), bfloat16 ('<V2', ml_dtypes.bfloat16 as np.save writes it), float32 "
    "('<f4'), float64 ('<f8'), complex64 ('<c8') and complex128 ('<c16')";

// Parses the header dictionary, a Python literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
// with exactly the keys descr, fortran_order and shape.
class HeaderDictParser {
 public:
  explicit HeaderDictParser(absl::string_view text) : text_(text) {}

  absl::StatusOr<NpyHeader> Parse() {
    NpyHeader header;
    bool have_descr = false, have_order = false, have_shape = false;
    SkipSpace();
    if (!Consume('{')) return Error("expected '{'");
    while (true) {
      SkipSpace();
      if (Consume('}')) break;
      absl::StatusOr<std::string> key = ParseString();
      if (!key.ok()) return key.status();
      SkipSpace();
      if (!Consume(':')) return Error("expected ':' after a key");
      SkipSpace();
      absl::Status value;
      if (*key == "descr" && !have_descr) {
        have_descr = true;
        value = ParseDescr(&header.dtype);
      } else if (*key == "fortran_order" && !have_order) {
        have_order = true;
        value = ParseBool(&header.fortran_order);
      } else if (*key == "shape" && !have_shape) {
        have_shape = true;
        value = ParseShape(&header.shape);
      } else {
        return Error(absl::StrCat("unexpected or repeated key '", *key,
                                  "'; expected descr, fortran_order and shape"));
      }
      if (!value.ok()) return value;
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume('}')) break;
      return Error("expected ',' or '}'");
    }
    SkipSpace();
    if (pos_ != text_.size()) return Error("unexpected text after '}'");
    if (!have_descr || !have_order || !have_shape) {
      return Error("the dictionary must have the keys descr, fortran_order and shape");
    }
    return header;
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return Malformed(absl::StrCat(what, " at offset ", pos_, " of \"", text_, "\""));
  }

  void SkipSpace() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' ||
                                   text_[pos_] == '\n' || text_[pos_] == '\r')) {
      ++pos_;
    }
  }

  bool Consume(char c) {
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }

  absl::StatusOr<std::string> ParseString() {
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) {
      return Error("expected a quoted string");
    }
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == absl::string_view::npos) return Error("unterminated string");
    std::string value(text_.substr(pos_, end - pos_));
    pos_ = end + 1;
    return value;
  }

  absl::Status ParseDescr(v1::DType* dtype) {
    if (pos_ < text_.size() && text_[pos_] == '[') {
      return absl::InvalidArgumentError(absl::StrCat(
          "the .npy file holds a structured array; dgmm reads plain arrays of ", kReads));
    }
    absl::StatusOr<std::string> descr = ParseString();
    if (!descr.ok()) return descr.status();
    for (const DescrOf& d : kDescrs) {
      if (*descr == d.descr) {
        *dtype = d.dtype;
        return absl::OkStatus();
      }
    }
    if (*descr == ">f2" || *descr == ">f4" || *descr == ">f8" || *descr == ">c8" ||
        *descr == ">c16") {
      return absl::InvalidArgumentError(
          absl::StrCat("the .npy array is big-endian ('", *descr,
                       "'); dgmm reads little-endian arrays: convert it with "
                       "a.astype(a.dtype.newbyteorder('<'))"));
    }
    return absl::InvalidArgumentError(absl::StrCat("the .npy array has dtype '", *descr,
                                                   "'; dgmm reads ", kReads,
                                                   ": convert it with a.astype('<f8')"));
  }

  absl::Status ParseBool(bool* value) {
    if (absl::StartsWith(text_.substr(pos_), "True")) {
      *value = true;
      pos_ += 4;
    } else if (absl::StartsWith(text_.substr(pos_), "False")) {
      *value = false;
      pos_ += 5;
    } else {
      return Error("expected True or False");
    }
    return absl::OkStatus();
  }

  absl::Status ParseShape(std::vector<int64_t>* shape) {
    if (!Consume('(')) return Error("expected '(' to start the shape");
    while (true) {
      SkipSpace();
      if (Consume(')')) break;
      const size_t start = pos_;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') ++pos_;
      int64_t dim = 0;
      if (pos_ == start || !absl::SimpleAtoi(text_.substr(start, pos_ - start), &dim)) {
        return Error("expected a non-negative integer dimension");
      }
      Consume('L');  // Python 2 long literal.
      shape->push_back(dim);
      SkipSpace();
      if (Consume(',')) continue;
      if (Consume(')')) break;
      return Error("expected ',' or ')' in the shape");
    }
    if (shape->size() != 1 && shape->size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the .npy array has shape ", ShapeText(*shape), " (", shape->size(),
          " dimensions); dgmm reads 1-D arrays (a diagonal) and 2-D arrays (a matrix)"));
    }
    int64_t elements = 1;
    for (int64_t dim : *shape) {
      if (dim != 0 && elements > kMaxElements / dim) {
        return absl::InvalidArgumentError(
            absl::StrCat("the .npy shape ", ShapeText(*shape), " is too large"));
      }
      elements *= dim;
    }
    return absl::OkStatus();
  }

  absl::string_view text_;
  size_t pos_ = 0;
};

uint32_t LittleEndian(absl::string_view bytes) {
  uint32_t value = 0;
  for (size_t i = bytes.size(); i-- > 0;) {
    value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  }
  return value;
}

// Where the header length field starts and how long it is, by major version.
struct Preamble {
  size_t length_field_bytes = 0;
  size_t header_start = 0;
};

absl::StatusOr<Preamble> ParsePreamble(absl::string_view prefix) {
  if (prefix.size() < kMagic.size() + 2 || !absl::StartsWith(prefix, kMagic)) {
    return absl::InvalidArgumentError(
        "not a .npy file: it does not start with the magic string \\x93NUMPY");
  }
  const int major = static_cast<unsigned char>(prefix[6]);
  const int minor = static_cast<unsigned char>(prefix[7]);
  if (major < 1 || major > 3 || minor != 0) {
    return absl::InvalidArgumentError(absl::StrCat("unsupported .npy format version ", major, ".",
                                                   minor, "; dgmm reads 1.0, 2.0 and 3.0"));
  }
  Preamble preamble;
  preamble.length_field_bytes = major == 1 ? 2 : 4;
  preamble.header_start = 8 + preamble.length_field_bytes;
  return preamble;
}

absl::Status FileError(const std::string& path, absl::string_view action, int error) {
  std::string message = absl::StrCat("cannot ", action, " '", path, "': ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(message);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    default:
      return absl::UnknownError(message);
  }
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

}  // namespace

int64_t NpyHeader::num_elements() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

size_t NpyHeader::data_bytes() const {
  return static_cast<size_t>(num_elements()) * ElementBytes(dtype);
}

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view prefix, size_t* data_offset) {
  absl::StatusOr<Preamble> preamble = ParsePreamble(prefix);
  if (!preamble.ok()) return preamble.status();
  if (prefix.size() < preamble->header_start) return Malformed("the file ends in the preamble");
  const size_t header_bytes = LittleEndian(prefix.substr(8, preamble->length_field_bytes));
  if (header_bytes > kMaxHeaderBytes) {
    return Malformed(absl::StrCat("a header length of ", header_bytes, " bytes is implausible"));
  }
  if (prefix.size() - preamble->header_start < header_bytes) {
    return Malformed(absl::StrCat("the header says it is ", header_bytes,
                                  " bytes long but the file ends after ",
                                  prefix.size() - preamble->header_start));
  }
  absl::StatusOr<NpyHeader> header =
      HeaderDictParser(prefix.substr(preamble->header_start, header_bytes)).Parse();
  if (!header.ok()) return header.status();
  *data_offset = preamble->header_start + header_bytes;
  return header;
}

std::string EncodeNpyHeader(const NpyHeader& header, int version) {
  const std::string dict =
      absl::StrCat("{'descr': '", Find(header.dtype) != nullptr ? Find(header.dtype)->descr : "?",
                   "', 'fortran_order': ", header.fortran_order ? "True" : "False",
                   ", 'shape': ", ShapeText(header.shape), ", }");
  const size_t unpadded_v1 = kMagic.size() + 2 + 2 + dict.size() + 1;
  if (version != 2 && unpadded_v1 + 63 > 0xffff) version = 2;
  const size_t preamble_bytes = kMagic.size() + 2 + (version == 2 ? 4 : 2);
  const size_t unpadded = preamble_bytes + dict.size() + 1;
  const size_t padding = (64 - unpadded % 64) % 64;
  const size_t header_bytes = dict.size() + padding + 1;

  std::string out(kMagic);
  out.push_back(static_cast<char>(version == 2 ? 2 : 1));
  out.push_back(0);
  const int length_bytes = version == 2 ? 4 : 2;
  for (int i = 0; i < length_bytes; ++i) {
    out.push_back(static_cast<char>((header_bytes >> (8 * i)) & 0xff));
  }
  out += dict;
  out.append(padding, ' ');
  out.push_back('\n');
  return out;
}

NpyArray::NpyArray(NpyHeader header)
    : header_(std::move(header)),
      storage_(MakeHostMemory(header_.data_bytes() + 8)) {}

NpyArray::NpyArray(NpyHeader header, void* external)
    : header_(std::move(header)), external_(external) {}

absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path, size_t* data_offset) {
  File file(std::fopen(path.c_str(), "rb"));
  if (file == nullptr) return FileError(path, "open", errno);
  auto with_path = [&path](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(path, ": ", s.message()));
  };

  // The preamble, then the header whose length it gives.
  std::string prefix(12, '\0');
  prefix.resize(std::fread(prefix.data(), 1, prefix.size(), file.get()));
  absl::StatusOr<Preamble> preamble = ParsePreamble(prefix);
  if (!preamble.ok()) return with_path(preamble.status());
  if (prefix.size() < preamble->header_start) {
    return with_path(Malformed("the file ends in the preamble"));
  }
  const size_t header_bytes =
      LittleEndian(absl::string_view(prefix).substr(8, preamble->length_field_bytes));
  if (header_bytes > kMaxHeaderBytes) {
    return with_path(
        Malformed(absl::StrCat("a header length of ", header_bytes, " bytes is implausible")));
  }
  const size_t have = prefix.size();
  prefix.resize(preamble->header_start + header_bytes);
  if (prefix.size() > have) {
    prefix.resize(have + std::fread(prefix.data() + have, 1, prefix.size() - have, file.get()));
  }
  absl::StatusOr<NpyHeader> header = ParseNpyHeader(prefix, data_offset);
  if (!header.ok()) return with_path(header.status());

  struct stat st;
  if (fstat(fileno(file.get()), &st) != 0) return FileError(path, "stat", errno);
  const size_t file_data_bytes = static_cast<size_t>(st.st_size) > *data_offset
                                     ? static_cast<size_t>(st.st_size) - *data_offset
                                     : 0;
  if (file_data_bytes != header->data_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": the header describes ", NameOf(header->dtype), " data of shape ",
                     ShapeText(header->shape), " (", header->data_bytes(),
                     " bytes) but the file holds ", file_data_bytes, " bytes of data"));
  }
  return header;
}

absl::Status ReadNpyData(const std::string& path, const NpyHeader& header, size_t data_offset,
                         void* into) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return FileError(path, "open", errno);
  // Large arrays are read by several threads at once, each a slice: reading
  // from the page cache and the first touch of the destination's pages
  // (often a new shared-memory region) both go further with more threads.
  constexpr size_t kSliceBytes = size_t{16} << 20;
  const size_t bytes = header.data_bytes();
  const size_t threads = std::clamp<size_t>(
      bytes / kSliceBytes, 1, std::min(8u, std::max(1u, std::thread::hardware_concurrency())));
  const size_t slice = (bytes / threads + 4095) / 4096 * 4096;
  std::atomic<int> error{0};
  const auto read_slice = [&](size_t at) {
    const size_t end = std::min(bytes, at + slice);
    char* dst = static_cast<char*>(into);
    while (at < end && error.load() == 0) {
      const ssize_t got = pread(fd, dst + at, end - at, static_cast<off_t>(data_offset + at));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        int expected = 0;
        error.compare_exchange_strong(expected, got < 0 ? errno : EIO);
        return;
      }
      at += static_cast<size_t>(got);
    }
  };
  std::vector<std::thread> helpers;
  for (size_t t = 1; t < threads && t * slice < bytes; ++t)
    helpers.emplace_back(read_slice, t * slice);
  read_slice(0);
  for (std::thread& t : helpers) t.join();
  close(fd);
  if (error.load() != 0) return FileError(path, "read", error.load());
  return absl::OkStatus();
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  size_t data_offset = 0;
  absl::StatusOr<NpyHeader> header = ReadNpyHeader(path, &data_offset);
  if (!header.ok()) return header.status();
  NpyArray array(*std::move(header));
  if (absl::Status read = ReadNpyData(path, array.header(), data_offset, array.data());
      !read.ok()) {
    return read;
  }
  return array;
}

absl::Status WriteNpy(const std::string& path, const NpyHeader& header, const void* data,
                      size_t data_bytes, int version) {
  if (header.shape.empty() || header.shape.size() > 2 || data_bytes != header.data_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot write ", path, ": shape ", ShapeText(header.shape), " needs ",
                     header.data_bytes(), " bytes, got ", data_bytes));
  }
  File file(std::fopen(path.c_str(), "wb"));
  if (file == nullptr) return FileError(path, "create", errno);
  const std::string encoded = EncodeNpyHeader(header, version);
  if (std::fwrite(encoded.data(), 1, encoded.size(), file.get()) != encoded.size() ||
      std::fwrite(data, 1, data_bytes, file.get()) != data_bytes) {
    return FileError(path, "write", errno);
  }
  if (std::fclose(file.release()) != 0) return FileError(path, "write", errno);
  return absl::OkStatus();
}

}  // namespace dgmm
