// Reading and writing NumPy .npy files of dgmm's element types.
//
// Supports format versions 1.0, 2.0 (4-byte header length) and 3.0 (UTF-8
// header) on read; writes 1.0 unless asked for 2.0. Arrays are 1-D (a
// diagonal) or 2-D (a matrix), little-endian float16 ('<f2'), float32
// ('<f4'), float64 ('<f8'), complex64 ('<c8'), complex128 ('<c16') or
// bfloat16, which np.save writes for an ml_dtypes.bfloat16 array as a 2-byte
// void ('<V2' or '|V2'; read as bfloat16, written as '<V2': np.load gives a
// void array, .view(ml_dtypes.bfloat16) makes it bfloat16 again), in C
// (row-major) or Fortran (column-major) order. Anything else is rejected
// with INVALID_ARGUMENT naming what was found and what is accepted.
#ifndef DGMM_CLIENT_CPP_INCLUDE_DGMM_NPY_H_
#define DGMM_CLIENT_CPP_INCLUDE_DGMM_NPY_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dgmm/host_memory.h"
#include "dgmm/v1/dgmm.pb.h"

namespace dgmm {

struct NpyHeader {
  v1::DType dtype = v1::DTYPE_FLOAT64;
  // True for Fortran (column-major) order.
  bool fortran_order = false;
  // One or two dimensions, each >= 0.
  std::vector<int64_t> shape;

  // Product of the dimensions.
  int64_t num_elements() const;
  // num_elements() times the element size.
  size_t data_bytes() const;
};

// Parses the start of a .npy file: magic, version, header length and header
// dictionary. `prefix` must contain at least the whole header; on success
// *data_offset is where the array data starts. INVALID_ARGUMENT for anything
// malformed or unsupported; the message says what and why.
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view prefix, size_t* data_offset);

// The bytes of a .npy header for `header`, padded with spaces so that the
// data starts at a multiple of 64 bytes. `version` is 1 or 2; 1 is upgraded
// to 2 if the dictionary needs it.
std::string EncodeNpyHeader(const NpyHeader& header, int version = 1);

// An array read from a .npy file. The data is 8-byte aligned.
class NpyArray {
 public:
  // An array of `header`'s shape with uninitialized contents (a large one
  // on transparent huge pages: dgmm/host_memory.h).
  explicit NpyArray(NpyHeader header);
  // An array of `header`'s shape in the caller's memory `external` (at
  // least header.data_bytes(); it must outlive the array).
  NpyArray(NpyHeader header, void* external);

  const NpyHeader& header() const { return header_; }
  void* data() { return external_ != nullptr ? external_ : storage_.get(); }
  const void* data() const { return external_ != nullptr ? external_ : storage_.get(); }
  size_t size_bytes() const { return header_.data_bytes(); }

 private:
  NpyHeader header_;
  HostMemoryPtr storage_;  // large arrays on huge pages (dgmm/host_memory.h)
  void* external_ = nullptr;
};

// The header of the .npy file at `path` (checked against the file's size, as
// ReadNpy does) and where its data starts.
absl::StatusOr<NpyHeader> ReadNpyHeader(const std::string& path, size_t* data_offset);

// Reads the data of the .npy file at `path` (its header is `header`, its data
// at `data_offset`: ReadNpyHeader) into `into`, header.data_bytes() bytes.
absl::Status ReadNpyData(const std::string& path, const NpyHeader& header, size_t data_offset,
                         void* into);

// Reads the .npy file at `path`. The data is read straight from the file
// into the returned array (no staging copy). NOT_FOUND / PERMISSION_DENIED
// style errors for an unreadable file, INVALID_ARGUMENT for a malformed or
// unsupported one (including a file shorter or longer than its header says).
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

// Writes `data_bytes` bytes at `data` as a .npy file with `header` (whose
// data_bytes() must equal data_bytes). `version` as in EncodeNpyHeader.
absl::Status WriteNpy(const std::string& path, const NpyHeader& header, const void* data,
                      size_t data_bytes, int version = 1);

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_INCLUDE_DGMM_NPY_H_
