// A copy of `value` read under `mu`: the one-line body of a getter of a
// member that a mutex guards.
#ifndef DGMM_SERVICE_CORE_READ_LOCKED_H_
#define DGMM_SERVICE_CORE_READ_LOCKED_H_

#include <mutex>

namespace dgmm {

template <typename T>
T ReadLocked(std::mutex& mu, const T& value) {
  std::lock_guard lock(mu);
  return value;
}

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_READ_LOCKED_H_
