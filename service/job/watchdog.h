// Ends calls that went quiet, so that they give back their connection slot
// and their reservation: a Multiply request that does not arrive, a stream
// with no header, no first block or no progress, a reply the client never
// takes. One thread looks at every live call a few times a second; each call
// decides for itself (CheckIdle). gRPC-free.
#ifndef DGMM_SERVICE_JOB_WATCHDOG_H_
#define DGMM_SERVICE_JOB_WATCHDOG_H_

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/time/time.h"

namespace dgmm {

// When a call that went quiet is ended (DEADLINE_EXCEEDED), giving its
// reservation back.
struct StreamTimeouts {
  // No header (MultiplyStream) or request (Multiply, from when the server
  // starts to read it) within this time.
  absl::Duration header = absl::Seconds(30);
  // Admitted, and no block within this time of the acceptance.
  absl::Duration first_block = absl::Seconds(10);
  // Admitted, and neither a block received nor a result taken for this long;
  // also how long a reply may wait for the client to take it.
  absl::Duration idle = absl::Seconds(120);
};

class StreamWatchdog {
 public:
  class Watched {
   public:
    virtual ~Watched() = default;
    // Ends the call if it has been quiet too long at `now`.
    virtual void CheckIdle(absl::Time now) = 0;
  };
  StreamWatchdog();
  ~StreamWatchdog();
  // Watches `call` until it is destroyed.
  void Watch(std::weak_ptr<Watched> call);

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::weak_ptr<Watched>> calls_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_JOB_WATCHDOG_H_
