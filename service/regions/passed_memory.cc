#include "service/regions/passed_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <linux/magic.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/regions/region_registry.h"

namespace dgmm {
namespace {

std::string ErrnoText(int err) { return std::strerror(err); }

std::string Describe(int fd) {
  char link[512];
  const std::string proc = absl::StrCat("/proc/self/fd/", fd);
  const ssize_t n = readlink(proc.c_str(), link, sizeof link - 1);
  return n > 0 ? std::string(link, static_cast<size_t>(n)) : std::string("?");
}

const char* FileType(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a pipe";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISLNK(mode)) return "a symbolic link";
  return "not a regular file";
}

}  // namespace

void OwnedFd::Reset() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

absl::Status CheckMemoryFd(int fd, PassedMemory* out) {
  out->describe = Describe(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot fstat the descriptor passed: ", ErrnoText(errno)));
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the descriptor passed is ", FileType(st.st_mode), " (", out->describe,
        "), not memory: pass a memfd (memfd_create) or a POSIX shared-memory object (shm_open)"));
  }
  struct statfs fs;
  if (fstatfs(fd, &fs) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot fstatfs the descriptor passed: ", ErrnoText(errno)));
  }
  if (fs.f_type != TMPFS_MAGIC && fs.f_type != HUGETLBFS_MAGIC) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the descriptor passed is a file on a filesystem of type 0x%x (%s), not memory: pass a "
        "memfd (memfd_create) or a POSIX shared-memory object (shm_open)",
        static_cast<uint64_t>(fs.f_type), out->describe));
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags < 0 || (flags & O_ACCMODE) != O_RDWR) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the descriptor passed (", out->describe,
        ") is not open for reading and writing: the server writes results into the region"));
  }
  const int seals = fcntl(fd, F_GET_SEALS);
  if (seals > 0 && (seals & (F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)) != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the memfd passed (", out->describe,
        ") is sealed against writing: the server writes results into the region"));
  }
  out->sealed = seals > 0 && (seals & F_SEAL_SHRINK) != 0;
  out->object_bytes = st.st_size;
  return absl::OkStatus();
}

absl::Status CheckVmmFd(int fd, bool server_has_gpu) {
  if (!server_has_gpu) {
    return absl::FailedPreconditionError(
        "this server has no GPU in use, so it cannot import CUDA VMM memory; use host memory "
        "or stream the job");
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot fstat the descriptor passed: ", ErrnoText(errno)));
  }
  // The driver's export is a descriptor of its own: host memory (a memfd, a
  // shared-memory object), a pipe, a socket or a directory is not one. What
  // else it may be is left to the import at RegisterRegion, which proves it.
  const mode_t type = st.st_mode & S_IFMT;
  struct statfs fs;
  const bool host_memory = type == S_IFREG && fstatfs(fd, &fs) == 0 &&
                           (fs.f_type == TMPFS_MAGIC || fs.f_type == HUGETLBFS_MAGIC);
  if (host_memory || type == S_IFDIR || type == S_IFIFO || type == S_IFSOCK || type == S_IFBLK ||
      type == S_IFLNK) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the descriptor passed as CUDA VMM memory is ",
        host_memory ? "host memory (a memfd or shared-memory object)" : FileType(st.st_mode),
        " (", Describe(fd),
        "), not a CUDA allocation: pass the descriptor cuMemExportToShareableHandle gives "
        "(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)"));
  }
  return absl::OkStatus();
}

std::optional<ProcessIds> ReadProcessIds(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/status");
  FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return std::nullopt;
  ProcessIds ids;
  bool uids = false, gids = false;
  char line[256];
  while (std::fgets(line, sizeof line, f) != nullptr) {
    unsigned a, b, c, d;
    if (std::sscanf(line, "Uid: %u %u %u %u", &a, &b, &c, &d) == 4) {
      ids.ruid = a, ids.euid = b, ids.suid = c, ids.fsuid = d;
      uids = true;
    } else if (std::sscanf(line, "Gid: %u %u %u %u", &a, &b, &c, &d) == 4) {
      ids.egid = b;
      gids = true;
    }
  }
  std::fclose(f);
  if (!uids || !gids) return std::nullopt;
  return ids;
}

