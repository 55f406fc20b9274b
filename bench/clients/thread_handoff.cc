// What two thread hand-offs cost on this machine: the price a binding pays
// when a call leaves the caller's thread (Node's JS thread) for a worker
// and its result comes back to the caller's event loop, which the C++
// client's own synchronous call does not pay.
//
// The caller hands a task to a worker through a condition variable and
// waits for the answer in epoll on an eventfd, as Node's event loop waits
// for a thread-safe function's call; the worker is busy for --work_us
// (spinning, as a gRPC call keeps its thread) and then writes the eventfd.
// Printed: the median and 90th percentile of (round trip - work), with the
// worker idle (blocked) between tasks and with it spinning for the next one
// (as the Node addon's workers do for 250 us).
//
//   build/bench/thread_handoff [--work_us 70] [--rounds 20000]
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

void Spin(double us) {
  const auto until = Clock::now() + std::chrono::duration<double, std::micro>(us);
  while (Clock::now() < until) {
  }
}

// (round trip - work) in microseconds, sorted.
std::vector<double> Measure(double work_us, int rounds, bool worker_spins) {
  std::mutex mu;
  std::condition_variable cv;
  bool go = false, quit = false;
  std::atomic<bool> posted{false};
  const int efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  const int ep = epoll_create1(EPOLL_CLOEXEC);
  epoll_event ev{};
  ev.events = EPOLLIN;
  epoll_ctl(ep, EPOLL_CTL_ADD, efd, &ev);
  std::thread worker([&] {
    for (;;) {
      if (worker_spins) {
        const auto until = Clock::now() + std::chrono::microseconds(250);
        while (!posted.load(std::memory_order_acquire) && Clock::now() < until) {
          std::this_thread::yield();
        }
      }
      {
        std::unique_lock lock(mu);
        cv.wait(lock, [&] { return go || quit; });
        if (quit) return;
        go = false;
      }
      posted.store(false);
      Spin(work_us);
      const uint64_t one = 1;
      [[maybe_unused]] ssize_t n = write(efd, &one, sizeof one);
    }
  });
  std::vector<double> extra;
  extra.reserve(rounds);
  for (int i = 0; i < rounds; ++i) {
    const auto start = Clock::now();
    {
      std::lock_guard lock(mu);
      go = true;
    }
    posted.store(true, std::memory_order_release);
    cv.notify_one();
    epoll_event out;
    while (epoll_wait(ep, &out, 1, -1) != 1) {
    }
    uint64_t value;
    [[maybe_unused]] ssize_t n = read(efd, &value, sizeof value);
    extra.push_back(std::chrono::duration<double, std::micro>(Clock::now() - start).count() -
                    work_us);
  }
  {
    std::lock_guard lock(mu);
    quit = true;
  }
  cv.notify_one();
  worker.join();
  close(ep);
  close(efd);
  std::sort(extra.begin(), extra.end());
  return extra;
}

}  // namespace

int main(int argc, char** argv) {
  double work_us = 70;
  int rounds = 20000;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--work_us") == 0) work_us = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::atoi(argv[i + 1]);
  }
  for (const bool spins : {false, true}) {
    const std::vector<double> e = Measure(work_us, rounds, spins);
    std::printf("two hand-offs around %.0f us of work, worker %s: median %.1f us, p90 %.1f us\n",
                work_us, spins ? "spinning between tasks" : "blocked between tasks",
                e[e.size() / 2], e[e.size() * 9 / 10]);
  }
  return 0;
}
