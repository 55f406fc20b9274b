#include "service/conn_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <climits>
#include <mutex>

namespace dgmm {
namespace {

std::atomic<int> g_ceiling{INT_MAX};
std::atomic<int64_t> g_shed_over_ceiling{0};
std::atomic<int64_t> g_shed_on_emfile{0};
std::mutex g_reserve_mu;
int g_reserve_fd = -1;  // guarded by g_reserve_mu

int RealAccept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  return static_cast<int>(syscall(SYS_accept4, fd, addr, len, flags));
}

bool NonBlocking(int fd) {
  const int fl = fcntl(fd, F_GETFL);
  return fl >= 0 && (fl & O_NONBLOCK) != 0;
}

// Out of descriptors: give up the reserve, take one pending connection off
// the listener's queue and close it, take the reserve back. True if a
// connection was shed.
bool ShedOnExhaustion(int fd) {
  std::lock_guard lock(g_reserve_mu);
  if (g_reserve_fd < 0) g_reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (g_reserve_fd < 0) return false;
  close(g_reserve_fd);
  g_reserve_fd = -1;
  const int c = RealAccept4(fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
  if (c >= 0) close(c);
  g_reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (c < 0) return false;
  g_shed_on_emfile++;
  return true;
}

}  // namespace

int64_t RaiseOpenFileLimit() {
  rlimit r{};
  if (getrlimit(RLIMIT_NOFILE, &r) != 0) return -1;
  if (r.rlim_cur < r.rlim_max) {
    rlimit raised = r;
    raised.rlim_cur = r.rlim_max;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) r = raised;
  }
  return r.rlim_cur == RLIM_INFINITY ? INT64_MAX : static_cast<int64_t>(r.rlim_cur);
}

void ArmConnGuard(int ceiling) {
  {
    std::lock_guard lock(g_reserve_mu);
    if (g_reserve_fd < 0) g_reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  }
  g_ceiling = ceiling;
}

ConnGuardStats GetConnGuardStats() {
  return ConnGuardStats{.shed_over_ceiling = g_shed_over_ceiling.load(),
                        .shed_on_emfile = g_shed_on_emfile.load(),
                        .ceiling = g_ceiling.load()};
}

int LowestFreeFd() {
  const int fd = fcntl(0, F_DUPFD_CLOEXEC, 0);
  if (fd < 0) return -1;
  close(fd);
  return fd;
}

}  // namespace dgmm

// The interposed accept4 (see conn_guard.h). Plain C linkage so that it
// precedes libc's definition for every caller in the process.
extern "C" int accept4(int fd, sockaddr* addr, socklen_t* len, int flags) {
  const bool retry_allowed = dgmm::NonBlocking(fd);
  for (;;) {
    const int c = dgmm::RealAccept4(fd, addr, len, flags);
    if (c >= 0) {
      if (c < dgmm::g_ceiling.load(std::memory_order_relaxed)) return c;
      close(c);
      dgmm::g_shed_over_ceiling++;
      if (retry_allowed) continue;  // the next pending one, or EAGAIN
      errno = ECONNABORTED;
      return -1;
    }
    if (errno == EMFILE || errno == ENFILE) {
      if (dgmm::ShedOnExhaustion(fd) && retry_allowed) continue;
      // Nothing else can be done now; the caller waits for the next
      // connection instead of giving its listener up.
      errno = retry_allowed ? EAGAIN : ECONNABORTED;
      return -1;
    }
    // gRPC's listener takes anything but EINTR, EAGAIN and ECONNABORTED as
    // fatal and stops accepting for good (tcp_server_posix.cc): ENOBUFS,
    // ENOMEM, EPROTO, EPERM (a firewall) become "try again later" too.
    if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK && errno != ECONNABORTED) {
      errno = retry_allowed ? EAGAIN : ECONNABORTED;
    }
    return -1;
  }
}
