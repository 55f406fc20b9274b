// What a client on this host passes the server through the local socket
// (service/regions/local_socket.h): descriptors of its memory, checked to be
// what they claim before a region maps or imports them, and the ids of the
// process that sent them. gRPC-free.
#ifndef DGMM_SERVICE_REGIONS_PASSED_MEMORY_H_
#define DGMM_SERVICE_REGIONS_PASSED_MEMORY_H_

#include <sys/socket.h>
#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/regions/process_memory.h"

namespace dgmm {

// A descriptor the server owns; closed when destroyed.
class OwnedFd {
 public:
  OwnedFd() = default;
  explicit OwnedFd(int fd) : fd_(fd) {}
  ~OwnedFd() { Reset(); }
  OwnedFd(OwnedFd&& o) noexcept : fd_(o.Release()) {}
  OwnedFd& operator=(OwnedFd&& o) noexcept {
    if (this != &o) {
      Reset();
      fd_ = o.Release();
    }
    return *this;
  }
  int get() const { return fd_; }
  int Release() {
    const int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void Reset();

 private:
  int fd_ = -1;
};

// What a ticket stands for: memory a client passed (or, with LocalOpenShm,
// that the server opened for it under the ownership rule).
struct PassedMemory {
  OwnedFd fd;
  v1::LocalFdKind kind = v1::LOCAL_FD_KIND_UNSPECIFIED;
  // LOCAL_FD_KIND_CUDA_VMM.
  int device = -1;
  int64_t allocation_bytes = 0;
  // LOCAL_FD_KIND_MEMORY: the object's size when passed, whether it is
  // sealed against shrinking, and what the descriptor names here.
  int64_t object_bytes = 0;
  bool sealed = false;
  std::string describe;
};

// Checks that `fd` is host memory a region can map: a regular object on
// tmpfs or hugetlbfs (a memfd, /dev/shm), open for reading and writing, not
// sealed against writes. Fills object_bytes, sealed and describe.
// INVALID_ARGUMENT, naming what the descriptor is, otherwise.
absl::Status CheckMemoryFd(int fd, PassedMemory* out);

// Checks, as far as can be told without a CUDA call, that `fd` could be a
// CUDA VMM export: FAILED_PRECONDITION on a server with no GPU in use;
// INVALID_ARGUMENT, naming what it is, for host memory (a memfd or
// shared-memory object), a pipe, socket, directory or block device.
absl::Status CheckVmmFd(int fd, bool server_has_gpu);

// A process's ids, from /proc/<pid>/status (nullopt when it cannot be read:
// the process is gone, or in a PID namespace this one does not see).
struct ProcessIds {
  uid_t ruid = 0, euid = 0, suid = 0, fsuid = 0;
  gid_t egid = 0;
  bool one_uid() const { return ruid == euid && euid == suid && suid == fsuid; }
};
std::optional<ProcessIds> ReadProcessIds(pid_t pid);

// Who is on the other end of a session.
struct LocalPeer {
  uint64_t session_id = 0;
  uid_t uid = 0;
  gid_t gid = 0;
  pid_t pid = 0;
  // The client's own memory, when its hello asked and it was granted
  // (LocalHello.process_memory); null otherwise.
  std::shared_ptr<const ProcessMemory> memory;
};

// A hello's sender becomes the session's peer: the kernel's credentials of
// the hello (`sender`; nullopt where the kernel did not say, then `peer`
// keeps the connecting process's ids) name the process, and the session
// takes that process's effective uid and gid from /proc. Process memory, when
// the hello asks and the server allows it (`process_memory_on`), needs all of
// the sender's uids to be one and its cookie to read back. Returns why
// process memory was refused ("" when granted or not asked for).
std::string TakeHelloSender(const std::optional<ucred>& sender, const v1::LocalHello& hello,
                            bool process_memory_on, LocalPeer* peer);

// A LocalPassFd's descriptor, checked to be the kind it claims
// (CheckMemoryFd, CheckVmmFd), into *out.
absl::Status TakePassedFd(const v1::LocalPassFd& pass, OwnedFd fd, bool server_has_gpu,
                          PassedMemory* out);

// LocalOpenShm: opens shared-memory object `key` for `uid`, only when that
// uid owns it and nobody else may write it (NOT_FOUND, PERMISSION_DENIED).
absl::Status OpenShmForOwner(const std::string& key, uid_t uid, PassedMemory* out);

}  // namespace dgmm

#endif  // DGMM_SERVICE_REGIONS_PASSED_MEMORY_H_
