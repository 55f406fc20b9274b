// ProcessMemory's checks on this process's own memory (the server grants it
// to a process of its own uid, so a test can be both sides): the ranges a
// job will read and write, against the process's mappings, before anything
// moves.
#include "service/regions/process_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>

#include "gtest/gtest.h"

namespace dgmm {
namespace {

// Both sources of the mappings: the kernel's PROCMAP_QUERY where it has it
// (Linux 6.11 on), and the maps text.
class ProcessMemoryCheckMapped : public testing::TestWithParam<ProcessMemory::MapsSource> {};

INSTANTIATE_TEST_SUITE_P(Sources, ProcessMemoryCheckMapped,
                         testing::Values(ProcessMemory::MapsSource::kAuto,
                                         ProcessMemory::MapsSource::kText));

TEST_P(ProcessMemoryCheckMapped, NamesTheFirstByteThatCannotBeReachedAsAsked) {
  const ProcessMemory::MapsSource source = GetParam();
  std::random_device random;
  std::string cookie(32, '\0');
  for (char& c : cookie) c = static_cast<char>(random());
  auto m = ProcessMemory::Open(getpid(), geteuid(), reinterpret_cast<uint64_t>(cookie.data()),
                               cookie);
  ASSERT_TRUE(m.ok()) << m.status();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  auto* area = static_cast<char*>(
      mmap(nullptr, 4 * page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(area, MAP_FAILED);
  // [rw][rw][r-][--]
  ASSERT_EQ(mprotect(area + 2 * page, page, PROT_READ), 0);
  ASSERT_EQ(mprotect(area + 3 * page, page, PROT_NONE), 0);
  const auto at = [&](size_t offset) { return reinterpret_cast<uint64_t>(area + offset); };
  const auto bytes = [](size_t n) { return static_cast<int64_t>(n); };
  EXPECT_TRUE((*m)->CheckMapped(at(0), bytes(2 * page), 'w', source).ok());
  EXPECT_TRUE((*m)->CheckMapped(at(100), bytes(3 * page - 100), 'r', source).ok());
  absl::Status s = (*m)->CheckMapped(at(page), bytes(2 * page), 'w', source);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("cannot be written"), std::string::npos) << s;
  EXPECT_NE(s.message().find("without write access"), std::string::npos) << s;
  s = (*m)->CheckMapped(at(page), bytes(3 * page), 'r', source);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("cannot be read"), std::string::npos) << s;
  ASSERT_EQ(munmap(area + 3 * page, page), 0);
  s = (*m)->CheckMapped(at(2 * page), bytes(2 * page), 'r', source);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("nothing is mapped"), std::string::npos) << s;
  EXPECT_TRUE((*m)->CheckMapped(at(0), 0, 'w', source).ok());
  // Two ranges at once, over several mappings.
  EXPECT_TRUE((*m)->CheckMapped({{at(0), bytes(2 * page), 'w'}, {at(page), bytes(2 * page), 'r'}},
                                source)
                  .ok());
  s = (*m)->CheckMapped({{at(0), bytes(page), 'r'}, {at(page), bytes(2 * page), 'w'}}, source);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  munmap(area, 3 * page);
}

}  // namespace
}  // namespace dgmm
