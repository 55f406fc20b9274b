// .npy reader and writer: round trips, header layout, and clear rejection of
// what dgmm cannot use.
#include "dgmm/npy.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/files.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/dgmm-npy-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override {
    std::string out;
    std::system(("rm -rf '" + dir_ + "'").c_str());
  }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  void WriteRaw(const std::string& name, const std::string& bytes) const {
    std::ofstream f(Path(name), std::ios::binary);
    f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  std::string ReadRaw(const std::string& name) const {
    return testing::ReadFile(Path(name)).value_or("");
  }

  // A v1.0 file with header dictionary `dict` (padded by this function) and
  // `data_bytes` zero bytes of data.
  std::string FileWithDict(const std::string& dict, size_t data_bytes) const {
    std::string header = dict;
    while ((10 + header.size() + 1) % 64 != 0) header.push_back(' ');
    header.push_back('\n');
    std::string bytes("\x93NUMPY\x01\x00", 8);
    bytes.push_back(static_cast<char>(header.size() & 0xff));
    bytes.push_back(static_cast<char>(header.size() >> 8));
    return bytes + header + std::string(data_bytes, '\0');
  }

  absl::Status ReadStatus(const std::string& name) const { return ReadNpy(Path(name)).status(); }

  std::string dir_;
};

template <typename T>
std::vector<T> Iota(size_t n) {
  std::vector<T> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<T>(i) * T(0.5) - T(3);
  return v;
}

