#include "dgmm/host_memory.h"

#include <sys/mman.h>

#include <cstdint>

namespace dgmm {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr std::align_val_t kSmallAlign{64};

size_t RoundUp(size_t n, size_t to) { return (n + to - 1) / to * to; }

}  // namespace

void* AllocateHostMemory(size_t bytes) {
  if (bytes < kHugePageAllocationBytes) {
    return ::operator new(bytes == 0 ? 1 : bytes, kSmallAlign, std::nothrow);
  }
  if (bytes > SIZE_MAX - 2 * kHugePage) return nullptr;
  const size_t length = RoundUp(bytes, kHugePage);
  // Map one huge page more than needed and cut the mapping down to a run
  // that starts on a 2 MiB boundary: only an aligned 2 MiB range can be a
  // huge page.
  void* mapped =
      mmap(nullptr, length + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (mapped == MAP_FAILED) return nullptr;
  const uintptr_t start = reinterpret_cast<uintptr_t>(mapped);
  const uintptr_t aligned = RoundUp(start, kHugePage);
  if (aligned > start) munmap(mapped, aligned - start);
  const uintptr_t tail = aligned + length;
  const uintptr_t end = start + length + kHugePage;
  if (end > tail) munmap(reinterpret_cast<void*>(tail), end - tail);
  void* p = reinterpret_cast<void*>(aligned);
  // Before the first touch, so that the faults take 2 MiB at a time. Where
  // the host refuses (THP "never"), the pages stay 4 KiB.
  madvise(p, length, MADV_HUGEPAGE);
  return p;
}

void FreeHostMemory(void* p, size_t bytes) {
  if (p == nullptr) return;
  if (bytes < kHugePageAllocationBytes) {
    ::operator delete(p, kSmallAlign);
    return;
  }
  munmap(p, RoundUp(bytes, kHugePage));
}

HostMemoryPtr MakeHostMemory(size_t bytes) {
  void* p = AllocateHostMemory(bytes);
  if (p == nullptr) throw std::bad_alloc();
  return HostMemoryPtr(p, HostMemoryDeleter{bytes});
}

}  // namespace dgmm
