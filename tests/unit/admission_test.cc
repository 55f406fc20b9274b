// Admission: budgets, FIFO queue with bounded backfill, deadlines, cancel.
#include "service/job/admission.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "service/util/retry_pushback.h"

namespace dgmm {
namespace {

// Records what a queued job's callback received.
struct Slot {
  std::mutex mu;
  std::optional<absl::StatusOr<Reservation>> result;
  Admission::Callback Callback() {
    return [this](absl::StatusOr<Reservation> r) {
      std::lock_guard lock(mu);
      result.emplace(std::move(r));
    };
  }
  bool done() {
    std::lock_guard lock(mu);
    return result.has_value();
  }
  bool admitted() {
    std::lock_guard lock(mu);
    return result.has_value() && result->ok();
  }
  absl::StatusCode code() {
    std::lock_guard lock(mu);
    return result->status().code();
  }
  void Release() {
    std::lock_guard lock(mu);
    (*result)->Release();
  }
};

bool WaitFor(const std::function<bool()>& pred, int ms = 5000) {
  for (int i = 0; i < ms / 5; ++i) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}


TEST(Admission, AdmitsAtOnceWhenFreeAndReturnsBytesOnRelease) {
  Admission a({{"cpu", 100}}, 4, absl::Seconds(1));
  Slot s;
  ASSERT_TRUE(a.Submit({.host_bytes = 60}, absl::InfiniteFuture(), s.Callback()).ok());
  ASSERT_TRUE(s.admitted());
  EXPECT_EQ(a.total_reserved(), 60);
  EXPECT_EQ(a.Stats()[0].running, 1);
  s.Release();
  EXPECT_EQ(a.total_reserved(), 0);
  EXPECT_EQ(a.Stats()[0].running, 0);
}

TEST(Admission, RejectsNeedOverCapacityAtOnceWithoutReserving) {
  Admission a({{"cpu", 100}, {"cuda:0", 50}}, 4, absl::Seconds(1));
  Slot s;
  auto t = a.Submit({.host_bytes = 101}, absl::InfiniteFuture(), s.Callback());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  t = a.Submit({.host_bytes = 10, .device_pool = 1, .device_bytes = 51}, absl::InfiniteFuture(),
               s.Callback());
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(s.done());
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(Admission, QueuesInFifoOrder) {
  Admission a({{"cpu", 100}}, 8, absl::Seconds(10));
  Slot first, b, c;
  ASSERT_TRUE(a.Submit({.host_bytes = 100}, absl::InfiniteFuture(), first.Callback()).ok());
  ASSERT_TRUE(a.Submit({.host_bytes = 60}, absl::InfiniteFuture(), b.Callback()).ok());
  ASSERT_TRUE(a.Submit({.host_bytes = 60}, absl::InfiniteFuture(), c.Callback()).ok());
  EXPECT_EQ(a.Stats()[0].queued, 2);
  EXPECT_FALSE(b.done());
  first.Release();
  EXPECT_TRUE(b.admitted());
  EXPECT_FALSE(c.done());  // 40 free, needs 60
  b.Release();
  EXPECT_TRUE(c.admitted());
  c.Release();
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(Admission, SmallJobPassesBlockedHeadOnlyWhileHeadIsYoung) {
  {
    Admission a({{"cpu", 100}}, 8, absl::Seconds(10));
    Slot big_running, head, small;
    ASSERT_TRUE(a.Submit({.host_bytes = 50}, absl::InfiniteFuture(), big_running.Callback()).ok());
    ASSERT_TRUE(a.Submit({.host_bytes = 80}, absl::InfiniteFuture(), head.Callback()).ok());
    ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), small.Callback()).ok());
    EXPECT_TRUE(small.admitted()) << "backfill should admit a job that fits now";
    EXPECT_FALSE(head.done());
    small.Release();
    big_running.Release();
    EXPECT_TRUE(head.admitted());
    head.Release();
  }
  {
    Admission a({{"cpu", 100}}, 8, absl::ZeroDuration());  // head never passed
    Slot big_running, head, small;
    ASSERT_TRUE(a.Submit({.host_bytes = 50}, absl::InfiniteFuture(), big_running.Callback()).ok());
    ASSERT_TRUE(a.Submit({.host_bytes = 80}, absl::InfiniteFuture(), head.Callback()).ok());
    ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), small.Callback()).ok());
    EXPECT_FALSE(small.done()) << "an old head must not be passed";
    big_running.Release();
    EXPECT_TRUE(head.admitted());
    EXPECT_TRUE(small.admitted());  // 80 + 10 fit together
    head.Release();
    small.Release();
    EXPECT_EQ(a.total_reserved(), 0);
  }
}

