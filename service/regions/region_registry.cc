#include "service/regions/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/regions/sigbus_guard.h"
#include "service/util/log.h"

namespace dgmm {
namespace {

bool NameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
         c == '.' || c == '_' || c == '-';
}

constexpr size_t kIpcHandleBytes = 64;

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
}

absl::Status Region::CheckIntact() const {
  if (kind_ != v1::REGION_KIND_SYSTEM_SHM) return absl::OkStatus();
  struct stat st;
  const bool poisoned = SigbusGuard::poisoned(guard_slot_);
  if (poisoned || fstat(fd_, &st) != 0 || st.st_size < offset_ + byte_size_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "region '%s': the shared-memory object %s shrank below the registered range [%d, %d) "
        "while the server had it mapped; the job's data is lost. Unregister the region, "
        "restore the object's size and register it again",
        name_, key_, offset_, offset_ + byte_size_));
  }
  return absl::OkStatus();
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

// ---------------------------------------------------------- RegionRegistry

RegionRegistry::RegionRegistry(RegionOptions options, RegionMemoryOps ops)
    : options_(options),
      ops_(std::move(ops)),
      pinner_(std::make_unique<ThreadPool>(1)),
      workers_(std::make_unique<ThreadPool>(2)) {
  if (options_.enabled) sweeper_ = std::thread([this] { Loop(); });
}

void RegionRegistry::Post(std::function<void()> fn) { workers_->Post(std::move(fn)); }

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

void RegionRegistry::NoteJob(const std::shared_ptr<Region>& r) {
  if (!ops_.pin_host || r->kind_ != v1::REGION_KIND_SYSTEM_SHM) return;
  // Use counts this job: the region is reused once it has had one before.
  if (r->jobs_total_.load() < 2 || r->pin_requested_.exchange(true)) return;
  std::lock_guard lock(pin_mu_);
  if (pinner_ == nullptr) return;  // stopping
  // A weak reference: a region the client unregisters before its turn is
  // not kept mapped (and counted against the budget) for a pin.
  pinner_->Post([this, weak = std::weak_ptr<Region>(r)] {
    std::shared_ptr<Region> region = weak.lock();
    if (region == nullptr || pin_stopped_.load()) return;
    const absl::Time t0 = absl::Now();
    if (Pin(*region)) {
      LogInfo("region '", region->name_, "' of ", region->owner_, " pinned on reuse, ",
              region->byte_size_, " bytes in ", absl::FormatDuration(absl::Now() - t0));
    }
  });
}

void RegionRegistry::StopPinning() {
  std::unique_ptr<ThreadPool> pinner;
  {
    std::lock_guard lock(pin_mu_);
    pin_stopped_ = true;
    pinner = std::move(pinner_);
  }
  pinner.reset();  // a pin under way finishes; queued ones see pin_stopped_
}

RegionRegistry::~RegionRegistry() {
  StopPinning();
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (sweeper_.joinable()) sweeper_.join();
}

absl::Status RegionRegistry::CheckName(absl::string_view name) {
  if (name.empty() || name.size() > 64) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "region name must have 1 to 64 characters, got %d", name.size()));
  }
  for (char c : name) {
    if (!NameChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "region name '", absl::CHexEscape(name),
          "' has a character outside [A-Za-z0-9._-]"));
    }
  }
  return absl::OkStatus();
}

