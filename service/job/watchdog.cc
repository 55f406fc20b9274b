#include "service/job/watchdog.h"

#include <chrono>

#include "absl/time/clock.h"

namespace dgmm {

StreamWatchdog::StreamWatchdog() : thread_([this] { Loop(); }) {}

StreamWatchdog::~StreamWatchdog() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StreamWatchdog::Watch(std::weak_ptr<Watched> call) {
  std::lock_guard lock(mu_);
  calls_.push_back(std::move(call));
}

void StreamWatchdog::Loop() {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, std::chrono::milliseconds(250));
    std::vector<std::shared_ptr<Watched>> live;
    std::erase_if(calls_, [&](const std::weak_ptr<Watched>& w) {
      auto s = w.lock();
      if (s == nullptr) return true;
      live.push_back(std::move(s));
      return false;
    });
    lock.unlock();
    const absl::Time now = absl::Now();
    for (auto& s : live) s->CheckIdle(now);
    live.clear();  // drop the last references outside the lock
    lock.lock();
  }
}

}  // namespace dgmm
