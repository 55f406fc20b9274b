// The same-host data plane's bookkeeping (docs/protocol.md
// "Regions"): which regions each client registered, what memory they map,
// how many bytes they hold against --region_memory_budget, and when an
// abandoned one is dropped. gRPC-free: the handlers (service/region_service.cc)
// translate requests and statuses.
#ifndef DGMM_SERVICE_REGIONS_REGION_REGISTRY_H_
#define DGMM_SERVICE_REGIONS_REGION_REGISTRY_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/regions/local_socket.h"
#include "util/thread_pool.h"

namespace dgmm {

struct RegionOptions {
  // --allow_regions: false answers every region RPC FAILED_PRECONDITION.
  bool enabled = false;
  // --region_memory_budget, resolved to bytes.
  int64_t budget_bytes = 0;
  // --max_regions_per_client.
  int max_per_client = 64;
  // --max_region_share_percent: the most of budget_bytes the regions of one
  // uid may hold, so that no local user can shut the others out.
  int max_uid_share_percent = 50;
  // --region_idle_timeout_s: a region no job used for this long is dropped;
  // zero: never.
  absl::Duration idle_timeout = absl::Seconds(600);
  // Pin host memory while registering (else on reuse: NoteJob).
  bool pin_on_register = false;
  // How often abandoned regions are looked for.
  absl::Duration sweep_interval = absl::Seconds(1);
};

// What the registry needs from the devices. Empty functions: no GPU.
struct RegionMemoryOps {
  // Pins host memory for DMA by every GPU; returns the function that unpins.
  std::function<absl::StatusOr<std::function<void()>>(void* p, int64_t bytes)> pin_host;
  // Opens a CUDA IPC handle on the GPU of ordinal `device`: the allocation's
  // base, its size and the function that closes it. FAILED_PRECONDITION when
  // the server has no such GPU, INVALID_ARGUMENT when the handle does not open.
  struct IpcMemory {
    std::byte* base = nullptr;
    int64_t bytes = 0;
    std::function<void()> close;
  };
  std::function<absl::StatusOr<IpcMemory>(int device, absl::string_view handle)> open_ipc;
  // Imports a CUDA VMM allocation passed as a POSIX fd (borrowed: the caller
  // closes it) on the GPU of ordinal `device`; errors as for open_ipc.
  std::function<absl::StatusOr<IpcMemory>(int device, int fd, int64_t allocation_bytes)> open_vmm;
};

// The bytes each uid's regions hold (--max_region_share_percent), shared by
// the registry and its regions: a region gives its bytes back when it dies.
class UidBytes {
 public:
  int64_t Of(int64_t uid) const {
    std::lock_guard lock(mu_);
    auto it = bytes_.find(uid);
    return it == bytes_.end() ? 0 : it->second;
  }
  void Add(int64_t uid, int64_t bytes) {
    std::lock_guard lock(mu_);
    if ((bytes_[uid] += bytes) == 0) bytes_.erase(uid);
  }

 private:
  mutable std::mutex mu_;
  std::map<int64_t, int64_t> bytes_;
};

// One registered region's memory. Jobs hold a shared_ptr while they use it,
// so unregistering never frees memory under a job.
class Region {
 public:
  ~Region();
  Region(const Region&) = delete;
  Region& operator=(const Region&) = delete;

  const std::string& name() const { return name_; }
  v1::RegionKind kind() const { return kind_; }
  // -1 for host memory, else the GPU ordinal of GPU memory (CUDA IPC or VMM).
  int device() const { return device_; }
  bool on_gpu() const { return device_ >= 0; }
  int64_t byte_size() const { return byte_size_; }
  // The region's first byte: host memory, or device memory for CUDA IPC.
  std::byte* data() const { return data_; }
  // Same memory as `other` at absolute byte `offset` of the underlying
  // object: used to refuse partly overlapping matrix and result.
  bool SameObject(const Region& other) const { return identity_ == other.identity_; }
  int64_t object_offset() const { return object_offset_; }
  // OK while the memory is as registered; FAILED_PRECONDITION once the
  // client shrank its shared-memory object below the region (a SIGBUS
  // absorbed, or the object's size now short), or its filesystem could not
  // provide a page (a SIGBUS with the size intact: ENOSPC). Once it has
  // failed, a region stays failed until it is registered again, whatever
  // its object's size becomes.
  absl::Status CheckIntact() const;
  // Before a job: FAILED_PRECONDITION when an earlier job found the region
  // failed (CheckIntact), or a SIGBUS has hit it since; no system call.
  absl::Status Usable() const;
  v1::RegionStatus Describe() const;

