// Host memory for the large arrays a client hands to dgmm on the server's
// host: dgmm::HostVector<T> is a std::vector whose large allocations lie on
// transparent huge pages, as NumPy puts its own large arrays.
//
// Why: on the same-host path (process memory, docs/protocol.md) the server
// reads A out of the caller's array and writes C into the caller's with
// process_vm_readv/writev, which pin the pages one by one; on 4 KiB pages
// that is half or more of a CPU server's job (bench/results/user_path/
// cpu2core_hugepages_c67898f.md: 6.3-8.0 ms on huge pages against 15.5 ms
// at N=4000). On 2 MiB pages there are 512 times fewer. Any buffer works;
// these are only faster. Where the host has transparent huge pages off
// (/sys/kernel/mm/transparent_hugepage/enabled "never") they are ordinary
// pages.
#ifndef DGMM_CLIENT_HOST_MEMORY_H_
#define DGMM_CLIENT_HOST_MEMORY_H_

#include <cstddef>
#include <memory>
#include <new>
#include <vector>

namespace dgmm {

// Allocations of at least this many bytes are mapped on their own, aligned
// to 2 MiB and madvised MADV_HUGEPAGE before their first touch; smaller ones
// come from operator new (64-byte aligned).
inline constexpr size_t kHugePageAllocationBytes = size_t{4} << 20;

// `bytes` of memory as above, or nullptr when none can be had. Free with
// FreeHostMemory and the same `bytes`.
void* AllocateHostMemory(size_t bytes);
void FreeHostMemory(void* p, size_t bytes);

// Owns memory from AllocateHostMemory.
struct HostMemoryDeleter {
  size_t bytes = 0;
  void operator()(void* p) const noexcept { FreeHostMemory(p, bytes); }
};
using HostMemoryPtr = std::unique_ptr<void, HostMemoryDeleter>;
// `bytes` of it; throws std::bad_alloc when none can be had.
HostMemoryPtr MakeHostMemory(size_t bytes);

// A standard allocator over AllocateHostMemory.
template <typename T>
struct HostAllocator {
  using value_type = T;
  HostAllocator() = default;
  template <typename U>
  HostAllocator(const HostAllocator<U>&) noexcept {}  // NOLINT: allocators convert
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T)) throw std::bad_array_new_length();
    void* p = AllocateHostMemory(n * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t n) noexcept { FreeHostMemory(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const HostAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using HostVector = std::vector<T, HostAllocator<T>>;

}  // namespace dgmm

#endif  // DGMM_CLIENT_HOST_MEMORY_H_
