// The block pipeline against a fake transport and a manual worker queue, no
// server: every interleaving below is driven step by step.
#include "service/pipeline/block_pipeline.h"

#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "service/core/outcome.h"

namespace dgmm {
namespace {

// A block message as a client would send it: first_line, a payload, and a
// few bytes of framing.
class FakeMessage : public BlockMessage {
 public:
  FakeMessage(int64_t first_line, std::string payload, bool is_header = false)
      : first_line_(first_line), payload_(std::move(payload)), is_header_(is_header) {}
  size_t size() const override { return payload_.size() + 12; }
  absl::StatusOr<Decoded> Decode(const Place& place) override {
    if (is_header_) return absl::InvalidArgumentError("a second header arrived");
    absl::StatusOr<void*> to = place(first_line_, payload_.size());
    if (!to.ok()) return to.status();
    if (*to != nullptr) std::memcpy(*to, payload_.data(), payload_.size());
    return Decoded{first_line_, payload_.size()};
  }

 private:
  int64_t first_line_;
  std::string payload_;
  bool is_header_;
};

struct FakeIo : PipelineIo {
  int reads_started = 0;
  int reads_outstanding = 0;
  std::deque<OutBlock> writes;  // started, not yet completed
  std::vector<std::pair<int64_t, std::string>> written;
  std::vector<absl::Status> finished;
  void StartRead() override {
    reads_started++;
    reads_outstanding++;
  }
  void StartWrite(OutBlock block) override { writes.push_back(std::move(block)); }
  void Finish(const absl::Status& s) override { finished.push_back(s); }
};

// Multiplies float32 payloads by 2; can run a hook inside Process.
struct DoublingStage : BlockStage {
  std::function<void()> inside_process;
  int processed = 0;
  int ended = 0;
  bool ended_inside_process = false;
  absl::Status outcome;
  int64_t bytes_in = 0, bytes_out = 0;
  bool in_process = false;
  int64_t cols = 0;
  // A promoted job (float32 A, float64 C): C = 2 A, widened.
  absl::Status ProcessInto(const std::byte* in, std::byte* out, int64_t, int64_t lines,
                           const CancelFn& cancelled) override {
    const auto* a = reinterpret_cast<const float*>(in);
    auto* c = reinterpret_cast<double*>(out);
    for (int64_t i = 0; i < lines * cols; ++i) c[i] = 2.0 * static_cast<double>(a[i]);
    processed++;
    return cancelled() ? absl::CancelledError("cancelled") : absl::OkStatus();
  }
  absl::Status Process(std::byte* data, int64_t, int64_t lines, const CancelFn& cancelled) override {
    in_process = true;
    if (inside_process) inside_process();
    auto* f = reinterpret_cast<float*>(data);
    for (int64_t i = 0; i < lines * cols; ++i) f[i] *= 2;
    in_process = false;
    processed++;
    return cancelled() ? absl::CancelledError("cancelled") : absl::OkStatus();
  }
  void End(const absl::Status& s, int64_t in, int64_t out) override {
    if (in_process) ended_inside_process = true;
    ended++;
    outcome = s;
    bytes_in = in;
    bytes_out = out;
  }
};

class BlockPipelineTest : public ::testing::Test {
 protected:
  void Make(int64_t rows, int64_t cols, int64_t max_block_bytes,
            std::optional<DType> result_dtype = std::nullopt) {
    problem_.rows = rows;
    problem_.cols = cols;
    problem_.dtype = DType::kFloat32;
    problem_.result_dtype = result_dtype;
    problem_.layout = Layout::kRowMajor;
    problem_.side = Side::kRight;
    stage_ = std::make_shared<DoublingStage>();
    stage_->cols = cols;
    BlockPipeline::Options o;
    o.max_block_bytes = max_block_bytes;
    pipeline_ = std::make_shared<BlockPipeline>(
        problem_, o, pool_.get(), [this](std::function<void()> fn) { tasks_.push_back(fn); },
        stage_, &io_);
    pipeline_->Start();
  }
  // Rows [first, first + n) of the test matrix: element (i, j) = i * 1000 + j.
  std::string Rows(int64_t first, int64_t n) const {
    std::vector<float> v;
    for (int64_t i = first; i < first + n; ++i) {
      for (int64_t j = 0; j < problem_.cols; ++j) v.push_back(static_cast<float>(i * 1000 + j));
    }
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  void Deliver(int64_t first, int64_t n) {
    ASSERT_GT(io_.reads_outstanding, 0) << "no read was started";
    io_.reads_outstanding--;
    pipeline_->OnMessage(std::make_unique<FakeMessage>(first, Rows(first, n)));
  }
  void RunTasks() {
    while (!tasks_.empty()) {
      auto fn = std::move(tasks_.front());
      tasks_.pop_front();
      fn();
    }
  }
  // Completes the oldest started write, recording what it carried.
  void CompleteWrite(const absl::Status& s = absl::OkStatus()) {
    ASSERT_FALSE(io_.writes.empty());
    OutBlock b = std::move(io_.writes.front());
    io_.writes.pop_front();
    io_.written.emplace_back(b.first_line,
                             std::string(reinterpret_cast<const char*>(b.buffer.data()), b.bytes));
    pipeline_->OnWriteDone(s);
  }

  // Every row, 4 a message, as fast as reads are started; pending tasks run
  // every third step and a write completes every `write_every` steps (or
  // when nothing else can move); then the half-close, which must end OK.
  void SendAllTakingResultsNowAndThen(int64_t rows, int write_every) {
    int64_t next = 0;
    int steps = 0;
    while (next < rows || !io_.writes.empty() || !tasks_.empty()) {
      if (io_.reads_outstanding > 0 && next < rows) {
        Deliver(next, 4);
        next += 4;
      }
      if (++steps % 3 == 0) RunTasks();
      if (steps % write_every == 0 && !io_.writes.empty()) CompleteWrite();
      if (io_.reads_outstanding == 0 && tasks_.empty() && next < rows) {
        if (!io_.writes.empty()) CompleteWrite();
      }
      ASSERT_LT(steps, 100000);
    }
    io_.reads_outstanding--;
    pipeline_->OnHalfClose();
    ASSERT_EQ(io_.finished.size(), 1u);
    EXPECT_TRUE(io_.finished[0].ok()) << io_.finished[0];
  }

  Problem problem_;
  std::shared_ptr<HostBufferPool> pool_ = HostBufferPool::CreateMapped(int64_t{1} << 20);
  std::deque<std::function<void()>> tasks_;
  FakeIo io_;
  std::shared_ptr<DoublingStage> stage_;
  std::shared_ptr<BlockPipeline> pipeline_;
};

TEST_F(BlockPipelineTest, EveryBlockIsComputedInOrderAndTheCallFinishesOk) {
  Make(10, 4, 3 * 16);  // three rows of 16 bytes per block
  for (int64_t first = 0; first < 10; first += 3) {
    Deliver(first, std::min<int64_t>(3, 10 - first));
    RunTasks();
    CompleteWrite();
  }
  io_.reads_outstanding--;
  pipeline_->OnHalfClose();
  ASSERT_EQ(io_.finished.size(), 1u);
  EXPECT_TRUE(io_.finished[0].ok()) << io_.finished[0];
  EXPECT_EQ(stage_->ended, 1);
  EXPECT_TRUE(stage_->outcome.ok());
  EXPECT_EQ(stage_->bytes_in, 10 * 16);
  EXPECT_EQ(stage_->bytes_out, 10 * 16);
  ASSERT_EQ(io_.written.size(), 4u);
  for (const auto& [first, data] : io_.written) {
    const auto* f = reinterpret_cast<const float*>(data.data());
    for (size_t k = 0; k < data.size() / 4; ++k) {
      const int64_t i = first + static_cast<int64_t>(k) / 4, j = static_cast<int64_t>(k) % 4;
      EXPECT_EQ(f[k], 2.0f * static_cast<float>(i * 1000 + j)) << "row " << i << " col " << j;
    }
  }
}

TEST_F(BlockPipelineTest, CancelWhileABlockComputesEndsTheStageOnlyAfterProcessReturns) {
  Make(6, 4, 3 * 16);
  stage_->inside_process = [this] {
    pipeline_->Fail(absl::CancelledError("the client cancelled the call"));
    EXPECT_EQ(stage_->ended, 0) << "End ran while Process was still working";
  };
  Deliver(0, 3);
  RunTasks();
  EXPECT_FALSE(stage_->ended_inside_process);
  EXPECT_EQ(stage_->ended, 1);
  EXPECT_EQ(stage_->outcome.code(), absl::StatusCode::kCancelled);
  ASSERT_EQ(io_.finished.size(), 1u);
  EXPECT_EQ(io_.finished[0].code(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(io_.writes.empty()) << "a block was written after the cancel";
}

TEST_F(BlockPipelineTest, IdleTimeoutWhileAWriteIsPendingFinishesOnceTheWriteIsDone) {
  Make(6, 4, 3 * 16);
  Deliver(0, 3);
  RunTasks();
  ASSERT_EQ(io_.writes.size(), 1u);  // the result is on its way out
  pipeline_->Fail(absl::DeadlineExceededError("no block received for 120s"));
  EXPECT_EQ(stage_->ended, 1);
  EXPECT_TRUE(io_.finished.empty()) << "finished with a write in flight";
  CompleteWrite();
  ASSERT_EQ(io_.finished.size(), 1u);
  EXPECT_EQ(io_.finished[0].code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(BlockPipelineTest, AWriteThatFailsAfterAnErrorFinishesOnceWithTheFirstError) {
  Make(6, 4, 3 * 16);
  Deliver(0, 3);
  RunTasks();
  pipeline_->Fail(absl::InvalidArgumentError("first"));
  CompleteWrite(absl::CancelledError("second"));
  pipeline_->Fail(absl::InternalError("third"));
  ASSERT_EQ(io_.finished.size(), 1u);
  EXPECT_EQ(io_.finished[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stage_->ended, 1);
  EXPECT_EQ(stage_->outcome.message(), "first");
}

TEST_F(BlockPipelineTest, HalfCloseBeforeEveryLineIsInvalidArgument) {
  Make(9, 4, 3 * 16);
  Deliver(0, 3);
  RunTasks();
  CompleteWrite();
  io_.reads_outstanding--;
  pipeline_->OnHalfClose();
  ASSERT_EQ(io_.finished.size(), 1u);
  EXPECT_EQ(io_.finished[0].code(), absl::StatusCode::kInvalidArgument) << io_.finished[0];
  EXPECT_EQ(stage_->ended, 1);
  EXPECT_FALSE(stage_->outcome.ok());
}

TEST_F(BlockPipelineTest, HeldBlocksNeverExceedTheWindowNorHostFootprint) {
  const int64_t block = 4096;
  Make(4096, 256, block);  // 1 KiB rows, 4 rows a block
  // The client sends as fast as it may; results are taken only now and then.
  ASSERT_NO_FATAL_FAILURE(SendAllTakingResultsNowAndThen(4096, 7));
  EXPECT_EQ(pipeline_->peak_window(), kStreamWindowBlocks);
  const int64_t footprint = HostFootprint(problem_, JobMode::kStreamed, block);
  std::printf("peak held %lld bytes of a %lld-byte footprint\n",
              static_cast<long long>(pipeline_->peak_held_bytes()),
              static_cast<long long>(footprint));
  EXPECT_LE(pipeline_->peak_held_bytes(), footprint);
  EXPECT_GT(pipeline_->peak_held_bytes(), footprint / 3) << "the window was never used";
}

// A promoted stream (float32 A, float64 C): each result block carries C's
// bytes for its lines, computed into a buffer of its own, and what the
// pipeline held (A's and C's buffers together while one is computed
// counted) stays within the streamed footprint, which counts C's blocks.
TEST_F(BlockPipelineTest, APromotedStreamSendsCsBytesWithinItsFootprint) {
  const int64_t block = 4096;
  Make(1024, 256, block, DType::kFloat64);  // 1 KiB rows of A, 2 KiB of C
  ASSERT_NO_FATAL_FAILURE(SendAllTakingResultsNowAndThen(1024, 5));
  int64_t lines = 0;
  for (const auto& [first, bytes] : io_.written) {
    ASSERT_EQ(bytes.size() % (256 * sizeof(double)), 0u);
    const auto* c = reinterpret_cast<const double*>(bytes.data());
    const int64_t n = static_cast<int64_t>(bytes.size() / (256 * sizeof(double)));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < 256; ++j) {
        ASSERT_EQ(c[i * 256 + j], 2.0 * static_cast<double>((first + i) * 1000 + j));
      }
    }
    lines += n;
  }
  EXPECT_EQ(lines, 1024);
  EXPECT_EQ(stage_->bytes_out, 1024 * 256 * 8);
  const int64_t footprint = HostFootprint(problem_, JobMode::kStreamed, block);
  EXPECT_LE(pipeline_->peak_held_bytes(), footprint);
  // At least one moment with a block of A (4 KiB) and its C (8 KiB) held.
  EXPECT_GE(pipeline_->peak_held_bytes(), block + 2 * block);
}

TEST_F(BlockPipelineTest, AnOversizedMessageIsRefusedAsItArrives) {
  Make(100, 4, 3 * 16);
  io_.reads_outstanding--;
  pipeline_->OnMessage(std::make_unique<FakeMessage>(0, std::string(100 << 10, '\0')));
  ASSERT_EQ(io_.finished.size(), 1u);
  EXPECT_EQ(io_.finished[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(OutcomeOf(io_.finished[0]), Outcome::kMessageTooLarge);
  EXPECT_TRUE(tasks_.empty()) << "an oversized message was queued";
}

TEST_F(BlockPipelineTest, ASecondHeaderEndsTheCall) {
  Make(6, 4, 3 * 16);
  io_.reads_outstanding--;
  pipeline_->OnMessage(std::make_unique<FakeMessage>(0, "", /*is_header=*/true));
  RunTasks();
  ASSERT_EQ(io_.finished.size(), 1u);
  EXPECT_EQ(io_.finished[0].code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(stage_->ended, 1);
}

TEST_F(BlockPipelineTest, TheTransportGoingAwayEndsTheStageOnce) {
  Make(6, 4, 3 * 16);
  Deliver(0, 3);
  pipeline_->DetachIo();  // gRPC's OnDone before the block was computed
  RunTasks();
  EXPECT_EQ(stage_->ended, 1);
  EXPECT_TRUE(io_.finished.empty());
}

}  // namespace
}  // namespace dgmm
