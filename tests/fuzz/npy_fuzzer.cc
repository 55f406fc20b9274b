// Fuzzes the .npy reader: the in-memory header parser, and ReadNpy on the
// same bytes written to a memfd. A parsed header must describe a sane array,
// survive an encode/parse round trip, and ReadNpy must agree with the parser
// on whether the bytes are a readable array.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "dgmm/npy.h"
#include "tests/fuzz/fuzz_check.h"

namespace {

bool SameHeader(const dgmm::NpyHeader& a, const dgmm::NpyHeader& b) {
  return a.dtype == b.dtype && a.fortran_order == b.fortran_order && a.shape == b.shape;
}

// The bytes as a file: a memfd, named through /proc so ReadNpy opens it.
struct MemFile {
  int fd = -1;
  explicit MemFile(const uint8_t* data, size_t size) {
    fd = memfd_create("npy_fuzz", 0);
    FUZZ_CHECK(fd >= 0);
    size_t done = 0;
    while (done < size) {
      const ssize_t n = write(fd, data + done, size - done);
      FUZZ_CHECK(n > 0);
      done += static_cast<size_t>(n);
    }
  }
  ~MemFile() { close(fd); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd); }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view bytes(reinterpret_cast<const char*>(data), size);
  size_t data_offset = 0;
  const absl::StatusOr<dgmm::NpyHeader> header = dgmm::ParseNpyHeader(bytes, &data_offset);
  bool readable = false;
  if (header.ok()) {
    FUZZ_CHECK(header->shape.size() == 1 || header->shape.size() == 2);
    for (int64_t dim : header->shape) FUZZ_CHECK(dim >= 0);
    FUZZ_CHECK(
        header->dtype == dgmm::v1::DTYPE_FLOAT32 || header->dtype == dgmm::v1::DTYPE_FLOAT64 ||
        header->dtype == dgmm::v1::DTYPE_FLOAT16 || header->dtype == dgmm::v1::DTYPE_BFLOAT16 ||
        header->dtype == dgmm::v1::DTYPE_COMPLEX64 || header->dtype == dgmm::v1::DTYPE_COMPLEX128);
    FUZZ_CHECK(data_offset <= size);
    readable = size - data_offset == header->data_bytes();
    for (int version : {1, 2}) {
      const std::string encoded = dgmm::EncodeNpyHeader(*header, version);
      FUZZ_CHECK(encoded.size() % 64 == 0);
      size_t offset = 0;
      const absl::StatusOr<dgmm::NpyHeader> again = dgmm::ParseNpyHeader(encoded, &offset);
      FUZZ_CHECK(again.ok());
      FUZZ_CHECK(offset == encoded.size());
      FUZZ_CHECK(SameHeader(*header, *again));
    }
  } else {
    FUZZ_CHECK(header.status().code() == absl::StatusCode::kInvalidArgument);
  }

  MemFile file(data, size);
  const absl::StatusOr<dgmm::NpyArray> array = dgmm::ReadNpy(file.path());
  FUZZ_CHECK(array.ok() == readable);
  if (array.ok()) {
    FUZZ_CHECK(SameHeader(array->header(), *header));
    FUZZ_CHECK(array->size_bytes() == size - data_offset);
    FUZZ_CHECK(array->size_bytes() == 0 ||
               std::memcmp(array->data(), data + data_offset, array->size_bytes()) == 0);
  } else {
    FUZZ_CHECK(array.status().code() == absl::StatusCode::kInvalidArgument);
  }
  return 0;
}
