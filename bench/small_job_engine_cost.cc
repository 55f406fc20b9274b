// small_job_engine_cost: what a small Multiply job costs the server apart
// from its RPC (issue 26, the batched-call estimate): a UnaryJob with an
// in-memory request and call, through the same intake, session, admission,
// engine (run on this thread) and end as a gRPC job, K times on one thread.
// A batch of N such jobs in one message would cost about one RPC plus N of
// these (plus decoding and encoding N headers and results).
//
//   small_job_engine_cost --n=1 --jobs=200000
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "service/backends/cpu/cpu_device.h"
#include "service/job/unary_job.h"

ABSL_FLAG(int64_t, n, 1, "the jobs' N (N x N float32)");
ABSL_FLAG(int64_t, jobs, 200000, "jobs to run");

namespace dgmm {
namespace {

class Request final : public UnaryRequest {
 public:
  Request(const v1::JobHeader* header, const std::vector<float>* matrix)
      : header_(header), matrix_(matrix) {}
  int64_t size() const override { return static_cast<int64_t>(matrix_->size() * 4 + 64); }
  absl::Status Peek(const v1::JobHeader** header, int64_t* matrix_bytes) override {
    *header = header_;
    *matrix_bytes = static_cast<int64_t>(matrix_->size() * 4);
    return absl::OkStatus();
  }
  absl::Status CopyMatrix(std::byte* dst, int64_t bytes) override {
    std::memcpy(dst, matrix_->data(), static_cast<size_t>(bytes));
    return absl::OkStatus();
  }

 private:
  const v1::JobHeader* header_;
  const std::vector<float>* matrix_;
};

class Io final : public UnaryIo {
 public:
  void StartRead() override {}
  void Reply(HostBuffer result, size_t bytes, const v1::JobStats&) override {
    ok = bytes > 0 && reinterpret_cast<const float*>(result.data())[0] == 3.0f;
  }
  void Fail(const absl::Status& s) override { std::fprintf(stderr, "failed: %s\n", s.ToString().c_str()); }
  void CancelCall() override {}
  bool ok = false;
};

int Main() {
  const int64_t n = absl::GetFlag(FLAGS_n);
  const int64_t jobs = absl::GetFlag(FLAGS_jobs);
  auto engine = Engine::Create(EngineOptions{}, std::make_unique<CpuDevice>(0), {});
  if (!engine.ok()) return 1;
  Intake intake(engine->get(), nullptr);
  ReceiveGate gate(int64_t{256} << 20, 64);
  std::vector<float> matrix(static_cast<size_t>(n * n), 1.5f), diag(static_cast<size_t>(n), 2.0f);
  v1::JobHeader header;
  header.set_rows(n);
  header.set_cols(n);
  header.set_dtype(v1::DTYPE_FLOAT32);
  header.set_side(v1::SIDE_RIGHT);
  header.set_diagonal(std::string(reinterpret_cast<const char*>(diag.data()), diag.size() * 4));
  int64_t ok = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < jobs; ++i) {
    Io io;
    auto job = std::make_shared<UnaryJob>(
        std::make_shared<JobSession>(engine->get(),
                                     CallInfo{.client = "bench", .connection = "bench:1",
                                              .token = "", .arrived = absl::Now(),
                                              .deadline = absl::Now() + absl::Seconds(60)}),
        &intake, &gate, StreamTimeouts{}, &io);
    job->Begin();
    job->OnRequest(std::make_unique<Request>(&header, &matrix), false);
    job->Detach();
    ok += io.ok ? 1 : 0;
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%lldx%lld float32: %lld jobs (%lld ok) in %.3f s: %.2f us per job, %.0f jobs/s on one thread\n",
              static_cast<long long>(n), static_cast<long long>(n), static_cast<long long>(jobs),
              static_cast<long long>(ok), s, s * 1e6 / static_cast<double>(jobs),
              static_cast<double>(jobs) / s);
  return ok == jobs ? 0 : 1;
}

}  // namespace
}  // namespace dgmm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return dgmm::Main();
}
