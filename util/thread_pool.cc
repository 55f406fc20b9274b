#include "util/thread_pool.h"

#include <algorithm>
#include <latch>

namespace dgmm {

ThreadPool::ThreadPool(int threads) {
  for (int i = 0; i < std::max(1, threads); ++i) {
    workers_.emplace_back([this] { WorkerLoop(); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ThreadPool::Post(std::function<void()> fn) {
  {
    std::lock_guard lock(mu_);
    tasks_.push_back(std::move(fn));
  }
  cv_.notify_one();
}

void ThreadPool::ParallelFor(int64_t n, int64_t grain,
                             const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  const int64_t chunks =
      std::clamp<int64_t>(n / std::max<int64_t>(grain, 1), 1, size());
  if (chunks == 1) {
    fn(0, n);
    return;
  }
  const int64_t step = (n + chunks - 1) / chunks;
  std::latch done(chunks - 1);
  {
    std::lock_guard lock(mu_);
    for (int64_t c = 1; c < chunks; ++c) {
      const int64_t begin = c * step;
      const int64_t end = std::min(n, begin + step);
      tasks_.emplace_back([&fn, &done, begin, end] {
        if (begin < end) fn(begin, end);
        done.count_down();
      });
    }
  }
  cv_.notify_all();
  fn(0, std::min(n, step));
  done.wait();
}

}  // namespace dgmm
