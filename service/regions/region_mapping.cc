// How a region's memory is had: host memory mapped (and pinned for DMA on a
// GPU server), CUDA VMM memory imported, CUDA IPC memory opened; and what a
// Region checks before each job. Part of RegionRegistry (region_registry.h).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/core/log.h"
#include "service/regions/region_registry.h"
#include "service/regions/sigbus_guard.h"

namespace dgmm {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

}  // namespace

// ------------------------------------------------------------------ Region

Region::~Region() {
  if (unpin_) unpin_();
  if (guard_slot_ >= 0) SigbusGuard::Release(guard_slot_);
  if (map_ != nullptr) munmap(map_, map_bytes_);
  if (fd_ >= 0) close(fd_);
  if (close_ipc_) close_ipc_();
  if (registered_bytes_) registered_bytes_->fetch_sub(byte_size_);
  if (uid_bytes_) uid_bytes_->Add(owner_uid_, -byte_size_);
}

absl::Status Region::CheckIntact() const {
  if (kind_ != v1::REGION_KIND_SYSTEM_SHM) return absl::OkStatus();
  if (failed_.load()) return Usable();
  const bool poisoned = SigbusGuard::poisoned(guard_slot_);
  // A sealed object cannot shrink (F_SEAL_SHRINK): nothing to check.
  if (sealed_ && !poisoned) return absl::OkStatus();
  struct stat st;
  const bool stat_ok = fstat(fd_, &st) == 0;
  const bool shrank = !stat_ok || st.st_size < offset_ + byte_size_;
  if (!poisoned && !shrank) return absl::OkStatus();
  failed_.store(true);
  if (shrank) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "region '%s': the memory passed (%s) shrank below the registered range [%d, %d) "
        "while the server had it mapped; the job's data is lost. The region stays unusable: "
        "unregister it, restore the object's size and register it again",
        name_, key_, offset_, offset_ + byte_size_));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "region '%s': the filesystem that holds the memory passed (%s) is full: a page of the "
      "registered range [%d, %d) could not be allocated when the server touched it (SIGBUS with "
      "the object's size intact: ENOSPC, a tmpfs at its size limit or no free huge pages); the "
      "job's data is lost. The region stays unusable: free room, unregister it and register it "
      "again",
      name_, key_, offset_, offset_ + byte_size_));
}

absl::Status Region::Usable() const {
  if (kind_ != v1::REGION_KIND_SYSTEM_SHM) return absl::OkStatus();
  if (!failed_.load() && !SigbusGuard::poisoned(guard_slot_)) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "region '%s' (%s) failed in an earlier job (its memory shrank, or its filesystem was "
      "full) and stays unusable until it is registered again: unregister it and register it "
      "again",
      name_, key_));
}

v1::RegionStatus Region::Describe() const {
  v1::RegionStatus s;
  s.set_name(name_);
  s.set_kind(kind_);
  s.set_key(key_);
  s.set_offset(offset_);
  s.set_byte_size(byte_size_);
  s.set_device(device_);
  s.set_pinned(pinned_.load());
  s.set_jobs_in_use(jobs_in_use_.load());
  s.set_jobs_total(jobs_total_.load());
  s.set_register_ns(absl::ToInt64Nanoseconds(register_time_));
  s.set_sealed(sealed_);
  s.set_owner_uid(owner_uid_);
  return s;
}

Region::Use::Use(std::shared_ptr<Region> r) : region_(std::move(r)) {
  region_->jobs_in_use_.fetch_add(1);
  region_->jobs_total_.fetch_add(1);
  region_->last_used_ns_.store(absl::ToUnixNanos(absl::Now()));
}

Region::Use::~Use() {
  if (region_ == nullptr) return;  // moved from
  region_->last_used_ns_.store(absl::ToUnixNanos(absl::Now()));
  region_->jobs_in_use_.fetch_sub(1);
}

// ---------------------------------------------------------- mapping

bool RegionRegistry::Pin(Region& r) {
  auto unpin = ops_.pin_host(r.data_, r.byte_size_);
  if (!unpin.ok()) {
    LogInfo("region '", r.name_, "' of ", r.owner_, " stays unpinned: ", unpin.status().ToString());
    return false;
  }
  r.unpin_ = std::move(*unpin);
  r.pinned_ = true;
  return true;
}

