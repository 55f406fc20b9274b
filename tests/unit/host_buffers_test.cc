// The block buffer pool: sizes, reuse, the cache cap, and buffers handed to
// gRPC as slices coming back when gRPC lets go.
#include "service/core/host_buffers.h"

#include <cstring>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "service/rpc/wire_buffers.h"

namespace dgmm {
namespace {

// A pool over new[]/delete[] that records what it allocates and frees.
struct Recorder {
  std::vector<int64_t> allocated;
  std::vector<int64_t> freed;
  bool fail = false;
  int fail_next = 0;  // fail this many allocations, then succeed
};

std::shared_ptr<HostBufferPool> RecordingPool(Recorder* rec, int64_t cache) {
  return HostBufferPool::Create(
      "test",
      [rec](int64_t bytes) -> absl::StatusOr<std::byte*> {
        if (rec->fail) return absl::ResourceExhaustedError("no memory today");
        if (rec->fail_next > 0) {
          --rec->fail_next;
          return absl::ResourceExhaustedError("no memory just now");
        }
        rec->allocated.push_back(bytes);
        return new std::byte[static_cast<size_t>(bytes)];
      },
      [rec](std::byte* data, int64_t bytes) {
        rec->freed.push_back(bytes);
        delete[] data;
      },
      cache);
}

TEST(HostBuffers, SizesAreClassesFromOnePageAndBuffersAreReused) {
  Recorder rec;
  auto pool = RecordingPool(&rec, int64_t{1} << 20);
  {
    auto a = pool->Take(1);
    auto b = pool->Take(5000);
    auto c = pool->Take(65536);
    ASSERT_TRUE(a.ok() && b.ok() && c.ok());
    EXPECT_EQ(a->capacity(), 4096);
    EXPECT_EQ(b->capacity(), 8192);
    EXPECT_EQ(c->capacity(), 65536);

    std::memset(b->data(), 0x5a, 5000);  // the memory is really there
    EXPECT_EQ(pool->lent_bytes(), 4096 + 8192 + 65536);
  }
  EXPECT_EQ(pool->lent_bytes(), 0);
  EXPECT_EQ(pool->cached_bytes(), 4096 + 8192 + 65536);
  EXPECT_EQ(pool->allocations(), 3);
  // Same sizes again: nothing new is allocated.
  std::set<std::byte*> seen;
  for (int i = 0; i < 3; ++i) {
    auto b = pool->Take(6000);
    ASSERT_TRUE(b.ok());
    seen.insert(b->data());
  }
  EXPECT_EQ(seen.size(), 1u);
  EXPECT_EQ(pool->allocations(), 3);
  EXPECT_TRUE(rec.freed.empty());
}

TEST(HostBuffers, LargerSizesComeInEighthsOfAPowerOfTwo) {
  Recorder rec;
  auto pool = RecordingPool(&rec, 0);
  const std::vector<std::pair<int64_t, int64_t>> want_got = {
      {40000, 40960},          {4192000, 4194304},  {4194304, 4194304},
      {4194305, 4718592},      {3 << 20, 3 << 20},  {40000000, 41943040}};
  for (const auto& [want, got] : want_got) {
    auto b = pool->Take(want);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->capacity(), got) << want;
  }
  for (int64_t want = 1; want < (int64_t{1} << 30); want = want * 3 + 7) {
    auto b = pool->Take(want);
    ASSERT_TRUE(b.ok());
    EXPECT_GE(b->capacity(), want);
    EXPECT_LE(b->capacity(), std::max<int64_t>(4096, want + want / 8 + 4096)) << want;
    EXPECT_EQ(b->capacity() % 4096, 0) << want;
  }
}

TEST(HostBuffers, ReturnsBeyondTheCacheCapAreFreed) {
  Recorder rec;
  auto pool = RecordingPool(&rec, 16384);
  {
    std::vector<HostBuffer> held;
    for (int i = 0; i < 4; ++i) held.push_back(*pool->Take(8192));
  }
  EXPECT_EQ(pool->cached_bytes(), 16384);
  EXPECT_EQ(rec.freed, (std::vector<int64_t>{8192, 8192}));
  pool.reset();  // the cached two go with the pool
  EXPECT_EQ(rec.freed.size(), 4u);
}

TEST(HostBuffers, TheLeastRecentlyReturnedGoFirstWhateverTheirSize) {
  Recorder rec;
  auto pool = RecordingPool(&rec, 16384);
  {
    HostBuffer small = *pool->Take(8192);
    HostBuffer big = *pool->Take(16384);
    small = HostBuffer();  // returned first
    big = HostBuffer();    // returned second: the small one is given back
  }
  EXPECT_EQ(rec.freed, (std::vector<int64_t>{8192}));
  EXPECT_EQ(pool->cached_bytes(), 16384);
  ASSERT_TRUE(pool->Take(16000).ok());  // the cached 16 KiB buffer
  EXPECT_EQ(pool->allocations(), 2);
  // A buffer larger than the whole cache is never kept.
  { HostBuffer huge = *pool->Take(65536); }
  EXPECT_EQ(rec.freed.back(), 65536);
}

TEST(HostBuffers, AFailedAllocationGivesTheCacheBackAndTriesAgain) {
  Recorder rec;
  auto pool = RecordingPool(&rec, int64_t{1} << 20);
  { HostBuffer a = *pool->Take(8192), b = *pool->Take(8192); }
  EXPECT_EQ(pool->cached_bytes(), 16384);
  rec.fail_next = 1;
  auto c = pool->Take(100000);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(pool->cached_bytes(), 0);
  EXPECT_EQ(rec.freed, (std::vector<int64_t>{8192, 8192}));
  EXPECT_EQ(pool->allocations(), 3);  // the failed attempt does not count
}

TEST(HostBuffers, ASliceOwnsItsBufferUntilTheLastReferenceGoes) {
  Recorder rec;
  auto pool = RecordingPool(&rec, int64_t{1} << 20);
  auto buffer = pool->Take(10000);
  ASSERT_TRUE(buffer.ok());
  std::memset(buffer->data(), 'z', 10000);
  std::byte* data = buffer->data();
  grpc::Slice slice = ToSlice(std::move(*buffer), 10000);
  EXPECT_EQ(buffer->data(), nullptr);
  EXPECT_EQ(slice.begin(), reinterpret_cast<const uint8_t*>(data));  // no copy
  EXPECT_EQ(slice.size(), 10000u);
  {
    grpc::Slice another = slice;  // gRPC takes references like this
    slice = grpc::Slice();
    EXPECT_EQ(pool->lent_bytes(), 12288);  // 10000 bytes: three pages
    EXPECT_EQ(another.begin()[9999], 'z');
  }
  EXPECT_EQ(pool->lent_bytes(), 0);
  EXPECT_EQ(pool->cached_bytes(), 12288);
}

TEST(HostBuffers, ABufferKeepsItsPoolAlive) {
  Recorder rec;
  auto pool = RecordingPool(&rec, int64_t{1} << 20);
  auto buffer = pool->Take(100);
  ASSERT_TRUE(buffer.ok());
  pool.reset();
  EXPECT_TRUE(rec.freed.empty());
  *buffer = HostBuffer();  // last owner: the pool goes, and frees it
  EXPECT_EQ(rec.freed, (std::vector<int64_t>{4096}));
}

TEST(HostBuffers, AllocationFailureIsResourceExhaustedAndLendsNothing) {
  Recorder rec;
  rec.fail = true;
  auto pool = RecordingPool(&rec, 0);
  auto buffer = pool->Take(1 << 20);
  EXPECT_EQ(buffer.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(buffer.status().message()).find("1048576 bytes of test memory"),
            std::string::npos)
      << buffer.status();
  EXPECT_EQ(pool->lent_bytes(), 0);
}

TEST(HostBuffers, MappedPoolGivesWritablePages) {
  auto pool = HostBufferPool::CreateMapped(0);
  auto buffer = pool->Take(3 << 20);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->capacity(), 3 << 20);
  std::memset(buffer->data(), 1, 3 << 20);
  EXPECT_EQ(buffer->data()[(3 << 20) - 1], std::byte{1});
}

}  // namespace
}  // namespace dgmm
