// Admission: budgets, FIFO queue with bounded backfill, deadlines, cancel.
#include "service/engine/admission.h"

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "service/core/retry_pushback.h"

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

namespace dgmm {
namespace {

// ------------------------------------------------ fair share

ClientLimits Limits(int max_running, int max_share_percent = 100) {
  return ClientLimits{.max_running = max_running, .max_queued = 0,
                      .max_share_percent = max_share_percent};
}

TEST(AdmissionFairShare, JobOverItsShareRunsWhenNobodyElseWaits) {
  // One connection, one job within its share: its second job is over its
  // share, yet it runs at once because no other job waits for the room.
  Admission a({{"cpu", 100}}, 8, absl::Seconds(10), Limits(1));
  Slot first, second;
  ASSERT_TRUE(a.Submit({.host_bytes = 30}, absl::InfiniteFuture(), first.Callback(), "a").ok());
  ASSERT_TRUE(a.Submit({.host_bytes = 30}, absl::InfiniteFuture(), second.Callback(), "a").ok());
  EXPECT_TRUE(first.admitted());
  EXPECT_TRUE(second.admitted());
  EXPECT_EQ(a.running(), 2);
  first.Release();
  second.Release();
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(AdmissionFairShare, JobOverItsShareWaitsBehindAnotherClientsJobThatNeedsTheRoom) {
  Admission a({{"cpu", 100}}, 8, absl::Seconds(10), Limits(1));
  Slot a1, a2, b1;
  ASSERT_TRUE(a.Submit({.host_bytes = 60}, absl::InfiniteFuture(), a1.Callback(), "a").ok());
  ASSERT_TRUE(a1.admitted());
  // b1 is within its share but does not fit beside a1 (60 + 50 > 100).
  ASSERT_TRUE(a.Submit({.host_bytes = 50}, absl::InfiniteFuture(), b1.Callback(), "b").ok());
  // a2 would fit (60 + 30), but it is over a's share and b1 needs the room.
  ASSERT_TRUE(a.Submit({.host_bytes = 30}, absl::InfiniteFuture(), a2.Callback(), "a").ok());
  EXPECT_FALSE(b1.done());
  EXPECT_FALSE(a2.done());
  a1.Release();
  // b1 first; then a2 fits beside it and nobody within a share waits.
  EXPECT_TRUE(b1.admitted());
  EXPECT_TRUE(a2.admitted());
  b1.Release();
  a2.Release();
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(AdmissionFairShare, ConnectionsOfOneHostTakeTurns) {
  // Connection h:1 has a job running and three waiting; h:2 (same host) has
  // one waiting. When room frees, h:2's first job (rank 0) goes before
  // h:1's second (rank 1).
  Admission a({{"cpu", 20}}, 16, absl::Seconds(10), Limits(0));
  Slot h1_running, other, c1[3], c2;
  ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), h1_running.Callback(),
                       ClientId("h:1", "h")).ok());
  ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), other.Callback(), "x").ok());
  for (Slot& s : c1) {
    ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), s.Callback(),
                         ClientId("h:1", "h")).ok());
  }
  ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), c2.Callback(),
                       ClientId("h:2", "h")).ok());
  other.Release();
  EXPECT_TRUE(c2.admitted());
  EXPECT_FALSE(c1[0].done());
  c2.Release();
  EXPECT_TRUE(c1[0].admitted());
  h1_running.Release();
  EXPECT_TRUE(c1[1].admitted());
  c1[0].Release();
  c1[1].Release();
  EXPECT_TRUE(c1[2].admitted());
  c1[2].Release();
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(AdmissionFairShare, HostShareIsACeilingOverItsConnections) {
  // Host h holds 50% through connection h:1; a job from its other
  // connection h:2 is over the host's 50% share and waits behind b's job,
  // which needs the room.
  Admission a({{"cpu", 100}}, 16, absl::Seconds(10), Limits(0, 50));
  Slot h1, h2, b1;
  ASSERT_TRUE(a.Submit({.host_bytes = 50}, absl::InfiniteFuture(), h1.Callback(),
                       ClientId("h:1", "h")).ok());
  ASSERT_TRUE(h1.admitted());
  ASSERT_TRUE(a.Submit({.host_bytes = 60}, absl::InfiniteFuture(), b1.Callback(), "b").ok());
  ASSERT_TRUE(a.Submit({.host_bytes = 20}, absl::InfiniteFuture(), h2.Callback(),
                       ClientId("h:2", "h")).ok());
  EXPECT_FALSE(h2.done()) << "over the host's share while b waits for room";
  h1.Release();
  EXPECT_TRUE(b1.admitted());
  EXPECT_TRUE(h2.admitted());  // fits beside b1 and nobody else waits
  b1.Release();
  h2.Release();
  EXPECT_EQ(a.total_reserved(), 0);
}

