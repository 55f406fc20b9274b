// JobSession (service/job/session.h): the cancel/admission race handled once,
// and the cancelled-or-deadline status, against an engine on a real CPU
// device whose small budget lets one job run while another queues.
#include "service/job/session.h"

#include <future>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "service/backends/cpu/cpu_device.h"
#include "service/rpc/server_info.h"

namespace dgmm {
namespace {

using Admission_ = absl::StatusOr<std::shared_ptr<ComputeStage>>;

class SessionTest : public ::testing::Test {
 protected:
  SessionTest() {
    EngineOptions o;
    // One 100x100 float32 unary job (80 KB and its diagonal) fits; two do not.
    o.host_memory_budget = Budget::Bytes(100000);
    auto e = Engine::Create(o, std::make_unique<CpuDevice>(1), {});
    EXPECT_TRUE(e.ok()) << e.status();
    engine_ = std::move(*e);
    job_.problem = Problem{100, 100, DType::kFloat32, Layout::kRowMajor, Side::kRight};
    job_.diagonal = absl::string_view(reinterpret_cast<const char*>(diag_.data()), 400);
  }

  std::shared_ptr<JobSession> NewSession(absl::Duration deadline_in = absl::Seconds(30)) {
    return std::make_shared<JobSession>(
        engine_.get(), CallInfo{.client = "test", .connection = "test:1", .token = "", .arrived = absl::Now(),
                                .deadline = absl::Now() + deadline_in});
  }

  // Starts `session`'s job; the future gets what admission gave it.
  std::future<Admission_> Start(const std::shared_ptr<JobSession>& session) {
    auto done = std::make_shared<std::promise<Admission_>>();
    std::future<Admission_> f = done->get_future();
    absl::Status s = session->Start(job_, JobMode::kWhole,
                                    [done](Admission_ a) { done->set_value(std::move(a)); });
    EXPECT_TRUE(s.ok()) << s;
    return f;
  }

  std::vector<float> diag_ = std::vector<float>(100, 2.0f);
  std::unique_ptr<Engine> engine_;
  JobRequest job_;
};

TEST_F(SessionTest, ACancelWhileQueuedEndsTheWaitWithCancelled) {
  auto first = NewSession();
  Admission_ running = Start(first).get();
  ASSERT_TRUE(running.ok()) << running.status();
  auto second = NewSession();
  std::future<Admission_> queued = Start(second);
  EXPECT_EQ(queued.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  second->Cancel();
  Admission_ ended = queued.get();
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kCancelled) << ended.status();
  EXPECT_TRUE(second->cancelled());
}

TEST_F(SessionTest, ACancelBeforeStartStillEndsTheQueuedJob) {
  auto first = NewSession();
  Admission_ running = Start(first).get();
  ASSERT_TRUE(running.ok());
  auto second = NewSession();
  second->Cancel();  // the client gave up before the ticket existed
  Admission_ ended = Start(second).get();
  EXPECT_EQ(ended.status().code(), absl::StatusCode::kCancelled) << ended.status();
}

TEST_F(SessionTest, AnAdmittedJobSeesItsCancelBetweenTiles) {
  auto session = NewSession();
  Admission_ admitted = Start(session).get();
  ASSERT_TRUE(admitted.ok());
  session->Cancel();
  std::vector<float> m(100 * 100, 1.0f);
  absl::Status s = (*admitted)->Process(reinterpret_cast<std::byte*>(m.data()), 0, 100,
                                        [&] { return session->cancelled(); });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
}

TEST_F(SessionTest, ACancelNearTheDeadlineIsTheDeadline) {
  EXPECT_EQ(NewSession(absl::Milliseconds(100))->cancelled_status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(NewSession(absl::Seconds(30))->cancelled_status().code(),
            absl::StatusCode::kCancelled);
}

TEST_F(SessionTest, TheReservationGoesBackWithTheStage) {
  {
    Admission_ admitted = Start(NewSession()).get();
    ASSERT_TRUE(admitted.ok());
    EXPECT_GT(engine_->total_reserved(), 0);
    (*admitted)->End(absl::OkStatus(), 0, 0);
  }
  EXPECT_EQ(engine_->total_reserved(), 0);
  EXPECT_EQ(DescribeServer(*engine_, nullptr).devices(0).completed_jobs(), 1);
}

TEST_F(SessionTest, ARefusalIsCountedOnce) {
  auto session = NewSession();
  session->Refuse(absl::InvalidArgumentError("bad"));
  EXPECT_EQ(DescribeServer(*engine_, nullptr).devices(0).rejected_jobs().at("invalid"), 1);
}

}  // namespace
}  // namespace dgmm