TEST_F(NpyTest, RoundTripsFloat32COrderMatrix) {
  const std::vector<float> data = Iota<float>(3 * 5);
  NpyHeader header{v1::DTYPE_FLOAT32, false, {3, 5}};
  ASSERT_TRUE(WriteNpy(Path("a.npy"), header, data.data(), data.size() * 4).ok());
  absl::StatusOr<NpyArray> read = ReadNpy(Path("a.npy"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->header().dtype, v1::DTYPE_FLOAT32);
  EXPECT_FALSE(read->header().fortran_order);
  EXPECT_EQ(read->header().shape, (std::vector<int64_t>{3, 5}));
  ASSERT_EQ(read->size_bytes(), data.size() * 4);
  EXPECT_EQ(std::memcmp(read->data(), data.data(), read->size_bytes()), 0);
}

TEST_F(NpyTest, RoundTripsFloat64FortranOrderMatrix) {
  const std::vector<double> data = Iota<double>(4 * 7);
  NpyHeader header{v1::DTYPE_FLOAT64, true, {4, 7}};
  ASSERT_TRUE(WriteNpy(Path("a.npy"), header, data.data(), data.size() * 8).ok());
  absl::StatusOr<NpyArray> read = ReadNpy(Path("a.npy"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->header().dtype, v1::DTYPE_FLOAT64);
  EXPECT_TRUE(read->header().fortran_order);
  EXPECT_EQ(read->header().shape, (std::vector<int64_t>{4, 7}));
  EXPECT_EQ(std::memcmp(read->data(), data.data(), read->size_bytes()), 0);
}

TEST_F(NpyTest, RoundTripsOneDimensionalDiagonal) {
  const std::vector<float> data = Iota<float>(9);
  NpyHeader header{v1::DTYPE_FLOAT32, false, {9}};
  ASSERT_TRUE(WriteNpy(Path("d.npy"), header, data.data(), data.size() * 4).ok());
  EXPECT_THAT(ReadRaw("d.npy"), HasSubstr("'shape': (9,)"));
  absl::StatusOr<NpyArray> read = ReadNpy(Path("d.npy"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->header().shape, (std::vector<int64_t>{9}));
  EXPECT_EQ(std::memcmp(read->data(), data.data(), read->size_bytes()), 0);
}

TEST_F(NpyTest, WritesNumpyStyleVersion1HeaderAlignedTo64Bytes) {
  const std::string header = EncodeNpyHeader({v1::DTYPE_FLOAT64, false, {2, 3}});
  EXPECT_EQ(header.size() % 64, 0u);
  EXPECT_EQ(header.substr(0, 8), std::string("\x93NUMPY\x01\x00", 8));
  EXPECT_EQ(header.back(), '\n');
  EXPECT_THAT(header, HasSubstr("{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }"));
  size_t offset = 0;
  absl::StatusOr<NpyHeader> parsed = ParseNpyHeader(header, &offset);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(offset, header.size());
}

// The descr NumPy writes for each new dtype, both ways.
TEST_F(NpyTest, ReadsAndWritesEveryDTypeWithNumpysDescr) {
  const std::pair<const char*, v1::DType> cases[] = {
      {"<f2", v1::DTYPE_FLOAT16},  {"<c8", v1::DTYPE_COMPLEX64}, {"<c16", v1::DTYPE_COMPLEX128},
      {"<V2", v1::DTYPE_BFLOAT16}, {"<f4", v1::DTYPE_FLOAT32},   {"<f8", v1::DTYPE_FLOAT64}};
  const size_t sizes[] = {2, 8, 16, 2, 4, 8};
  for (size_t k = 0; k < 6; ++k) {
    const auto& [descr, dtype] = cases[k];
    const std::string header = EncodeNpyHeader({dtype, true, {3, 2}});
    EXPECT_THAT(header, HasSubstr(absl::StrCat("{'descr': '", descr, "', 'fortran_order': True")));
    std::string bytes(6 * sizes[k], '\0');
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + k);
    const std::string name = absl::StrCat("t", k, ".npy");
    ASSERT_TRUE(WriteNpy(Path(name), {dtype, true, {3, 2}}, bytes.data(), bytes.size()).ok());
    absl::StatusOr<NpyArray> read = ReadNpy(Path(name));
    ASSERT_TRUE(read.ok()) << descr << ": " << read.status();
    EXPECT_EQ(read->header().dtype, dtype) << descr;
    EXPECT_TRUE(read->header().fortran_order);
    ASSERT_EQ(read->size_bytes(), bytes.size()) << descr;
    EXPECT_EQ(std::memcmp(read->data(), bytes.data(), bytes.size()), 0) << descr;
  }
  // '|V2' (how np.save writes a 2-byte void) is bfloat16 too.
  WriteRaw("v.npy", FileWithDict("{'descr': '|V2', 'fortran_order': False, 'shape': (3,), }", 6));
  absl::StatusOr<NpyArray> read = ReadNpy(Path("v.npy"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->header().dtype, v1::DTYPE_BFLOAT16);
  // Other voids and big-endian half or complex are refused, naming what is read.
  WriteRaw("v4.npy", FileWithDict("{'descr': '|V4', 'fortran_order': False, 'shape': (2,), }", 8));
  absl::Status s = ReadStatus("v4.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'|V4'; dgmm reads float16 ('<f2'), bfloat16"));
  WriteRaw("b.npy", FileWithDict("{'descr': '>c16', 'fortran_order': False, 'shape': (1,), }", 16));
  EXPECT_THAT(std::string(ReadStatus("b.npy").message()), HasSubstr("big-endian"));
}

TEST_F(NpyTest, WritesAndReadsVersion2Header) {
  const std::vector<double> data = Iota<double>(6);
  NpyHeader header{v1::DTYPE_FLOAT64, false, {2, 3}};
  ASSERT_TRUE(WriteNpy(Path("v2.npy"), header, data.data(), 48, /*version=*/2).ok());
  const std::string raw = ReadRaw("v2.npy");
  EXPECT_EQ(raw[6], '\x02');
  EXPECT_EQ((raw.size() - 48) % 64, 0u);
  absl::StatusOr<NpyArray> read = ReadNpy(Path("v2.npy"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->header().shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(std::memcmp(read->data(), data.data(), 48), 0);
}

TEST_F(NpyTest, ReadsHeadersWithOtherSpacingKeyOrderAndPython2Longs) {
  WriteRaw("a.npy", FileWithDict("{\"shape\":(2L,3L),'fortran_order':True,'descr':'<f4'}", 24));
  absl::StatusOr<NpyArray> read = ReadNpy(Path("a.npy"));
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(read->header().fortran_order);
  EXPECT_EQ(read->header().shape, (std::vector<int64_t>{2, 3}));
}

TEST_F(NpyTest, RejectsFileWithoutMagic) {
  WriteRaw("a.npy", "PK\x03\x04 this is a zip file, not an npy file");
  absl::Status s = ReadStatus("a.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("not a .npy file"));
}

TEST_F(NpyTest, RejectsUnsupportedFormatVersion) {
  std::string bytes = FileWithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 4);
  bytes[6] = '\x04';
  WriteRaw("a.npy", bytes);
  absl::Status s = ReadStatus("a.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("version 4.0"));
}

TEST_F(NpyTest, RejectsBigEndianDataWithConversionAdvice) {
  WriteRaw("a.npy", FileWithDict("{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }", 16));
  absl::Status s = ReadStatus("a.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("big-endian"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("astype"));
}

TEST_F(NpyTest, RejectsIntegerAndStructuredDtypes) {
  WriteRaw("i.npy", FileWithDict("{'descr': '<i4', 'fortran_order': False, 'shape': (2,), }", 8));
  absl::Status s = ReadStatus("i.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'<i4'"));
  WriteRaw("s.npy",
           FileWithDict("{'descr': [('x', '<f4')], 'fortran_order': False, 'shape': (2,), }", 8));
  EXPECT_THAT(std::string(ReadStatus("s.npy").message()), HasSubstr("structured"));
}

TEST_F(NpyTest, RejectsThreeDimensionalAndScalarArrays) {
  WriteRaw("a.npy",
           FileWithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 2, 2), }", 32));
  absl::Status s = ReadStatus("a.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("3 dimensions"));
  WriteRaw("b.npy", FileWithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (), }", 4));
  EXPECT_EQ(ReadStatus("b.npy").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(NpyTest, RejectsMalformedDictionaries) {
  const char* bad[] = {
      "{'descr': '<f4', 'fortran_order': False}",                                 // no shape
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}",          // unknown key
      "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}",  // repeated
      "{'descr': '<f4', 'fortran_order': maybe, 'shape': (2,)}",                  // bad bool
      "{'descr': '<f4', 'fortran_order': False, 'shape': (-2,)}",                 // negative dim
      "{'descr': '<f4', 'fortran_order': False, 'shape': (2,) junk",              // unterminated
      "['descr', '<f4']",                                                         // not a dict
  };
  for (const char* dict : bad) {
    WriteRaw("a.npy", FileWithDict(dict, 8));
    absl::Status s = ReadStatus("a.npy");
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << dict;
    EXPECT_THAT(std::string(s.message()), HasSubstr("a.npy")) << dict;
  }
}

TEST_F(NpyTest, RejectsHeaderLongerThanTheFile) {
  std::string bytes = FileWithDict("{'descr': '<f4', 'fortran_order': False, 'shape': (1,), }", 0);
  WriteRaw("a.npy", bytes.substr(0, 30));
  absl::Status s = ReadStatus("a.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("file ends"));
}

TEST_F(NpyTest, RejectsDataShorterOrLongerThanTheShape) {
  const std::string dict = "{'descr': '<f8', 'fortran_order': False, 'shape': (2, 3), }";
  WriteRaw("short.npy", FileWithDict(dict, 47));
  absl::Status s = ReadStatus("short.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("48 bytes"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("holds 47 bytes"));
  WriteRaw("long.npy", FileWithDict(dict, 49));
  EXPECT_EQ(ReadStatus("long.npy").code(), absl::StatusCode::kInvalidArgument);
}

// 40 MiB of data: read in slices by several threads (16 MiB or more each).
// Every byte lands where it belongs, and the data of a file shortened after
// its header was read is an error, not a short array.
TEST_F(NpyTest, LargeArraysAreReadInSlicesByteForByte) {
  const int64_t rows = 2560, cols = 2048;  // 2560 x 2048 float64 = 40 MiB
  std::vector<double> data(static_cast<size_t>(rows * cols));
  uint64_t x = 88172645463325252ull;
  for (double& v : data) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v = static_cast<double>(x % 1000003) - 500001.5;
  }
  NpyHeader header{v1::DTYPE_FLOAT64, false, {rows, cols}};
  ASSERT_TRUE(WriteNpy(Path("big.npy"), header, data.data(), data.size() * 8).ok());
  size_t offset = 0;
  absl::StatusOr<NpyHeader> read_header = ReadNpyHeader(Path("big.npy"), &offset);
  ASSERT_TRUE(read_header.ok()) << read_header.status();
  std::vector<double> into(data.size(), std::nan(""));
  ASSERT_TRUE(ReadNpyData(Path("big.npy"), *read_header, offset, into.data()).ok());
  EXPECT_EQ(std::memcmp(into.data(), data.data(), data.size() * 8), 0);
  ASSERT_EQ(truncate(Path("big.npy").c_str(), static_cast<off_t>(offset + data.size() * 8 / 2)),
            0);
  absl::Status s = ReadNpyData(Path("big.npy"), *read_header, offset, into.data());
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("big.npy"));
}

TEST_F(NpyTest, MissingFileIsNotFound) {
  absl::Status s = ReadStatus("nope.npy");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("nope.npy"));
}

TEST_F(NpyTest, WriteRejectsDataOfTheWrongSize) {
  const std::vector<float> data(5);
  EXPECT_EQ(WriteNpy(Path("a.npy"), {v1::DTYPE_FLOAT32, false, {2, 3}}, data.data(), 20).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dgmm