absl::Status RegionRegistry::CheckKey(absl::string_view key) {
  const auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "shared-memory key '", absl::CHexEscape(key.substr(0, 256)), "' ", why,
        ": a key is '/' followed by 1 to 200 characters of [A-Za-z0-9._-], a name in /dev/shm, "
        "never a path"));
  };
  if (key.size() < 2 || key.size() > 201 || key[0] != '/') return bad("has the wrong form");
  const absl::string_view rest = key.substr(1);
  if (rest == "." || rest == "..") return bad("names a directory");
  for (char c : rest) {
    if (!NameChar(c)) return bad("has a character outside [A-Za-z0-9._-]");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<Region>> RegionRegistry::MapShm(
    const std::string& owner, const std::string& name, const v1::SystemShmRegion& shm) {
  if (auto st = CheckKey(shm.key()); !st.ok()) return st;
  if (shm.offset() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("region offset must be >= 0, got ", shm.offset()));
  }
  if (shm.byte_size() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("region byte_size must be > 0, got ", shm.byte_size()));
  }
  std::shared_ptr<Region> r(new Region());
  r->name_ = name;
  r->owner_ = owner;
  r->kind_ = v1::REGION_KIND_SYSTEM_SHM;
  r->key_ = shm.key();
  r->offset_ = shm.offset();
  r->byte_size_ = shm.byte_size();
  r->fd_ = shm_open(shm.key().c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (r->fd_ < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrCat(
          "no shared-memory object ", shm.key(),
          " on the server's host: regions work only for a client on the same host (or "
          "sharing its /dev/shm); stream the job instead"));
    }
    if (err == EACCES || err == EPERM) {
      return absl::PermissionDeniedError(absl::StrCat(
          "the server (uid ", getuid(), ") may not open the shared-memory object ", shm.key(),
          " for reading and writing: ", ErrnoText(err)));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("cannot open shared-memory object ", shm.key(), ": ", ErrnoText(err)));
  }
  struct stat st;
  if (fstat(r->fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shared-memory object ", shm.key(), " is not a regular object"));
  }
  if (shm.offset() > st.st_size || shm.byte_size() > st.st_size - shm.offset()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "region [%d, %d) lies past the end of shared-memory object %s, which has %d bytes",
        shm.offset(), shm.offset() + std::min<int64_t>(shm.byte_size(), INT64_MAX - shm.offset()),
        shm.key(), st.st_size));
  }
  const int64_t page = sysconf(_SC_PAGESIZE);
  const int64_t map_offset = shm.offset() / page * page;
  const int64_t delta = shm.offset() - map_offset;
  r->map_bytes_ = static_cast<size_t>(delta + shm.byte_size());
  void* m = mmap(nullptr, r->map_bytes_, PROT_READ | PROT_WRITE, MAP_SHARED, r->fd_, map_offset);
  if (m == MAP_FAILED) {
    r->map_ = nullptr;
    return absl::ResourceExhaustedError(absl::StrCat("cannot map shared-memory object ",
                                                     shm.key(), ": ", ErrnoText(errno)));
  }
  r->map_ = m;
  r->guard_slot_ = SigbusGuard::Guard(m, r->map_bytes_);
  if (r->guard_slot_ < 0) {
    return absl::ResourceExhaustedError("too many shared-memory regions mapped at once");
  }
  r->data_ = static_cast<std::byte*>(m) + delta;
  r->identity_ = {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
  r->object_offset_ = shm.offset();
  if (options_.pin_on_register && ops_.pin_host) {
    r->pin_requested_ = true;
    if (!Pin(*r)) return absl::ResourceExhaustedError("cannot pin the region for the GPUs");
    // Pinning faults every page in: a shrink during it shows here.
    if (auto intact = r->CheckIntact(); !intact.ok()) return intact;
  }
  return r;
}