std::string TakeHelloSender(const std::optional<ucred>& sender, const v1::LocalHello& hello,
                            bool process_memory_on, LocalPeer* peer) {
  // The session is the hello's sender's, whoever connected: a process that
  // connected and then forked, or changed its uid, gets what the process
  // that says hello may have. (A kernel that does not say who sent it, where
  // SO_PASSCRED is not supported, leaves the connecting process's: enough
  // for regions, whose memory the client passes itself, but not for process
  // memory.) The kernel's credentials carry the sender's pid and its real
  // ids; the session takes its effective ones (what the kernel checks its
  // accesses against, as SO_PEERCRED reports them), read from /proc for that
  // pid.
  std::optional<ProcessIds> ids;
  if (sender.has_value() && sender->pid > 0) ids = ReadProcessIds(sender->pid);
  if (ids.has_value()) {
    peer->uid = ids->euid;
    peer->gid = ids->egid;
    peer->pid = sender->pid;
  } else if (sender.has_value()) {
    peer->pid = sender->pid;  // another PID namespace: 0
  }
  if (!hello.process_memory()) return "";
  if (!process_memory_on) return "process memory is off on this server (--process_memory=false)";
  if (!sender.has_value()) {
    return "the kernel did not say which process sent the hello (no SCM_CREDENTIALS on it), so "
           "the server cannot tell whose memory it would read";
  }
  if (ids.has_value() && !ids->one_uid()) {
    return absl::StrFormat(
        "the process that sent the hello has several uids (real %d, effective %d, saved %d, "
        "filesystem %d): the server reads only the memory of a process that is wholly of its "
        "own uid",
        ids->ruid, ids->euid, ids->suid, ids->fsuid);
  }
  auto m = ProcessMemory::Open(peer->pid, peer->uid, hello.cookie_address(), hello.cookie());
  if (!m.ok()) return std::string(m.status().message());
  peer->memory = *std::move(m);
  return "";
}

absl::Status TakePassedFd(const v1::LocalPassFd& pass, OwnedFd fd, bool server_has_gpu,
                          PassedMemory* out) {
  out->kind = pass.kind();
  if (pass.kind() == v1::LOCAL_FD_KIND_MEMORY) {
    if (absl::Status st = CheckMemoryFd(fd.get(), out); !st.ok()) return st;
  } else if (pass.kind() == v1::LOCAL_FD_KIND_CUDA_VMM) {
    if (pass.device() < 0 || pass.allocation_bytes() <= 0) {
      return absl::InvalidArgumentError(
          "a CUDA VMM descriptor needs its device (>= 0) and allocation_bytes (> 0)");
    }
    if (absl::Status st = CheckVmmFd(fd.get(), server_has_gpu); !st.ok()) return st;
    out->device = pass.device();
    out->allocation_bytes = pass.allocation_bytes();
    out->describe = "cuda vmm";
  } else {
    return absl::InvalidArgumentError(
        "LocalPassFd.kind must be LOCAL_FD_KIND_MEMORY or LOCAL_FD_KIND_CUDA_VMM");
  }
  out->fd = std::move(fd);
  return absl::OkStatus();
}

absl::Status OpenShmForOwner(const std::string& key, uid_t uid, PassedMemory* out) {
  if (absl::Status st = RegionRegistry::CheckKey(key); !st.ok()) return st;
  OwnedFd opened(shm_open(key.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0));
  if (opened.get() < 0) {
    const int err = errno;
    return absl::Status(
        err == ENOENT ? absl::StatusCode::kNotFound : absl::StatusCode::kPermissionDenied,
        absl::StrCat("cannot open shared-memory object ", key, " on the server's host: ",
                     ErrnoText(err),
                     err == ENOENT ? "" : "; pass its descriptor instead (LocalPassFd)"));
  }
  struct stat st;
  if (fstat(opened.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != uid ||
      (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::PermissionDeniedError(
        absl::StrFormat("shared-memory object %s is not a regular object owned by uid %d "
                        "and writable by it alone (its owner is uid %d, its mode %04o): "
                        "the server opens an object by name only for its owner",
                        key, uid, st.st_uid, st.st_mode & 07777));
  }
  out->kind = v1::LOCAL_FD_KIND_MEMORY;
  if (absl::Status s = CheckMemoryFd(opened.get(), out); !s.ok()) return s;
  out->fd = std::move(opened);
  return absl::OkStatus();
}

}  // namespace dgmm
