// small_job_bench: the C++ client's rate for small jobs (1x1 and 100x100
// float32, Multiply) against an empty RPC (a grpc.health.v1 Check) on the
// same Client, at 1 and 8 threads sharing that Client (issue 26, "Small
// jobs"). Each measurement runs for --seconds after a warm-up; the ratios
// are printed next to the target (1x1 jobs >= 0.8 x the empty-RPC rate).
//
//   small_job_bench --server=127.0.0.1:50051 --threads=1,8 --seconds=3
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "dgmm/client.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "dgmm-server address");
ABSL_FLAG(std::string, threads, "1,8", "threads sharing one Client");
ABSL_FLAG(double, seconds, 3, "seconds per measurement (after 0.5 s of warm-up)");

namespace {

// Calls per second of `call` from `threads` threads for `seconds`.
double Rate(int threads, double seconds, const std::function<bool()>& call) {
  std::atomic<bool> measuring{false}, stop{false}, failed{false};
  std::atomic<int64_t> calls{0};
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&] {
      while (!stop.load()) {
        if (!call()) failed = true;
        if (measuring.load()) calls.fetch_add(1);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  measuring = true;
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const int64_t n = calls.load();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  stop = true;
  for (std::thread& t : pool) t.join();
  if (failed.load()) std::fprintf(stderr, "small_job_bench: some calls failed\n");
  return static_cast<double>(n) / dt;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  dgmm::Client client(absl::GetFlag(FLAGS_server));
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::printf("| threads | empty RPC (health Check) /s | 1x1 job /s | ratio | 100x100 job /s | ratio "
              "| target 1x1 >= 0.8 x empty |\n|---|---|---|---|---|---|---|\n");
  bool all_met = true;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int threads = 0;
    if (!absl::SimpleAtoi(part, &threads) || threads < 1) return 2;
    const double empty = Rate(threads, seconds, [&] { return client.Health().ok(); });
    const auto job_rate = [&](int64_t n) {
      return Rate(threads, seconds, [&client, n] {
        thread_local std::vector<float> a, d, c;
        a.assign(static_cast<size_t>(n * n), 1.5f);
        d.assign(static_cast<size_t>(n), 2.0f);
        c.resize(a.size());
        dgmm::Job job;
        job.matrix = {a.data(), n, n, dgmm::v1::DTYPE_FLOAT32, dgmm::v1::LAYOUT_ROW_MAJOR};
        job.diagonal = d.data();
        job.diagonal_bytes = d.size() * sizeof(float);
        return client.Multiply(job, c.data(), c.size() * sizeof(float)).ok() && c[0] == 3.0f;
      });
    };
    const double one = job_rate(1);
    const double hundred = job_rate(100);
    const bool met = one >= 0.8 * empty;
    all_met = all_met && met;
    std::printf("| %d | %.0f | %.0f | %.2f | %.0f | %.2f | %s |\n", threads, empty, one,
                one / empty, hundred, hundred / empty, met ? "MET" : "MISSED");
    std::fflush(stdout);
  }
  return all_met ? 0 : 3;
}
