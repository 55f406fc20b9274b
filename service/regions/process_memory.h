// A local client's own memory, read and written by the server
// (RegionRef.process_address; docs/protocol.md "Process memory").
//
// A client on this host that says hello on the local socket may ask that
// its jobs name its own memory: the server then copies the matrix out of the
// client process and the result into it with process_vm_readv and
// process_vm_writev, and no region, memfd or copy in the client is needed.
//
// The kernel checks each call as if the server attached to the client with
// ptrace. The grant adds no right the client does not have: it is given
// only to a process of the server's own uid (which could attach to the
// server, and the server to it, anyway), in the server's PID namespace.
// Addresses are the client's to choose: a bad one faults in the client's
// address space, and the call says so (INVALID_ARGUMENT).
//
// The process is named by its pid, which the kernel reuses once the process
// is gone. So the server holds a pidfd and proves, at the hello and again
// before every job, that the process at that pid still holds the random
// cookie the client sent at the address it named; a process that took the
// pid since would not.
#ifndef DGMM_SERVICE_REGIONS_PROCESS_MEMORY_H_
#define DGMM_SERVICE_REGIONS_PROCESS_MEMORY_H_

#include <sys/types.h>

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "service/core/problem.h"

namespace dgmm {

class ProcessMemory final : public TileMemory {
 public:
  // Cookies of fewer bytes are refused (guessable), and of more (pointless).
  static constexpr size_t kMinCookie = 16;
  static constexpr size_t kMaxCookie = 64;

  // Access to the memory of `pid` (a peer of uid `uid`), proven by reading
  // `cookie` at `cookie_address` there. FAILED_PRECONDITION, saying why,
  // when it cannot be granted: another uid than this process's, no pid (a
  // client in another PID namespace), a cookie of the wrong size, or a
  // kernel that refuses the access (Yama's ptrace_scope, a process that is
  // not dumpable, ...).
  static absl::StatusOr<std::shared_ptr<ProcessMemory>> Open(pid_t pid, uid_t uid,
                                                             uint64_t cookie_address,
                                                             std::string cookie);
  ~ProcessMemory() override;
  ProcessMemory(const ProcessMemory&) = delete;
  ProcessMemory& operator=(const ProcessMemory&) = delete;

  pid_t pid() const { return pid_; }
  // OK while the process that said hello is alive at its pid (its cookie
  // still where it said); CANCELLED once it has exited.
  absl::Status Check() const;

  // Before a job touches anything: OK when each [at, at + bytes) lies in
  // mappings of the process that allow its `access` ('r' to read, 'w' to
  // write), asked of the kernel one mapping at a time (PROCMAP_QUERY on
  // /proc/<pid>/maps), or from one read of that file where the kernel lacks
  // it; else INVALID_ARGUMENT naming the first byte that does not, so that a
  // job fails before it writes any of its result rather than after part of
  // it.
  struct MappedRange {
    uint64_t at = 0;
    int64_t bytes = 0;
    char access = 'r';
  };
  // kText: from the maps text even where the kernel has PROCMAP_QUERY (the
  // test of the fallback).
  enum class MapsSource { kAuto, kText };
  absl::Status CheckMapped(std::initializer_list<MappedRange> ranges,
                           MapsSource source = MapsSource::kAuto) const;
  absl::Status CheckMapped(uint64_t at, int64_t bytes, char access,
                           MapsSource source = MapsSource::kAuto) const {
    return CheckMapped({MappedRange{at, bytes, access}}, source);
  }

  // TileMemory. A range the process cannot read (or write) is
  // INVALID_ARGUMENT, naming it; a process gone is CANCELLED.
  absl::Status Read(std::byte* dst, const std::byte* src, int64_t bytes) const override;
  absl::Status Write(std::byte* dst, const std::byte* src, int64_t bytes) const override;

 private:
  // Read: the client's [at, at + bytes) into `local`; else `local` there.
  absl::Status Copy(bool read, std::byte* local, uint64_t at, int64_t bytes) const;
  ProcessMemory(pid_t pid, int pidfd, uint64_t cookie_address, std::string cookie)
      : pid_(pid), pidfd_(pidfd), cookie_address_(cookie_address), cookie_(std::move(cookie)) {}

  const pid_t pid_;
  const int pidfd_;
  const uint64_t cookie_address_;
  const std::string cookie_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_REGIONS_PROCESS_MEMORY_H_