absl::StatusOr<std::shared_ptr<Region>> RegionRegistry::OpenIpc(const std::string& owner,
                                                                const std::string& name,
                                                                const v1::CudaIpcRegion& ipc) {
  if (ipc.handle().size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a CUDA IPC handle is the %d raw bytes of a cudaIpcMemHandle_t, got %d bytes",
        kIpcHandleBytes, ipc.handle().size()));
  }
  if (ipc.offset() < 0 || ipc.byte_size() <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA IPC region needs offset >= 0 and byte_size > 0, got offset %d, byte_size %d",
        ipc.offset(), ipc.byte_size()));
  }
  if (!ops_.open_ipc) {
    return absl::FailedPreconditionError(
        "this server has no GPU in use, so it cannot open CUDA IPC regions; use shared-memory "
        "(system) regions or stream the job");
  }
  auto mem = ops_.open_ipc(ipc.device(), ipc.handle());
  if (!mem.ok()) return mem.status();
  std::shared_ptr<Region> r(new Region());
  r->close_ipc_ = std::move(mem->close);
  r->name_ = name;
  r->owner_ = owner;
  r->kind_ = v1::REGION_KIND_CUDA_IPC;
  r->offset_ = ipc.offset();
  r->byte_size_ = ipc.byte_size();
  r->device_ = ipc.device();
  if (ipc.offset() > mem->bytes || ipc.byte_size() > mem->bytes - ipc.offset()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CUDA IPC region [%d, %d) lies past the end of its allocation, which has %d bytes",
        ipc.offset(), ipc.offset() + std::min<int64_t>(ipc.byte_size(), INT64_MAX - ipc.offset()),
        mem->bytes));
  }
  r->data_ = mem->base + ipc.offset();
  r->identity_ = {~uint64_t{0}, reinterpret_cast<uint64_t>(mem->base)};
  r->object_offset_ = ipc.offset();
  return r;
}

absl::StatusOr<v1::RegionStatus> RegionRegistry::Register(
    const std::string& owner, const v1::RegisterRegionRequest& request) {
  if (auto st = CheckName(request.name()); !st.ok()) return st;
  int64_t bytes = 0;
  if (request.has_system_shm()) {
    bytes = request.system_shm().byte_size();
  } else if (request.has_cuda_ipc()) {
    bytes = request.cuda_ipc().byte_size();
  } else {
    return absl::InvalidArgumentError(
        "RegisterRegionRequest needs one of system_shm and cuda_ipc");
  }
  {
    std::lock_guard lock(mu_);
    auto& mine = regions_[owner];
    if (mine.count(request.name()) != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("this client already has a region named '", request.name(),
                       "'; unregister it first or pick another name"));
    }
    if (static_cast<int>(mine.size()) >= options_.max_per_client) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "this client already has %d regions registered, the most one client may have "
          "(--max_regions_per_client); unregister some first",
          mine.size()));
    }
    // Only host regions take the server's memory; count IPC regions too, so
    // that the budget bounds what one server holds open for its clients.
    const int64_t now = registered_bytes_->load();
    if (bytes > 0 && bytes > options_.budget_bytes - now) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "registering %d bytes would exceed the region budget: %d of %d bytes are registered "
          "(--region_memory_budget); unregister regions or stream the job",
          bytes, now, options_.budget_bytes));
    }
    if (bytes > 0) registered_bytes_->fetch_add(bytes);  // held while mapping
  }
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::shared_ptr<Region>> r =
      request.has_system_shm() ? MapShm(owner, request.name(), request.system_shm())
                               : OpenIpc(owner, request.name(), request.cuda_ipc());
  if (!r.ok()) {
    if (bytes > 0) registered_bytes_->fetch_sub(bytes);
    return r.status();
  }
  (*r)->register_time_ = absl::Now() - t0;
  (*r)->registered_bytes_ = registered_bytes_;  // the Region gives the bytes back now
  (*r)->last_used_ns_.store(absl::ToUnixNanos(absl::Now()));
  std::lock_guard lock(mu_);
  auto& mine = regions_[owner];
  if (mine.count(request.name()) != 0) {  // a concurrent registration won
    return absl::AlreadyExistsError(
        absl::StrCat("this client already has a region named '", request.name(), "'"));
  }
  mine[request.name()] = *r;
  LogInfo("region registered: '", request.name(), "' of ", owner, ", ",
          (*r)->kind() == v1::REGION_KIND_SYSTEM_SHM ? (*r)->key_ : "cuda ipc", ", ",
          (*r)->byte_size(), " bytes", (*r)->pinned_ ? ", pinned" : "", ", in ",
          absl::FormatDuration((*r)->register_time_));
  return (*r)->Describe();
}

