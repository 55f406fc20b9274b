#include "service/regions/process_memory.h"

#include <fcntl.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dgmm {
namespace {

int PidfdOpen(pid_t pid) { return static_cast<int>(syscall(SYS_pidfd_open, pid, 0)); }

bool PidfdAlive(int pidfd) { return syscall(SYS_pidfd_send_signal, pidfd, 0, nullptr, 0) == 0; }

// One direction of the copy: process_vm_readv or process_vm_writev, repeated
// over what a partial call left. 0 on success, else the errno that stopped it
// (EFAULT for a call that moved nothing).
int Transfer(pid_t pid, bool read, std::byte* local, uint64_t remote, int64_t bytes) {
  while (bytes > 0) {
    iovec l{local, static_cast<size_t>(bytes)};
    iovec r{reinterpret_cast<void*>(remote), static_cast<size_t>(bytes)};
    const ssize_t n =
        read ? process_vm_readv(pid, &l, 1, &r, 1, 0) : process_vm_writev(pid, &l, 1, &r, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EFAULT;
    local += n;
    remote += static_cast<uint64_t>(n);
    bytes -= n;
  }
  return 0;
}

// One mapping of the client's address space: [lo, hi), readable, writable.
struct Mapping {
  uint64_t lo, hi;
  bool r, w;
};

// PROCMAP_QUERY (Linux 6.11, include/uapi/linux/fs.h): one mapping of the
// process whose /proc/<pid>/maps `fd` is, by address, without the text.
struct ProcmapQuery {
  uint64_t size;
  uint64_t query_flags;
  uint64_t query_addr;
  uint64_t vma_start;
  uint64_t vma_end;
  uint64_t vma_flags;
  uint64_t vma_page_size;
  uint64_t vma_offset;
  uint64_t inode;
  uint32_t dev_major;
  uint32_t dev_minor;
  uint32_t vma_name_size;
  uint32_t build_id_size;
  uint64_t vma_name_addr;
  uint64_t build_id_addr;
};
static_assert(sizeof(ProcmapQuery) == 104);
constexpr unsigned long kProcmapQuery = _IOWR('f', 17, ProcmapQuery);
constexpr uint64_t kVmaReadable = 0x01;
constexpr uint64_t kVmaWritable = 0x02;
constexpr uint64_t kCoveringOrNextVma = 0x10;

// The mappings that cover the ranges, from the first of each range's
// address until a gap or its end; nullopt where the kernel has no
// PROCMAP_QUERY (the caller reads the text instead).
std::optional<std::vector<Mapping>> QueryMappings(
    int fd, std::initializer_list<ProcessMemory::MappedRange> ranges) {
  static std::atomic<bool> unsupported{false};
  if (unsupported.load(std::memory_order_relaxed)) return std::nullopt;
  std::vector<Mapping> mappings;
  for (const ProcessMemory::MappedRange& range : ranges) {
    if (range.bytes <= 0) continue;
    const uint64_t end = range.at + static_cast<uint64_t>(range.bytes);
    for (uint64_t at = range.at; at < end;) {
      ProcmapQuery q{};
      q.size = sizeof q;
      q.query_flags = kCoveringOrNextVma;
      q.query_addr = at;
      if (ioctl(fd, kProcmapQuery, &q) != 0) {
        if (errno == ENOENT) break;  // nothing mapped at or after `at`: a gap
        if (errno == ENOTTY || errno == EINVAL || errno == EOPNOTSUPP) {
          unsupported.store(true, std::memory_order_relaxed);
        }
        return std::nullopt;
      }
      mappings.push_back({q.vma_start, q.vma_end, (q.vma_flags & kVmaReadable) != 0,
                          (q.vma_flags & kVmaWritable) != 0});
      if (q.vma_start > at || q.vma_end <= at) break;  // a gap at `at`
      at = q.vma_end;
    }
  }
  std::sort(mappings.begin(), mappings.end(),
            [](const Mapping& a, const Mapping& b) { return a.lo < b.lo; });
  mappings.erase(std::unique(mappings.begin(), mappings.end(),
                             [](const Mapping& a, const Mapping& b) { return a.lo == b.lo; }),
                 mappings.end());
  return mappings;
}

// Every mapping of the maps text, in address order.
std::vector<Mapping> ReadMappings(FILE* maps) {
  std::vector<Mapping> mappings;
  char line[512];
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    uint64_t lo = 0, hi = 0;
    char perms[5] = {};
    const bool whole = std::strchr(line, '\n') != nullptr;
    if (std::sscanf(line, "%" SCNx64 "-%" SCNx64 " %4s", &lo, &hi, perms) == 3) {
      mappings.push_back({lo, hi, perms[0] == 'r', perms[1] == 'w'});
    }
    // A line longer than the buffer (a long path): skip its rest.
    while (!whole && std::fgets(line, sizeof line, maps) != nullptr &&
           std::strchr(line, '\n') == nullptr) {
    }
  }
  return mappings;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ProcessMemory>> ProcessMemory::Open(pid_t pid, uid_t uid,
                                                                   uint64_t cookie_address,
                                                                   std::string cookie) {
  const auto refused = [](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat("process memory refused: ", why));
  };
  if (pid <= 0) {
    return refused(
        "the client is in another PID namespace (another container), so its pid is "
        "unknown here");
  }
  if (uid != geteuid()) {
    return refused(absl::StrFormat(
        "the client's uid %d is not the server's (%d): the server reads only the memory of "
        "processes of its own user",
        uid, geteuid()));
  }
  if (cookie.size() < kMinCookie || cookie.size() > kMaxCookie) {
    return refused(absl::StrFormat("the hello's cookie has %d bytes, not %d to %d", cookie.size(),
                                   kMinCookie, kMaxCookie));
  }
  const int pidfd = PidfdOpen(pid);
  if (pidfd < 0) {
    return refused(absl::StrCat("pidfd_open(", pid, "): ", std::strerror(errno)));
  }
  std::shared_ptr<ProcessMemory> m(
      new ProcessMemory(pid, pidfd, cookie_address, std::move(cookie)));
  std::string seen(m->cookie_.size(), '\0');
  const int err = Transfer(pid, /*read=*/true, reinterpret_cast<std::byte*>(seen.data()),
                           cookie_address, static_cast<int64_t>(seen.size()));
  if (err == EPERM) {
    return refused(
        "the kernel does not let the server read the client's memory (EPERM: Yama's "
        "kernel.yama.ptrace_scope above 0 without PR_SET_PTRACER, a process that is not "
        "dumpable, or other credentials)");
  }
  if (err != 0) {
    return refused(
        absl::StrCat("the cookie could not be read at its address (", std::strerror(err), ")"));
  }
  if (seen != m->cookie_) return refused("the bytes at the cookie's address are not the cookie");
  if (!PidfdAlive(pidfd)) return refused("the client process has exited");
  return m;
}

ProcessMemory::~ProcessMemory() { close(pidfd_); }

absl::Status ProcessMemory::Check() const {
  std::string seen(cookie_.size(), '\0');
  const int err = Transfer(pid_, /*read=*/true, reinterpret_cast<std::byte*>(seen.data()),
                           cookie_address_, static_cast<int64_t>(seen.size()));
  if (err == 0 && seen == cookie_ && PidfdAlive(pidfd_)) return absl::OkStatus();
  if (!PidfdAlive(pidfd_) || err == ESRCH) {
    return absl::CancelledError(absl::StrCat("the client process ", pid_, " has exited"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "process memory: the cookie of the session's hello is no longer readable in process ", pid_,
      err != 0 ? absl::StrCat(" (", std::strerror(err), ")") : std::string(" (changed)"),
      "; the session must keep it in place while it lasts"));
}

absl::Status ProcessMemory::CheckMapped(std::initializer_list<MappedRange> ranges,
                                        MapsSource source) const {
  const std::string path = absl::StrCat("/proc/", pid_, "/maps");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (!PidfdAlive(pidfd_)) {
      return absl::CancelledError(absl::StrCat("the client process ", pid_, " has exited"));
    }
    return absl::InvalidArgumentError(
        absl::StrCat("process memory: cannot read ", path, ": ", std::strerror(errno)));
  }
  // The mappings over the ranges, in address order: asked of the kernel one
  // mapping at a time (PROCMAP_QUERY), else read from the maps text, whose
  // making costs the kernel about half a millisecond for a process of a few
  // hundred mappings.
  std::optional<std::vector<Mapping>> queried =
      source == MapsSource::kText ? std::nullopt : QueryMappings(fd, ranges);
  std::vector<Mapping> mappings;
  if (queried.has_value()) {
    mappings = *std::move(queried);
    close(fd);
  } else {
    FILE* maps = fdopen(fd, "re");
    if (maps == nullptr) {
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat("process memory: cannot read ", path, ": ", std::strerror(errno)));
    }
    mappings = ReadMappings(maps);
    std::fclose(maps);
  }
  for (const MappedRange& range : ranges) {
    if (range.bytes <= 0) continue;
    const uint64_t end = range.at + static_cast<uint64_t>(range.bytes);
    // Walk the mappings while they cover the range without a gap.
    uint64_t covered = range.at;
    bool allowed = true;
    for (const Mapping& m : mappings) {
      if (covered >= end) break;
      if (m.hi <= covered) continue;
      if (m.lo > covered) break;  // a gap: nothing mapped at `covered`
      if (!(range.access == 'w' ? m.w : m.r)) {
        allowed = false;
        break;
      }
      covered = m.hi;
    }
    if (covered >= end) continue;
    return absl::InvalidArgumentError(absl::StrFormat(
        "process memory: bytes [%#x, %#x) of client process %d cannot be %s (%s at %#x); the "
        "job stopped before touching any of its memory",
        range.at, end, pid_, range.access == 'w' ? "written" : "read",
        allowed ? "nothing is mapped"
                : (range.access == 'w' ? "a mapping without write access"
                                       : "a mapping without read access"),
        covered));
  }
  return absl::OkStatus();
}

absl::Status ProcessMemory::Read(std::byte* dst, const std::byte* src, int64_t bytes) const {
  return Copy(/*read=*/true, dst, reinterpret_cast<uint64_t>(src), bytes);
}

absl::Status ProcessMemory::Write(std::byte* dst, const std::byte* src, int64_t bytes) const {
  return Copy(/*read=*/false, const_cast<std::byte*>(src), reinterpret_cast<uint64_t>(dst), bytes);
}

absl::Status ProcessMemory::Copy(bool read, std::byte* local, uint64_t at, int64_t bytes) const {
  const int err = Transfer(pid_, read, local, at, bytes);
  if (err == 0) return absl::OkStatus();
  if (err == ESRCH)
    return absl::CancelledError(absl::StrCat("the client process ", pid_, " has exited"));
  return absl::InvalidArgumentError(
      absl::StrFormat("process memory: bytes [%#x, %#x) of client process %d cannot be %s (%s)", at,
                      at + bytes, pid_, read ? "read" : "written", std::strerror(err)));
}

}  // namespace dgmm
