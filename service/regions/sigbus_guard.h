// Keeps the server alive when a client shrinks a shared-memory object that a
// registered region maps. Touching a page of a MAP_SHARED mapping past the
// end of its (now shorter) file raises SIGBUS, which would kill the process.
// The guard's handler looks the faulting address up among the guarded
// mappings; if it lies in one, it maps anonymous zero pages over that whole
// mapping (so the faulting access, and every later one, completes) and marks
// the mapping poisoned. The job that touched it then fails
// (RegionRegistry checks poisoned() after every job); any other SIGBUS keeps
// its default action. The lookup is lock-free and async-signal-safe: a fixed
// table of atomic address ranges.
#ifndef DGMM_SERVICE_REGIONS_SIGBUS_GUARD_H_
#define DGMM_SERVICE_REGIONS_SIGBUS_GUARD_H_

#include <cstddef>

namespace dgmm {

class SigbusGuard {
 public:
  // Most mappings guarded at once (the registry refuses regions beyond it).
  static constexpr int kMaxSlots = 4096;

  // Installs the process's SIGBUS handler the first time. Returns a slot for
  // [begin, begin + bytes) (page-aligned begin), or -1 when the table is full.
  static int Guard(void* begin, size_t bytes);
  // Stops guarding a slot; call before the mapping is unmapped.
  static void Release(int slot);
  // True once a SIGBUS hit the slot's mapping (its contents are now zeros).
  static bool poisoned(int slot);
  // SIGBUS faults absorbed since start, over every slot.
  static long absorbed();
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_REGIONS_SIGBUS_GUARD_H_
