// A fixed pool of worker threads with a blocking parallel-for. Shared: the
// CPU backend computes on one (ParallelFor), the engine runs its job workers
// on another (Post).
#ifndef DGMM_UTIL_THREAD_POOL_H_
#define DGMM_UTIL_THREAD_POOL_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dgmm {

class ThreadPool {
 public:
  // Starts `threads` workers (at least 1).
  explicit ThreadPool(int threads);
  // Waits for queued work to finish, then joins the workers.
  ~ThreadPool();

  int size() const { return static_cast<int>(workers_.size()); }

  // Runs fn on a worker, later. Work still queued at destruction is run.
  void Post(std::function<void()> fn);

  // Calls fn(begin, end) over [0, n) split into at most size() contiguous
  // chunks of at least `grain` items, in parallel; the calling thread runs one
  // chunk itself. Returns when every chunk is done. Safe to call from many
  // threads at once.
  void ParallelFor(int64_t n, int64_t grain,
                   const std::function<void(int64_t, int64_t)>& fn);

 private:
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace dgmm

#endif  // DGMM_UTIL_THREAD_POOL_H_
