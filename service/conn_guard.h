// Keeps the listener alive when the process runs out of file descriptors,
// and caps the connections the server holds.
//
// gRPC 1.51's TCP listener stops accepting for good after the first accept4
// error it does not expect (EMFILE, ENFILE): it logs "Failed accept4: Too many
// open files" and never re-arms the listening socket. The guard interposes
// accept4 for the whole process (this executable's definition precedes
// libc's for libgrpc's calls, by ordinary ELF symbol interposition) and makes
// every accept end in a connection the caller may keep or in EAGAIN, which
// gRPC answers by waiting for the next connection:
//  - a connection whose descriptor would be at or above the ceiling is closed
//    at once (the client sees the connection reset: UNAVAILABLE), and the
//    next pending one is tried;
//  - on EMFILE/ENFILE a reserved descriptor is given up for a moment so that
//    the pending connection can be taken off the queue and closed, instead of
//    staying in the backlog.
// Descriptors are handed out lowest-first, so a new descriptor numbered at
// or above the ceiling means at least that many are open: the ceiling is a
// cap on open descriptors, which is connections plus the few dozen the server
// holds itself.
#ifndef DGMM_SERVICE_CONN_GUARD_H_
#define DGMM_SERVICE_CONN_GUARD_H_

#include <cstdint>

namespace dgmm {

struct ConnGuardStats {
  int64_t shed_over_ceiling = 0;  // connections closed because of the ceiling
  int64_t shed_on_emfile = 0;     // connections closed because no descriptor was left
  int ceiling = 0;                // descriptors at or above this are refused
};

// Raises the soft RLIMIT_NOFILE to the hard limit (as Go's runtime and nginx
// do) and returns the soft limit now in force.
int64_t RaiseOpenFileLimit();

// Arms the guard: accepted descriptors at or above `ceiling` are refused.
// Opens the reserve descriptor. Call once, before the server listens.
void ArmConnGuard(int ceiling);

ConnGuardStats GetConnGuardStats();

// The lowest descriptor number free now (a measure of how many are open).
int LowestFreeFd();

}  // namespace dgmm

#endif  // DGMM_SERVICE_CONN_GUARD_H_