absl::StatusOr<int> RegionRegistry::Unregister(const std::string& owner, const std::string& name) {
  std::vector<std::shared_ptr<Region>> dropped;  // released outside the lock
  {
    std::lock_guard lock(mu_);
    auto it = regions_.find(owner);
    if (name.empty()) {
      if (it == regions_.end()) return 0;
      for (auto& [n, r] : it->second) dropped.push_back(std::move(r));
      regions_.erase(it);
    } else {
      if (auto st = CheckName(name); !st.ok()) return st;
      if (it == regions_.end() || it->second.count(name) == 0) {
        return absl::NotFoundError(absl::StrCat("this client has no region named '", name, "'"));
      }
      dropped.push_back(std::move(it->second[name]));
      it->second.erase(name);
      if (it->second.empty()) regions_.erase(it);
    }
  }
  return static_cast<int>(dropped.size());
}

absl::StatusOr<v1::GetRegionStatusResponse> RegionRegistry::Status(const std::string& owner,
                                                                   const std::string& name) const {
  v1::GetRegionStatusResponse out;
  std::lock_guard lock(mu_);
  auto it = regions_.find(owner);
  if (!name.empty()) {
    if (auto st = CheckName(name); !st.ok()) return st;
    if (it == regions_.end() || it->second.count(name) == 0) {
      return absl::NotFoundError(absl::StrCat("this client has no region named '", name, "'"));
    }
    *out.add_regions() = it->second.at(name)->Describe();
  } else if (it != regions_.end()) {
    for (const auto& [n, r] : it->second) *out.add_regions() = r->Describe();
  }
  out.set_registered_bytes(registered_bytes_->load());
  out.set_region_budget_bytes(options_.budget_bytes);
  return out;
}

absl::StatusOr<std::shared_ptr<Region>> RegionRegistry::Find(const std::string& owner,
                                                             const std::string& name) const {
  if (auto st = CheckName(name); !st.ok()) return st;
  std::lock_guard lock(mu_);
  auto it = regions_.find(owner);
  if (it == regions_.end() || it->second.count(name) == 0) {
    return absl::NotFoundError(absl::StrCat("this client has no region named '", name,
                                            "' (regions are per client: register it first)"));
  }
  return it->second.at(name);
}

int64_t RegionRegistry::count() const {
  std::lock_guard lock(mu_);
  int64_t n = 0;
  for (const auto& [o, m] : regions_) n += static_cast<int64_t>(m.size());
  return n;
}

void RegionRegistry::Sweep(absl::Time now) {
  std::vector<std::shared_ptr<Region>> dropped;
  {
    std::lock_guard lock(mu_);
    for (auto owner = regions_.begin(); owner != regions_.end();) {
      for (auto it = owner->second.begin(); it != owner->second.end();) {
        Region& r = *it->second;
        const char* why = nullptr;
        if (r.jobs_in_use_.load() == 0) {
          struct stat st;
          if (r.kind_ == v1::REGION_KIND_SYSTEM_SHM && fstat(r.fd_, &st) == 0 &&
              st.st_nlink == 0) {
            why = "its shared-memory object was unlinked";
          } else if (options_.idle_timeout > absl::ZeroDuration() &&
                     now - absl::FromUnixNanos(r.last_used_ns_.load()) > options_.idle_timeout) {
            why = "it was idle past --region_idle_timeout_s";
          }
        }
        if (why != nullptr) {
          LogInfo("region dropped: '", r.name_, "' of ", r.owner_, ": ", why);
          dropped.push_back(std::move(it->second));
          it = owner->second.erase(it);
        } else {
          ++it;
        }
      }
      owner = owner->second.empty() ? regions_.erase(owner) : std::next(owner);
    }
  }
}

void RegionRegistry::Loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, absl::ToChronoNanoseconds(options_.sweep_interval));
    if (stopping_) break;
    lock.unlock();
    Sweep(absl::Now());
    lock.lock();
  }
}

}  // namespace dgmm