  // A job's use of the region (RAII): counted in jobs_in_use.
  class Use {
   public:
    explicit Use(std::shared_ptr<Region> r);
    ~Use();
    Use(Use&&) = default;
    Region* operator->() const { return region_.get(); }
    Region& operator*() const { return *region_; }
    const std::shared_ptr<Region>& region() const { return region_; }

   private:
    std::shared_ptr<Region> region_;
  };

 private:
  friend class RegionRegistry;
  Region() = default;

  std::string name_;
  std::string owner_;
  int64_t owner_uid_ = -1;
  uint64_t session_id_ = 0;  // the local-socket session that registered it
  bool sealed_ = false;
  v1::RegionKind kind_ = v1::REGION_KIND_UNSPECIFIED;
  std::string key_;
  int64_t offset_ = 0;
  int64_t byte_size_ = 0;
  int device_ = -1;
  std::byte* data_ = nullptr;
  std::pair<uint64_t, uint64_t> identity_{0, 0};
  int64_t object_offset_ = 0;
  // Pinned by the registry's worker once the region is reused (NoteJob);
  // unpin_ is set before pinned_ and used only by the destructor.
  std::atomic<bool> pin_requested_{false};
  std::atomic<bool> pinned_{false};
  absl::Duration register_time_;
  // Host memory: the object's descriptor, the mapping and its guard slot.
  // (CUDA VMM memory keeps no descriptor: the import holds the allocation.)
  int fd_ = -1;
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  int guard_slot_ = -1;
  // Set by the first CheckIntact that finds the memory broken; never reset.
  mutable std::atomic<bool> failed_{false};
  std::function<void()> unpin_;
  std::function<void()> close_ipc_;
  std::shared_ptr<std::atomic<int64_t>> registered_bytes_;
  std::shared_ptr<UidBytes> uid_bytes_;  // given back under owner_uid_
  std::atomic<int64_t> jobs_in_use_{0};
  std::atomic<int64_t> jobs_total_{0};
  std::atomic<int64_t> last_used_ns_{0};  // absl::ToUnixNanos
};

class RegionRegistry {
 public:
  RegionRegistry(RegionOptions options, RegionMemoryOps ops);
  ~RegionRegistry();

  // The options it was made with; options().enabled is the start's value:
  // whether regions are on now is enabled() (Disable may have turned them off).
  const RegionOptions& options() const { return options_; }
  // Random, fixed for the registry's life (GetServerInfoResponse.instance_id,
  // and every hello of the local socket).
  const std::string& instance_id() const { return instance_id_; }
  bool enabled() const { return enabled_.load(std::memory_order_acquire); }
  // Turns regions off for good (region RPCs FAILED_PRECONDITION, no
  // regions_enabled in GetServerInfo): the server could not start its
  // local socket where --local_socket=auto looked for a place.
  void Disable() { enabled_.store(false, std::memory_order_release); }

