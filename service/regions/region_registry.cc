#include "service/regions/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>
#include <optional>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/regions/sigbus_guard.h"
#include "service/core/log.h"

namespace dgmm {
namespace {

bool NameChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == '-';
}

constexpr size_t kIpcHandleBytes = 64;

std::string RandomId() {
  unsigned char raw[16];
  size_t got = 0;
  while (got < sizeof raw) {
    const ssize_t n = getrandom(raw + got, sizeof raw - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<char*>(raw), sizeof raw));
}

}  // namespace

// ---------------------------------------------------------- RegionRegistry

RegionRegistry::RegionRegistry(RegionOptions options, RegionMemoryOps ops)
    : options_(options),
      enabled_(options.enabled),
      ops_(std::move(ops)),
      instance_id_(RandomId()),
      pinner_(std::make_unique<ThreadPool>(1)),
      workers_(std::make_unique<ThreadPool>(2)) {
  if (options_.enabled) sweeper_ = std::thread([this] { Loop(); });
}

void RegionRegistry::Post(std::function<void()> fn) { workers_->Post(std::move(fn)); }

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
  local_socket_.reset();  // its sessions end: their regions are dropped
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
    return absl::InvalidArgumentError(
        absl::StrFormat("region name must have 1 to 64 characters, got %d", name.size()));
  }
  for (char c : name) {
    if (!NameChar(c)) {
      return absl::InvalidArgumentError(absl::StrCat("region name '", absl::CHexEscape(name),
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

absl::Status RegionRegistry::CheckRequest(const v1::RegisterRegionRequest& request) {
  if (auto st = CheckName(request.name()); !st.ok()) return st;
  const auto range = [](int64_t offset, int64_t byte_size) -> absl::Status {
    if (offset < 0 || byte_size <= 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "a region needs offset >= 0 and byte_size > 0, got offset %d, byte_size %d", offset,
          byte_size));
    }
    if (offset > std::numeric_limits<int64_t>::max() - byte_size) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "region offset %d + byte_size %d overflows a 64-bit byte count", offset, byte_size));
    }
    return absl::OkStatus();
  };
  switch (request.kind_case()) {
    case v1::RegisterRegionRequest::kLocalFd:
      if (request.local_fd().ticket().empty()) {
        return absl::InvalidArgumentError(
            "LocalFdRegion needs the ticket the local socket gave for the descriptor");
      }
      return range(request.local_fd().offset(), request.local_fd().byte_size());
    case v1::RegisterRegionRequest::kCudaIpc:
      if (request.cuda_ipc().handle().size() != kIpcHandleBytes) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "a CUDA IPC handle is the %d raw bytes of a cudaIpcMemHandle_t, got %d bytes",
            kIpcHandleBytes, request.cuda_ipc().handle().size()));
      }
      return range(request.cuda_ipc().offset(), request.cuda_ipc().byte_size());
    case v1::RegisterRegionRequest::kSystemShm:
      return absl::InvalidArgumentError(
          "registering a shared-memory object by its key (system_shm) was removed: the server "
          "maps only memory its client opened. Pass the object's descriptor through the local "
          "socket (LocalPassFd, or LocalOpenShm for an object you own) and register the "
          "ticket (local_fd); docs/protocol.md \"The local socket\"");
    default:
      return absl::InvalidArgumentError("RegisterRegionRequest needs one of local_fd and cuda_ipc");
  }
}

