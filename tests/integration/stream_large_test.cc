// A large streamed job through the real server: N = 20000 float32 (1.6 GB
// each way), generated and checked row by row so that the test holds one
// block at a time, while the server must stay within a memory bound that
// does not grow with N.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

constexpr int64_t kN = 20000;
constexpr int64_t kBlockBytes = int64_t{4} << 20;
// docs/architecture.md: a streamed job's server memory is a window of blocks
// plus gRPC's buffers, whatever N; 512 MiB is the bound set for N = 40000.
constexpr long kServerPeakRssLimit = 512L << 20;

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Element (i, j) of A: a multiple of 2^-20 in [-4, 4), exact in float32.
float AValue(int64_t i, int64_t j) {
  const uint64_t h =
      Mix(static_cast<uint64_t>(i) * static_cast<uint64_t>(kN) + static_cast<uint64_t>(j));
  return static_cast<float>(static_cast<int64_t>(h >> 41) - (int64_t{1} << 22)) /
         static_cast<float>(int64_t{1} << 20);
}

float DValue(int64_t j) {
  return 0.5f + static_cast<float>(Mix(~static_cast<uint64_t>(j)) >> 40) /
                    static_cast<float>(int64_t{1} << 24);
}

TEST(StreamLargeTest, StreamedN20000Float32MatchesFloat64ReferenceInBoundedServerMemory) {
  ServerProcess server({"--backend=cpu", "--max_block_bytes=4MiB"});
  std::unique_ptr<v1::Dgmm::Stub> stub = Connect(server.address());

  std::vector<float> d(kN);
  for (int64_t j = 0; j < kN; ++j) d[static_cast<size_t>(j)] = DValue(j);
  const int64_t row_bytes = kN * static_cast<int64_t>(sizeof(float));
  const int64_t lines_per_block = kBlockBytes / row_bytes;

  grpc::ClientContext context;
  auto stream = stub->MultiplyStream(&context);
  std::atomic<bool> writes_ok{true};
  std::thread writer([&] {
    v1::MultiplyStreamRequest header;
    v1::JobHeader* h = header.mutable_header();
    h->set_rows(kN);
    h->set_cols(kN);
    h->set_dtype(v1::DTYPE_FLOAT32);
    h->set_layout(v1::LAYOUT_ROW_MAJOR);
    h->set_side(v1::SIDE_RIGHT);
    h->set_diagonal(d.data(), d.size() * sizeof(float));
    if (!stream->Write(header)) {
      writes_ok = false;
      return;
    }
    std::vector<float> rows(static_cast<size_t>(lines_per_block * kN));
    for (int64_t first = 0; first < kN; first += lines_per_block) {
      const int64_t lines = std::min(lines_per_block, kN - first);
      for (int64_t i = 0; i < lines; ++i) {
        for (int64_t j = 0; j < kN; ++j)
          rows[static_cast<size_t>(i * kN + j)] = AValue(first + i, j);
      }
      v1::MultiplyStreamRequest block;
      block.mutable_block()->set_first_line(first);
      block.mutable_block()->set_data(rows.data(), static_cast<size_t>(lines * row_bytes));
      if (!stream->Write(block)) {
        writes_ok = false;
        return;
      }
    }
    stream->WritesDone();
  });

  v1::MultiplyStreamResponse response;
  bool accepted = false;
  int64_t next_line = 0;
  int64_t wrong = 0;
  v1::JobStats stats;
  std::vector<float> result;
  while (stream->Read(&response)) {
    if (response.has_accepted()) {
      accepted = true;
    } else if (response.has_block()) {
      const std::string& data = response.block().data();
      ASSERT_EQ(response.block().first_line(), next_line);
      ASSERT_EQ(data.size() % static_cast<size_t>(row_bytes), 0u);
      result.resize(data.size() / sizeof(float));
      std::memcpy(result.data(), data.data(), data.size());
      const int64_t lines = static_cast<int64_t>(data.size()) / row_bytes;
      for (int64_t i = 0; i < lines; ++i) {
        for (int64_t j = 0; j < kN; ++j) {
          // Both factors are floats: their float64 product is exact, so the
          // correctly rounded float32 product must match it bit for bit.
          const float want = static_cast<float>(static_cast<double>(AValue(next_line + i, j)) *
                                                static_cast<double>(d[static_cast<size_t>(j)]));
          if (result[static_cast<size_t>(i * kN + j)] != want) ++wrong;
        }
      }
      next_line += lines;
    } else if (response.has_stats()) {
      stats = response.stats();
    }
  }
  writer.join();
  const grpc::Status status = stream->Finish();
  ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
  EXPECT_TRUE(writes_ok);
  EXPECT_TRUE(accepted);
  EXPECT_EQ(next_line, kN);
  EXPECT_EQ(wrong, 0);
  EXPECT_EQ(stats.bytes_in(), kN * row_bytes);
  EXPECT_EQ(stats.bytes_out(), kN * row_bytes);
  EXPECT_EQ(stats.backend(), v1::BACKEND_CPU);

  const long peak = server.PeakRssBytes();
  RecordProperty("server_peak_rss_mib", static_cast<int>(peak >> 20));
  EXPECT_GT(peak, 0);
  EXPECT_LE(peak, kServerPeakRssLimit) << "server peak RSS " << (peak >> 20) << " MiB";
}

}  // namespace
}  // namespace dgmm::testing