TEST(Admission, FullQueueAnswersAtOnceWithRetryPushback) {
  Admission a({{"cpu", 10}}, 2, absl::Seconds(1));
  Slot running, q1, q2, q3;
  ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), running.Callback()).ok());
  ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), q1.Callback()).ok());
  ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), q2.Callback()).ok());
  auto t = a.Submit({.host_bytes = 1}, absl::InfiniteFuture(), q3.Callback());
  ASSERT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(std::string(t.status().message()).find("queue is full"), std::string::npos);
  const std::optional<int64_t> pushback = RetryPushbackMs(t.status());
  ASSERT_TRUE(pushback.has_value());
  EXPECT_GE(*pushback, 10);  // admission.cc's floor
  EXPECT_LE(*pushback, 30000);
  a.Close();
  EXPECT_EQ(q1.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(q2.code(), absl::StatusCode::kUnavailable);
  running.Release();
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(Admission, DeadlineExpiringWhileQueuedEndsTheJob) {
  Admission a({{"cpu", 10}}, 4, absl::Seconds(10));
  Slot running, waiting;
  ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), running.Callback()).ok());
  ASSERT_TRUE(
      a.Submit({.host_bytes = 5}, absl::Now() + absl::Milliseconds(50), waiting.Callback()).ok());
  ASSERT_TRUE(WaitFor([&] { return waiting.done(); }));
  EXPECT_EQ(waiting.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(a.Stats()[0].queued, 0);
  running.Release();
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(Admission, CancelRemovesQueuedJobAndLetsOthersThrough) {
  Admission a({{"cpu", 10}}, 4, absl::ZeroDuration());
  Slot running, head, next;
  ASSERT_TRUE(a.Submit({.host_bytes = 6}, absl::InfiniteFuture(), running.Callback()).ok());
  auto head_ticket = a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), head.Callback());
  ASSERT_TRUE(a.Submit({.host_bytes = 4}, absl::InfiniteFuture(), next.Callback()).ok());
  EXPECT_FALSE(next.done());
  a.Cancel(*head_ticket);
  EXPECT_EQ(head.code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(next.admitted());
  running.Release();
  next.Release();
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(Admission, DeviceJobNeedsHostAndDeviceBytesAtOnce) {
  Admission a({{"cpu", 100}, {"cuda:0", 100}}, 4, absl::Seconds(1));
  Slot cpu_job, gpu_job;
  ASSERT_TRUE(a.Submit({.host_bytes = 95}, absl::InfiniteFuture(), cpu_job.Callback()).ok());
  ASSERT_TRUE(a.Submit({.host_bytes = 10, .device_pool = 1, .device_bytes = 50},
                       absl::InfiniteFuture(), gpu_job.Callback())
                  .ok());
  EXPECT_FALSE(gpu_job.done()) << "host bytes are short";
  cpu_job.Release();
  ASSERT_TRUE(gpu_job.admitted());
  EXPECT_EQ(a.Stats()[1].reserved, 50);
  EXPECT_EQ(a.Stats()[1].running, 1);
  gpu_job.Release();
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(Admission, ManyThreadsLeaveNothingReserved) {
  Admission a({{"cpu", 1000}}, 1000, absl::Milliseconds(5));
  std::atomic<int> admitted{0}, ended{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        auto holder = std::make_shared<std::optional<Reservation>>();
        auto ticket = a.Submit({.host_bytes = 50 + (i * 37 + t) % 300},
                               i % 7 == 0 ? absl::Now() + absl::Microseconds(200)
                                          : absl::InfiniteFuture(),
                               [&, holder](absl::StatusOr<Reservation> r) {
                                 if (r.ok()) admitted++;
                                 ended++;
                                 // released at once: the reservation dies here
                               });
        if (!ticket.ok()) {
          ended++;
        } else if (i % 5 == 0) {
          a.Cancel(*ticket);
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(WaitFor([&] { return ended.load() == 1600; }));
  EXPECT_GT(admitted.load(), 0);
  EXPECT_EQ(a.total_reserved(), 0);
  EXPECT_EQ(a.running(), 0);
}

}  // namespace
}  // namespace dgmm
