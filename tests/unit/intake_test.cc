// The intake's one order of checks (service/job/intake.h) and its counting,
// against an engine on a real CPU device with a small host budget.
#include "service/job/intake.h"

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/backends/cpu/cpu_device.h"
#include "service/engine/engine.h"
#include "service/rpc/server_info.h"

namespace dgmm {
namespace {

constexpr int64_t kBudget = int64_t{1} << 20;  // 1 MiB of host memory

std::unique_ptr<Engine> SmallEngine() {
  EngineOptions o;
  o.host_memory_budget = Budget::Bytes(kBudget);
  o.limits.max_unary_message_bytes = int64_t{4} << 20;
  o.limits.max_block_bytes = int64_t{64} << 10;  // a stream's window: 512 KiB
  auto e = Engine::Create(o, std::make_unique<CpuDevice>(1), {});
  EXPECT_TRUE(e.ok()) << e.status();
  return std::move(*e);
}

v1::JobHeader Header(int64_t rows, int64_t cols) {
  v1::JobHeader h;
  h.set_rows(rows);
  h.set_cols(cols);
  h.set_dtype(v1::DTYPE_FLOAT32);
  h.set_side(v1::SIDE_RIGHT);
  h.mutable_diagonal()->assign(static_cast<size_t>(cols) * 4, '\1');
  return h;
}

int64_t Rejected(const Engine& e, const std::string& reason) {
  const v1::GetServerInfoResponse info = DescribeServer(e, nullptr);
  const auto& r = info.devices(0).rejected_jobs();
  auto it = r.find(reason);
  return it == r.end() ? 0 : it->second;
}

class IntakeTest : public ::testing::Test {
 protected:
  JobDraft Unary(const v1::JobHeader* header, int64_t message_bytes, int64_t matrix_bytes) {
    JobDraft d;
    d.kind = JobKind::kUnary;
    d.header = header;
    d.message_bytes = message_bytes;
    d.matrix_bytes = matrix_bytes;
    return d;
  }
  std::unique_ptr<Engine> engine_ = SmallEngine();
  Intake intake_{engine_.get(), /*regions=*/nullptr};
};

TEST_F(IntakeTest, AMessageOverTheLimitIsRefusedBeforeItsHeaderIsLookedAt) {
  v1::JobHeader bad;  // no shape: invalid
  IntakenJob out;
  absl::Status s = intake_.Check(Unary(&bad, int64_t{5} << 20, 0), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("--max_unary_message_bytes"), absl::string_view::npos) << s;
  EXPECT_EQ(Rejected(*engine_, "message_too_large"), 1);
  EXPECT_EQ(Rejected(*engine_, "invalid"), 0);
}

TEST_F(IntakeTest, AnUndecodableRequestIsInvalidOnceItsSizeIsFine) {
  JobDraft d = Unary(nullptr, 100, 0);
  d.decoded = absl::InvalidArgumentError("garbage");
  IntakenJob out;
  EXPECT_EQ(intake_.Check(d, &out).message(), "garbage");
  EXPECT_EQ(Rejected(*engine_, "invalid"), 1);
}

TEST_F(IntakeTest, TooLargeIsDecidedBeforeThePayloadIsChecked) {
  // 1024 x 1024 float32 needs 8 MiB of host memory: over the 1 MiB budget.
  // Its payload is also short, which must not be what the client hears.
  const v1::JobHeader h = Header(1024, 1024);
  IntakenJob out;
  absl::Status s = intake_.Check(Unary(&h, 1000, 12), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("--host_memory_budget"), absl::string_view::npos) << s;
  EXPECT_EQ(Rejected(*engine_, "too_large"), 1);
}

TEST_F(IntakeTest, AFittingJobWithAShortPayloadIsInvalid) {
  const v1::JobHeader h = Header(8, 8);
  IntakenJob out;
  absl::Status s = intake_.Check(Unary(&h, 1000, 8 * 8 * 4 - 4), &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("matrix payload"), absl::string_view::npos) << s;
}

TEST_F(IntakeTest, AValidJobPassesWithItsModeAndCountsNothing) {
  const v1::JobHeader h = Header(8, 8);
  IntakenJob out;
  ASSERT_TRUE(intake_.Check(Unary(&h, 1000, 8 * 8 * 4), &out).ok());
  EXPECT_EQ(out.mode, JobMode::kWhole);
  EXPECT_EQ(out.job.problem.rows, 8);
  EXPECT_EQ(out.job.diagonal.size(), 32u);
  const v1::GetServerInfoResponse info = DescribeServer(*engine_, nullptr);
  for (const auto& [reason, n] : info.devices(0).rejected_jobs()) {
    EXPECT_EQ(n, 0) << reason;
  }
}

TEST_F(IntakeTest, ARefusedPartOfAJobGroupIsCountedAsAGroupPart) {
  // Too large, on the unary path: the stream path counted such parts, the
  // unary one did not.
  v1::JobHeader h = Header(1024, 1024);
  v1::JobGroup* g = h.mutable_group();
  g->set_id("g1");
  g->set_first_line(0);
  g->set_total_lines(2048);
  g->set_parts(2);
  IntakenJob out;
  ASSERT_FALSE(intake_.Check(Unary(&h, 1000, 1024 * 1024 * 4), &out).ok());
  EXPECT_EQ(engine_->metrics().GroupParts()["too_large"], 1);
}

TEST_F(IntakeTest, AStreamIsCheckedForFitButNotForAPayload) {
  const v1::JobHeader fits = Header(8, 8);
  JobDraft d;
  d.kind = JobKind::kStream;
  d.header = &fits;
  IntakenJob out;
  ASSERT_TRUE(intake_.Check(d, &out).ok());
  EXPECT_EQ(out.mode, JobMode::kStreamed);
  // Lines over a block cannot stream: refused at the header.
  const v1::JobHeader wide = Header(1, 32768);
  d.header = &wide;
  IntakenJob out2;
  EXPECT_EQ(intake_.Check(d, &out2).code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(IntakeTest, RegionJobsOnAServerWithoutRegionsAreRefusedFirst) {
  v1::MultiplyRegionRequest r;  // no refs and no header: both wrong
  JobDraft d;
  d.kind = JobKind::kRegion;
  d.header = &r.header();
  d.region = &r;
  IntakenJob out;
  EXPECT_EQ(intake_.Check(d, &out).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace dgmm