  // Who registers: the owner key (the session's uid, with the bearer
  // token's client when the server has tokens) and the session.
  struct Caller {
    std::string owner;
    LocalPeer peer;
  };
  // Starts the local socket (before any region call); its sessions name
  // the callers, and a session's regions go when its connection closes.
  absl::Status StartLocalSocket(LocalSocketOptions options);
  // The socket's path; empty when it is not started.
  std::string local_socket_path() const;
  LocalSocket* local_socket() const { return local_socket_.get(); }
  // The caller of a region RPC: the open session `session` (the metadata
  // dgmm-session; UNAUTHENTICATED otherwise) and `token`, the bearer
  // token's name when the server has several ("" otherwise).
  absl::StatusOr<Caller> Identify(absl::string_view session, const std::string& token) const;
  // Takes a ticket of the caller's session (LocalSocket::TakeTicket).
  using TakeTicket = std::function<absl::StatusOr<PassedMemory>(absl::string_view ticket)>;
  // Register with the local socket's tickets.
  absl::StatusOr<v1::RegionStatus> Register(const Caller& caller,
                                            const v1::RegisterRegionRequest& request);
  // RegisterRegion (see the status table in dgmm.proto, in its order).
  absl::StatusOr<v1::RegionStatus> Register(const Caller& caller,
                                            const v1::RegisterRegionRequest& request,
                                            const TakeTicket& take_ticket);
  // The regions registered through session `session_id` are dropped (those
  // a job uses stay mapped until it ends): its connection closed.
  void DropSession(uint64_t session_id);
  // Drops `name` (every region of `owner` when empty); returns how many.
  absl::StatusOr<int> Unregister(const std::string& owner, const std::string& name);
  absl::StatusOr<v1::GetRegionStatusResponse> Status(const std::string& owner,
                                                     const std::string& name) const;
  // A job on `r` was admitted (its Region::Use exists). Host memory is not
  // pinned at registration: a first job streams through the device's own
  // pinned staging. From a region's second job on it is pinned on the
  // registry's worker (once), so that later jobs DMA straight from it.
  void NoteJob(const std::shared_ptr<Region>& r);
  // Runs the region RPCs off gRPC's callback threads (registration maps the
  // object; pinning has a thread of its own, so it never delays them).
  void Post(std::function<void()> fn);
  // No pin starts after this returns (the pin in progress, if any, has
  // ended). The owner calls it before the GPUs that pin go away.
  void StopPinning();

  // `owner`'s region `name`, or NOT_FOUND.
  absl::StatusOr<std::shared_ptr<Region>> Find(const std::string& owner,
                                               const std::string& name) const;

  // Bytes of every region still mapped, those unregistered but still used
  // by a job included.
  int64_t registered_bytes() const { return registered_bytes_->load(); }
  // Regions in the table now.
  int64_t count() const;
  // Drops regions idle past the timeout, when no job uses them. Runs on
  // its own thread every sweep_interval; public for tests.
  void Sweep(absl::Time now);

  static absl::Status CheckName(absl::string_view name);
  static absl::Status CheckKey(absl::string_view key);
  // The checks of RegisterRegion that need no ticket and no memory:
  // INVALID_ARGUMENT for a bad name, kind, offset, size or overflow.
  static absl::Status CheckRequest(const v1::RegisterRegionRequest& request);

 private:
  absl::StatusOr<std::shared_ptr<Region>> MapHost(PassedMemory memory, const v1::LocalFdRegion& at);
  absl::StatusOr<std::shared_ptr<Region>> ImportVmm(PassedMemory memory,
                                                    const v1::LocalFdRegion& at);
  absl::StatusOr<std::shared_ptr<Region>> OpenIpc(const v1::CudaIpcRegion& ipc);
  // A region of `kind` on GPU memory that ImportVmm or OpenIpc opened: its
  // [offset, offset + byte_size) must lie inside the allocation.
  static absl::StatusOr<std::shared_ptr<Region>> DeviceRegion(RegionMemoryOps::IpcMemory mem,
                                                              v1::RegionKind kind, int device,
                                                              int64_t offset, int64_t byte_size);
  void Loop();
  // Pins host region `r` for the GPUs; false when it stays unpinned.
  bool Pin(Region& r);

  const RegionOptions options_;
  std::atomic<bool> enabled_;
  const RegionMemoryOps ops_;
  const std::string instance_id_;
  const std::shared_ptr<UidBytes> uid_bytes_ = std::make_shared<UidBytes>();
  std::shared_ptr<std::atomic<int64_t>> registered_bytes_ =
      std::make_shared<std::atomic<int64_t>>(0);
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // owner -> name -> region
  std::map<std::string, std::map<std::string, std::shared_ptr<Region>>> regions_
      ABSL_GUARDED_BY(mu_);
  std::thread sweeper_;
  std::mutex pin_mu_;
  std::atomic<bool> pin_stopped_{false};
  std::unique_ptr<ThreadPool> pinner_ ABSL_GUARDED_BY(pin_mu_);  // null once stopped
  std::unique_ptr<ThreadPool> workers_;                          // joined before the table goes
  std::unique_ptr<LocalSocket> local_socket_;                    // last: closed first (DropSession)
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_REGIONS_REGION_REGISTRY_H_