absl::StatusOr<v1::RegionStatus> RegionRegistry::Register(const Caller& caller,
                                                          const v1::RegisterRegionRequest& request,
                                                          const TakeTicket& take_ticket) {
  // 1. The request's own arguments, before the budget is counted. A ticket
  // named by a bad request is used up all the same (its descriptor closed),
  // so that refusals do not pile up unclaimed tickets.
  if (auto st = CheckRequest(request); !st.ok()) {
    if (request.has_local_fd() && !request.local_fd().ticket().empty()) {
      (void)take_ticket(request.local_fd().ticket());
    }
    return st;
  }
  // 2. The ticket (used up from here on), and the range against the memory.
  std::optional<PassedMemory> memory;
  int64_t bytes = 0;
  if (request.has_local_fd()) {
    const v1::LocalFdRegion& at = request.local_fd();
    auto taken = take_ticket(at.ticket());
    if (!taken.ok()) return taken.status();
    memory = std::move(*taken);
    const int64_t size = memory->kind == v1::LOCAL_FD_KIND_CUDA_VMM ? memory->allocation_bytes
                                                                    : memory->object_bytes;
    if (at.offset() > size || at.byte_size() > size - at.offset()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "region [%d, %d) lies past the end of the memory passed (%s), which has %d bytes",
          at.offset(), at.offset() + at.byte_size(), memory->describe, size));
    }
    bytes = at.byte_size();
  } else {
    bytes = request.cuda_ipc().byte_size();
  }
  // 3. The owner's count and the budget.
  {
    std::lock_guard lock(mu_);
    auto& mine = regions_[caller.owner];
    if (mine.count(request.name()) != 0) {
      return absl::AlreadyExistsError(absl::StrCat("this owner already has a region named '",
                                                   request.name(),
                                                   "'; unregister it first or pick another name"));
    }
    if (static_cast<int>(mine.size()) >= options_.max_per_client) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("this owner already has %d regions registered, the most one may have "
                          "(--max_regions_per_client); unregister some first",
                          mine.size()));
    }
    // Only host regions take the server's memory; count GPU regions too, so
    // that the budget bounds what one server holds open for its clients.
    const int64_t now = registered_bytes_->load();
    if (bytes > options_.budget_bytes - now) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "registering %d bytes would exceed the region budget: %d of %d bytes are registered "
          "(--region_memory_budget counts the registered ranges, whether their pages exist "
          "yet or not); unregister regions or stream the job",
          bytes, now, options_.budget_bytes));
    }
    // One uid's share: a local user cannot hold the whole budget (a sparse
    // memfd costs it nothing) and shut the others out.
    const int64_t share = options_.budget_bytes / 100 * options_.max_uid_share_percent +
                          options_.budget_bytes % 100 * options_.max_uid_share_percent / 100;
    const int64_t of_uid = uid_bytes_->Of(caller.peer.uid);
    if (bytes > share - of_uid) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "registering %d bytes would exceed uid %d's share of the region budget: its regions "
          "hold %d of the %d bytes one uid may (--max_region_share_percent=%d of "
          "--region_memory_budget's %d; registered ranges count whether their pages exist or "
          "not); unregister regions or stream the job",
          bytes, caller.peer.uid, of_uid, share, options_.max_uid_share_percent,
          options_.budget_bytes));
    }
    registered_bytes_->fetch_add(bytes);  // held while mapping
    uid_bytes_->Add(caller.peer.uid, bytes);
  }
  // 4. Map, import or open.
  const absl::Time t0 = absl::Now();
  absl::StatusOr<std::shared_ptr<Region>> r =
      !memory.has_value() ? OpenIpc(request.cuda_ipc())
      : memory->kind == v1::LOCAL_FD_KIND_CUDA_VMM
          ? ImportVmm(std::move(*memory), request.local_fd())
          : MapHost(std::move(*memory), request.local_fd());
  if (!r.ok()) {
    registered_bytes_->fetch_sub(bytes);
    uid_bytes_->Add(caller.peer.uid, -bytes);
    return r.status();
  }
  (*r)->name_ = request.name();
  (*r)->owner_ = caller.owner;
  (*r)->owner_uid_ = caller.peer.uid;
  (*r)->session_id_ = caller.peer.session_id;
  (*r)->register_time_ = absl::Now() - t0;
  (*r)->registered_bytes_ = registered_bytes_;  // the Region gives the bytes back now
  (*r)->uid_bytes_ = uid_bytes_;
  (*r)->last_used_ns_.store(absl::ToUnixNanos(absl::Now()));
  std::lock_guard lock(mu_);
  auto& mine = regions_[caller.owner];
  if (mine.count(request.name()) != 0) {  // a concurrent registration won
    return absl::AlreadyExistsError(
        absl::StrCat("this owner already has a region named '", request.name(), "'"));
  }
  mine[request.name()] = *r;
  LogInfo("region registered: '", request.name(), "' of ", caller.owner, " (pid ", caller.peer.pid,
          "), ", (*r)->key_.empty() ? "gpu memory" : (*r)->key_, ", ", (*r)->byte_size(), " bytes",
          (*r)->pinned_ ? ", pinned" : "", (*r)->sealed_ ? ", sealed" : "", ", in ",
          absl::FormatDuration((*r)->register_time_));
  return (*r)->Describe();
}

absl::Status RegionRegistry::StartLocalSocket(LocalSocketOptions options) {
  options.cuda_vmm = static_cast<bool>(ops_.open_vmm);
  auto socket = LocalSocket::Start(std::move(options),
                                   [this](uint64_t session_id) { DropSession(session_id); });
  if (!socket.ok()) return socket.status();
  local_socket_ = std::move(*socket);
  return absl::OkStatus();
}

std::string RegionRegistry::local_socket_path() const {
  return local_socket_ == nullptr ? std::string() : local_socket_->path();
}

absl::StatusOr<RegionRegistry::Caller> RegionRegistry::Identify(absl::string_view session,
                                                                const std::string& token) const {
  if (local_socket_ == nullptr) {
    return absl::FailedPreconditionError("this server has no local socket, so no region sessions");
  }
  auto peer = local_socket_->FindSession(session);
  if (!peer.ok()) return peer.status();
  Caller caller;
  caller.peer = *peer;
  caller.owner = absl::StrCat("uid ", peer->uid, token.empty() ? "" : " with ", token);
  return caller;
}

absl::StatusOr<v1::RegionStatus> RegionRegistry::Register(
    const Caller& caller, const v1::RegisterRegionRequest& request) {
  return Register(caller, request, [this, &caller](absl::string_view ticket) {
    return local_socket_->TakeTicket(caller.peer.session_id, ticket);
  });
}

void RegionRegistry::DropSession(uint64_t session_id) {
  std::vector<std::shared_ptr<Region>> dropped;  // released outside the lock
  {
    std::lock_guard lock(mu_);
    for (auto owner = regions_.begin(); owner != regions_.end();) {
      for (auto it = owner->second.begin(); it != owner->second.end();) {
        if (it->second->session_id_ == session_id) {
          dropped.push_back(std::move(it->second));
          it = owner->second.erase(it);
        } else {
          ++it;
        }
      }
      owner = owner->second.empty() ? regions_.erase(owner) : std::next(owner);
    }
  }
  if (!dropped.empty()) {
    LogInfo("session ", session_id, " closed: ", dropped.size(), " region(s) unregistered");
    // Unmapping, unpinning and closing GPU memory run on a region worker,
    // not on the local socket's one thread.
    Post([dropped = std::move(dropped)] {});
  }
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
        if (r.jobs_in_use_.load() == 0 && options_.idle_timeout > absl::ZeroDuration() &&
            now - absl::FromUnixNanos(r.last_used_ns_.load()) > options_.idle_timeout) {
          why = "it was idle past --region_idle_timeout_s";
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
