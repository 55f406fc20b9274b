// dgmm::HostVector / AllocateHostMemory (dgmm/host_memory.h): large
// allocations are 2 MiB aligned, whole and madvised for huge pages (the
// mapping's VmFlags in /proc/self/smaps carry "hg"), small ones come from
// operator new, 64-byte aligned; the memory holds what is written.
#include "dgmm/host_memory.h"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>

#include "gtest/gtest.h"

namespace dgmm {
namespace {

// The VmFlags line of the mapping of /proc/self/smaps that contains `p`.
std::string VmFlagsOf(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::ifstream smaps("/proc/self/smaps");
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t lo = 0, hi = 0;
    char dash = 0;
    std::istringstream head(line);
    if (head >> std::hex >> lo >> dash >> hi && dash == '-') {
      inside = lo <= at && at < hi;
      continue;
    }
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

TEST(HostMemoryTest, LargeAllocationsAreAlignedWholeAndAdvisedForHugePages) {
  for (size_t bytes :
       {kHugePageAllocationBytes, kHugePageAllocationBytes + 12345, size_t{37} << 20}) {
    SCOPED_TRACE(bytes);
    auto* p = static_cast<unsigned char*>(AllocateHostMemory(bytes));
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % (size_t{2} << 20), 0u);
    for (size_t i = 0; i < bytes; i += 4096) p[i] = static_cast<unsigned char>(i >> 12);
    p[bytes - 1] = 0xA5;
    for (size_t i = 0; i < bytes; i += 4096) {
      ASSERT_EQ(p[i], static_cast<unsigned char>(i >> 12)) << i;
    }
    EXPECT_EQ(p[bytes - 1], 0xA5);
    EXPECT_NE(VmFlagsOf(p).find(" hg"), std::string::npos) << VmFlagsOf(p);
    EXPECT_NE(VmFlagsOf(p + bytes - 1).find(" hg"), std::string::npos);
    FreeHostMemory(p, bytes);
  }
}

TEST(HostMemoryTest, SmallAllocationsAndVectors) {
  void* small = AllocateHostMemory(1000);
  ASSERT_NE(small, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(small) % 64, 0u);
  FreeHostMemory(small, 1000);
  FreeHostMemory(nullptr, 1000);

  HostVector<double> v(3'000'000);  // 24 MB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % (size_t{2} << 20), 0u);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) * 0.5;
  HostVector<double> copy = v;
  EXPECT_EQ(copy, v);
  EXPECT_NE(copy.data(), v.data());
  v.resize(10);  // shrinking keeps the allocation; the elements stay
  EXPECT_EQ(v[9], 4.5);
  v.shrink_to_fit();
  EXPECT_EQ(v[9], 4.5);
  HostVector<float> tiny(3, 1.5f);
  EXPECT_EQ(tiny[2], 1.5f);
}

}  // namespace
}  // namespace dgmm
