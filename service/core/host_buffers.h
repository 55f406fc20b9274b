// Host memory for the payload of streamed blocks, reused from block to block
// and job to job. A block is received straight into one of these buffers
// (the one copy out of gRPC's receive slices), computed in place, and sent
// back from it as a grpc::Slice that returns the buffer to its pool when
// gRPC lets go of it (ToSlice in wire_buffers.h; this header is gRPC-free):
// no protobuf string, no serialization copy.
//
// A GPU's pool lends pinned memory (cudaHostAlloc), so blocks go to and from
// the device by DMA without a staging copy; the CPU's lends anonymous
// mappings, so memory given back to the system really leaves the process.
// Buffers come in size classes at most 1/8 larger than asked (whole pages).
// A pool keeps up to max_cached_bytes of returned buffers for reuse; past
// that it gives back the least recently returned ones, so the sizes in use
// stay cached. When an allocation fails, the cache is given back and the
// allocation tried once more.
#ifndef DGMM_SERVICE_CORE_HOST_BUFFERS_H_
#define DGMM_SERVICE_CORE_HOST_BUFFERS_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace dgmm {

class HostBufferPool;

// One buffer lent by a pool; gives it back when destroyed. Move-only.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  ~HostBuffer() { Reset(); }

  std::byte* data() const { return data_; }
  // Usable bytes (at least what was asked for).
  int64_t capacity() const { return capacity_; }

 private:
  friend class HostBufferPool;
  void Reset();

  std::shared_ptr<HostBufferPool> pool_;
  std::byte* data_ = nullptr;
  int64_t capacity_ = 0;
};

class HostBufferPool : public std::enable_shared_from_this<HostBufferPool> {
 public:
  using AllocateFn = std::function<absl::StatusOr<std::byte*>(int64_t bytes)>;
  using FreeFn = std::function<void(std::byte* data, int64_t bytes)>;

  // A pool of memory from `allocate`/`free` (called without the pool's lock
  // held). `kind` names the memory in errors ("pinned host", "host").
  static std::shared_ptr<HostBufferPool> Create(std::string kind, AllocateFn allocate,
                                                FreeFn free, int64_t max_cached_bytes);
  // Anonymous private mappings (mmap), for the CPU.
  static std::shared_ptr<HostBufferPool> CreateMapped(int64_t max_cached_bytes);

  ~HostBufferPool();
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // A buffer of at least `bytes` (≥ 1): a cached one if one is free, else a
  // new one. RESOURCE_EXHAUSTED when the allocation fails.
  absl::StatusOr<HostBuffer> Take(int64_t bytes);

  // Gives every buffer kept for reuse back to the system (buffers lent out
  // stay lent, and come back to the cache as usual); returns their bytes.
  // For a server that has been idle a while: its memory returns to what it
  // was at start, and the next job maps its blocks anew.
  int64_t ReleaseCached();

  // Bytes of buffers lent out now, and kept for reuse now.
  int64_t lent_bytes() const;
  int64_t cached_bytes() const;
  // Successful calls of `allocate` so far (a warm pool stops calling it).
  int64_t allocations() const;

 private:
  HostBufferPool(std::string kind, AllocateFn allocate, FreeFn free, int64_t max_cached_bytes);
  void Give(std::byte* data, int64_t capacity);
  struct Cached {
    int64_t capacity;
    std::byte* data;
  };
  // Takes every cached buffer out of the cache (the caller frees them).
  std::list<Cached> DrainCache();

  const std::string kind_;
  const AllocateFn allocate_;
  const FreeFn release_;
  const int64_t max_cached_bytes_;
  // A std::mutex rather than absl::Mutex: the thread sanitizer can see it
  // (Debian's Abseil is not instrumented). Guards the fields below.
  mutable std::mutex mu_;
  std::list<Cached> cache_;  // least recently returned first
  int64_t lent_bytes_ = 0;
  int64_t cached_bytes_ = 0;
  int64_t allocations_ = 0;

  friend class HostBuffer;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_HOST_BUFFERS_H_