TEST(AdmissionFairShare, NothingPassesAnOldHeadOverItsShare) {
  // One host's three jobs hold the whole budget (over its 50% share); its
  // next job waits at the head for room. Another job of the same connection
  // that fits what is free passes that head only while it is young.
  for (const bool old_head : {false, true}) {
    SCOPED_TRACE(old_head ? "head older than max_head_wait" : "young head");
    Admission a({{"cpu", 100}}, 16, old_head ? absl::ZeroDuration() : absl::Seconds(10),
                Limits(8, 50));
    const ClientId h("h:1", "h");
    Slot r1, r2, r3, head, small;
    for (Slot* r : {&r1, &r2, &r3}) {
      ASSERT_TRUE(a.Submit({.host_bytes = 30}, absl::InfiniteFuture(), r->Callback(), h).ok());
      ASSERT_TRUE(r->admitted());
    }
    ASSERT_TRUE(a.Submit({.host_bytes = 50}, absl::InfiniteFuture(), head.Callback(), h).ok());
    EXPECT_FALSE(head.done());
    ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), small.Callback(), h).ok());
    EXPECT_EQ(small.done(), !old_head) << "backfill past the head only while it is young";
    r1.Release();
    r2.Release();
    EXPECT_TRUE(head.admitted());
    EXPECT_TRUE(small.admitted());
    for (Slot* r : {&r3, &head, &small}) r->Release();
    EXPECT_EQ(a.total_reserved(), 0);
  }
}

TEST(AdmissionFairShare, FullQueueRefusesTheNewestJobOfTheClientWithTheMostWaiting) {
  Admission a({{"cpu", 10}}, 3, absl::Seconds(10), Limits(0));
  Slot running, hog[3], honest, hog_again;
  ASSERT_TRUE(a.Submit({.host_bytes = 10}, absl::InfiniteFuture(), running.Callback(), "x").ok());
  for (Slot& s : hog) {
    ASSERT_TRUE(a.Submit({.host_bytes = 5}, absl::InfiniteFuture(), s.Callback(), "hog").ok());
  }
  // The queue is full (3): the honest client's job takes the hog's newest place.
  ASSERT_TRUE(a.Submit({.host_bytes = 5}, absl::InfiniteFuture(), honest.Callback(), "h").ok());
  ASSERT_TRUE(hog[2].done());
  EXPECT_EQ(hog[2].code(), absl::StatusCode::kResourceExhausted);
  {
    std::lock_guard lock(hog[2].mu);
    const absl::Status& s = hog[2].result->status();
    EXPECT_TRUE(RetryPushbackMs(s).has_value());
    EXPECT_EQ(OutcomeOf(s), Outcome::kQueueFull);
  }
  EXPECT_FALSE(hog[0].done());
  EXPECT_FALSE(hog[1].done());
  EXPECT_EQ(a.queued(), 3);
  // The hog still has the most waiting (2 against 1): its next job is refused itself.
  auto t = a.Submit({.host_bytes = 5}, absl::InfiniteFuture(), hog_again.Callback(), "hog");
  EXPECT_EQ(t.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(RetryPushbackMs(t.status()).has_value());
  EXPECT_EQ(OutcomeOf(t.status()), Outcome::kQueueFull);
  running.Release();
  // Clients in turn: the honest job and the hog's first both fit (5 + 5).
  EXPECT_TRUE(honest.admitted());
  EXPECT_TRUE(hog[0].admitted());
  honest.Release();
  hog[0].Release();
  EXPECT_TRUE(hog[1].admitted());
  hog[1].Release();
  EXPECT_EQ(a.total_reserved(), 0);
  EXPECT_EQ(a.queued(), 0);
}

}  // namespace
}  // namespace dgmm
