#include "service/core/host_buffers.h"

#include <sys/mman.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "service/core/read_locked.h"

namespace dgmm {
namespace {

// Smallest buffer a pool lends: one page.
constexpr int64_t kMinCapacity = 4096;

// Size classes: whole pages up to 64 KiB, then eight classes per power of
// two, so a buffer is at most 1/8 larger than asked (pinned memory is locked
// whole).
int64_t CapacityFor(int64_t bytes) {
  if (bytes <= kMinCapacity) return kMinCapacity;
  const int64_t step = std::max<int64_t>(
      kMinCapacity, static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(bytes - 1))) / 8);
  return (bytes + step - 1) / step * step;
}

}  // namespace

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Reset();
    pool_ = std::move(other.pool_);
    data_ = std::exchange(other.data_, nullptr);
    capacity_ = std::exchange(other.capacity_, 0);
  }
  return *this;
}

void HostBuffer::Reset() {
  if (data_ != nullptr) pool_->Give(data_, capacity_);
  pool_.reset();
  data_ = nullptr;
  capacity_ = 0;
}

HostBufferPool::HostBufferPool(std::string kind, AllocateFn allocate, FreeFn free,
                               int64_t max_cached_bytes)
    : kind_(std::move(kind)),
      allocate_(std::move(allocate)),
      release_(std::move(free)),
      max_cached_bytes_(max_cached_bytes) {}

std::shared_ptr<HostBufferPool> HostBufferPool::Create(std::string kind, AllocateFn allocate,
                                                       FreeFn free, int64_t max_cached_bytes) {
  return std::shared_ptr<HostBufferPool>(
      new HostBufferPool(std::move(kind), std::move(allocate), std::move(free), max_cached_bytes));
}

std::shared_ptr<HostBufferPool> HostBufferPool::CreateMapped(int64_t max_cached_bytes) {
  return Create(
      "host",
      [](int64_t bytes) -> absl::StatusOr<std::byte*> {
        void* p = mmap(nullptr, static_cast<size_t>(bytes), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return absl::ResourceExhaustedError(std::strerror(errno));
        return static_cast<std::byte*>(p);
      },
      [](std::byte* data, int64_t bytes) { munmap(data, static_cast<size_t>(bytes)); },
      max_cached_bytes);
}

HostBufferPool::~HostBufferPool() {
  // Every lent buffer holds a reference to the pool, so none is out now.
  for (const Cached& c : cache_) release_(c.data, c.capacity);
}

std::list<HostBufferPool::Cached> HostBufferPool::DrainCache() {
  std::lock_guard lock(mu_);
  cached_bytes_ = 0;
  return std::move(cache_);
}

int64_t HostBufferPool::ReleaseCached() {
  int64_t bytes = 0;
  for (const Cached& c : DrainCache()) {
    release_(c.data, c.capacity);
    bytes += c.capacity;
  }
  return bytes;
}

absl::StatusOr<HostBuffer> HostBufferPool::Take(int64_t bytes) {
  const int64_t capacity = CapacityFor(bytes);
  HostBuffer buffer;
  {
    std::lock_guard lock(mu_);
    lent_bytes_ += capacity;
    // The most recently returned buffer of this size: the one most likely
    // still in the CPU's caches.
    for (auto it = cache_.rbegin(); it != cache_.rend(); ++it) {
      if (it->capacity == capacity) {
        buffer.data_ = it->data;
        cache_.erase(std::next(it).base());
        cached_bytes_ -= capacity;
        break;
      }
    }
  }
  if (buffer.data_ == nullptr) {
    absl::StatusOr<std::byte*> data = allocate_(capacity);
    if (!data.ok()) {
      // Memory kept for other sizes may be what is missing: give it back and
      // try once more.
      for (const Cached& c : DrainCache()) release_(c.data, c.capacity);
      data = allocate_(capacity);
    }
    if (!data.ok()) {
      std::lock_guard lock(mu_);
      lent_bytes_ -= capacity;
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", capacity, " bytes of ",
                                                       kind_, " memory for a block: ",
                                                       data.status().message()));
    }
    buffer.data_ = *data;
    std::lock_guard lock(mu_);
    ++allocations_;
  }
  buffer.pool_ = shared_from_this();
  buffer.capacity_ = capacity;
  return buffer;
}

void HostBufferPool::Give(std::byte* data, int64_t capacity) {
  std::list<Cached> evicted;
  {
    std::lock_guard lock(mu_);
    lent_bytes_ -= capacity;
    if (capacity > max_cached_bytes_) {
      evicted.push_back({capacity, data});
    } else {
      cache_.push_back({capacity, data});
      cached_bytes_ += capacity;
      while (cached_bytes_ > max_cached_bytes_) {
        cached_bytes_ -= cache_.front().capacity;
        evicted.splice(evicted.end(), cache_, cache_.begin());
      }
    }
  }
  for (const Cached& c : evicted) release_(c.data, c.capacity);
}

int64_t HostBufferPool::lent_bytes() const { return ReadLocked(mu_, lent_bytes_); }

int64_t HostBufferPool::cached_bytes() const { return ReadLocked(mu_, cached_bytes_); }

int64_t HostBufferPool::allocations() const { return ReadLocked(mu_, allocations_); }

}  // namespace dgmm