absl::StatusOr<std::shared_ptr<Region>> RegionRegistry::MapHost(PassedMemory memory,
                                                                const v1::LocalFdRegion& at) {
  std::shared_ptr<Region> r(new Region());
  r->kind_ = v1::REGION_KIND_SYSTEM_SHM;
  r->key_ = memory.describe;
  r->offset_ = at.offset();
  r->byte_size_ = at.byte_size();
  r->sealed_ = memory.sealed;
  r->fd_ = memory.fd.Release();
  struct stat st;
  if (fstat(r->fd_, &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot fstat ", r->key_, ": ", ErrnoText(errno)));
  }
  if (at.offset() > st.st_size || at.byte_size() > st.st_size - at.offset()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "region [%d, %d) lies past the end of the memory passed (%s), which has %d bytes",
        at.offset(), at.offset() + at.byte_size(), r->key_, st.st_size));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t map_offset = at.offset() / page * page;
  const int64_t delta = at.offset() - map_offset;
  r->map_bytes_ = static_cast<size_t>(delta + at.byte_size());
  void* m = mmap(nullptr, r->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, map_offset);
  if (m == MAP_FAILED) {
    const int err = errno;
    r->map_ = nullptr;
    return (err == EACCES || err == EPERM ? absl::InvalidArgumentError
                                          : absl::ResourceExhaustedError)(absl::StrCat(
        "cannot map the memory passed (", r->key_, ") for reading and writing: ", ErrnoText(err)));
  }
  r->map_ = m;
  // Huge pages where the host allows them for shared memory (as the C++
  // client asks for its own mapping); no effect elsewhere.
  madvise(m, r->map_bytes_, MADV_HUGEPAGE);
  r->guard_slot_ = SigbusGuard::Guard(m, r->map_bytes_);
  if (r->guard_slot_ < 0) {
    return absl::ResourceExhaustedError("too many shared-memory regions mapped at once");
  }
  r->data_ = static_cast<std::byte*>(m) + delta;
  r->identity_ = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  r->object_offset_ = at.offset();
  if (options_.pin_on_register && ops_.pin_host) {
    r->pin_requested_ = true;
    if (!Pin(*r)) return absl::ResourceExhaustedError("cannot pin the region for the GPUs");
    // Pinning faults every page in: a shrink during it shows here.
    if (auto intact = r->CheckIntact(); !intact.ok()) return intact;
  }
  return r;
}

absl::StatusOr<std::shared_ptr<Region>> RegionRegistry::ImportVmm(PassedMemory memory,
                                                                  const v1::LocalFdRegion& at) {
  if (at.offset() > memory.allocation_bytes ||
      at.byte_size() > memory.allocation_bytes - at.offset()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA VMM region [%d, %d) lies past the end of its allocation, which has %d bytes",
        at.offset(), at.offset() + at.byte_size(), memory.allocation_bytes));
  }
  if (!ops_.open_vmm) {
    return absl::FailedPreconditionError(
        "this server has no GPU in use, so it cannot import CUDA VMM memory; use host memory "
        "or stream the job");
  }
  auto mem = ops_.open_vmm(memory.device, memory.fd.get(), memory.allocation_bytes);
  if (!mem.ok()) return mem.status();
  return DeviceRegion(*std::move(mem), v1::REGION_KIND_CUDA_VMM, memory.device, at.offset(),
                      at.byte_size());
}

absl::StatusOr<std::shared_ptr<Region>> RegionRegistry::DeviceRegion(
    RegionMemoryOps::IpcMemory mem, v1::RegionKind kind, int device, int64_t offset,
    int64_t byte_size) {
  std::shared_ptr<Region> r(new Region());
  r->close_ipc_ = std::move(mem.close);
  r->kind_ = kind;
  r->offset_ = offset;
  r->byte_size_ = byte_size;
  r->device_ = device;
  if (offset > mem.bytes || byte_size > mem.bytes - offset) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s region [%d, %d) lies past the end of its allocation, which has %d bytes",
        kind == v1::REGION_KIND_CUDA_VMM ? "CUDA VMM" : "CUDA IPC", offset, offset + byte_size,
        mem.bytes));
  }
  r->data_ = mem.base + offset;
  r->identity_ = {~uint64_t{0}, reinterpret_cast<uint64_t>(mem.base)};
  r->object_offset_ = offset;
  return r;
}

absl::StatusOr<std::shared_ptr<Region>> RegionRegistry::OpenIpc(const v1::CudaIpcRegion& ipc) {
  if (!ops_.open_ipc) {
    return absl::FailedPreconditionError(
        "this server has no GPU in use, so it cannot open CUDA IPC regions; use host memory "
        "or stream the job");
  }
  auto mem = ops_.open_ipc(ipc.device(), ipc.handle());
  if (!mem.ok()) return mem.status();
  return DeviceRegion(*std::move(mem), v1::REGION_KIND_CUDA_IPC, ipc.device(), ipc.offset(),
                      ipc.byte_size());
}

}  // namespace dgmm
