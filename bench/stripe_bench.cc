// stripe_bench: striped jobs through dgmm::Client against a running
// dgmm-server (bench/stripe_bench.sh starts the server and iperf3 and makes
// the table). For each N, one random float32 N x N row-major matrix is made
// once; then for each K of --stripes (0 = the client's auto choice) a Client
// with ClientOptions.stripes = K runs one warm-up job (which also opens its K
// connections) and --reps timed jobs. The first timed job's result is
// checked element by element against a float64 reference; the output is
// poisoned with NaN before every job. Prints one CSV line per (N, K):
//   n,k_option,k_used,mode,reps,median_s,best_s,gbps_in_out,attempts,checked,max_rel_err
// gbps_in_out = 2 x matrix bytes / median wall time of Client::Multiply.
//
// For profiling (perf attached to both processes): --check=false and --poison=false
// leave the client's own work out of the timed jobs, and --ready_file /
// --go_file make it wait, after its warm-up job, until a profiler attached
// (it writes its pid to --ready_file, then polls for --go_file); after the
// timed jobs it does the same with --ready_file + ".done", so that its
// threads can be read before it exits.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <sys/stat.h>
#include <unistd.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "dgmm/client.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "Server address or gRPC target.");
ABSL_FLAG(std::string, lb, "", "load_balancing_policy (round_robin for several replicas).");
ABSL_FLAG(std::string, sizes, "10000,20000", "N values.");
ABSL_FLAG(std::string, stripes, "1,2,4,8,0", "K values; 0 = auto.");
ABSL_FLAG(int, reps, 3, "Timed jobs per (N, K); the median is reported.");
ABSL_FLAG(std::string, backend, "auto", "Backend hint: auto, cpu, cuda-kernel, cublas.");
ABSL_FLAG(bool, check, true, "Check the first timed job's result against float64.");
ABSL_FLAG(bool, poison, true, "Fill the output with NaN before every job.");
ABSL_FLAG(std::string, ready_file, "",
          "After each (N, K)'s warm-up job, write this process's pid here and wait for --go_file; "
          "after its timed jobs, the same with this name + \".done\".");
ABSL_FLAG(std::string, go_file, "", "See --ready_file; removed once seen.");

namespace {

std::vector<int64_t> ParseList(const std::string& s) {
  std::vector<int64_t> out;
  for (absl::string_view part : absl::StrSplit(s, ',', absl::SkipEmpty())) {
    int64_t v = 0;
    if (absl::SimpleAtoi(part, &v)) out.push_back(v);
  }
  return out;
}

// With --ready_file: writes this process's pid to `file` (atomically), then
// waits until --go_file exists and removes it. Nothing when `file` is empty.
void HoldFor(const std::string& file) {
  if (file.empty()) return;
  const std::string go = absl::GetFlag(FLAGS_go_file);
  {
    std::ofstream(file + ".tmp") << getpid() << "\n";
  }
  std::rename((file + ".tmp").c_str(), file.c_str());
  struct stat st;
  while (!go.empty() && stat(go.c_str(), &st) != 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  std::remove(go.c_str());
}
}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  dgmm::ConfigureGrpcForQuickExit();
  absl::StatusOr<dgmm::v1::Backend> backend = dgmm::ParseBackendName(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) {
    std::fprintf(stderr, "%s\n", std::string(backend.status().message()).c_str());
    return 2;
  }
  const int reps = std::max(1, absl::GetFlag(FLAGS_reps));
  std::printf("n,k_option,k_used,mode,reps,median_s,best_s,gbps_in_out,attempts,checked,max_rel_err\n");
  std::fflush(stdout);
  for (int64_t n : ParseList(absl::GetFlag(FLAGS_sizes))) {
    const size_t count = static_cast<size_t>(n * n);
    std::vector<float> a(count), d(static_cast<size_t>(n)), c(count);
    {
      // Random values in [0.5, 2), made in parallel (std::thread only).
      const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
      std::vector<std::thread> pool;
      for (unsigned t = 0; t < threads; ++t) {
        pool.emplace_back([&, t] {
          std::mt19937_64 rng(1234 + t);
          std::uniform_real_distribution<float> u(0.5f, 2.0f);
          for (size_t i = t; i < count; i += threads) a[i] = u(rng);
        });
      }
      for (auto& th : pool) th.join();
      std::mt19937_64 rng(99);
      std::uniform_real_distribution<float> u(0.5f, 2.0f);
      for (float& x : d) x = u(rng);
    }
    dgmm::Job job;
    job.matrix = {a.data(), n, n, dgmm::v1::DTYPE_FLOAT32, dgmm::v1::LAYOUT_ROW_MAJOR};
    job.diagonal = d.data();
    job.diagonal_bytes = d.size() * sizeof(float);
    job.side = dgmm::v1::SIDE_RIGHT;
    job.backend = *backend;
    const double bytes = static_cast<double>(count * sizeof(float));
    for (int64_t k : ParseList(absl::GetFlag(FLAGS_stripes))) {
      dgmm::ClientOptions options;
      options.stripes = static_cast<int>(k);
      options.load_balancing_policy = absl::GetFlag(FLAGS_lb);
      dgmm::Client client(absl::GetFlag(FLAGS_target), options);
      auto run = [&](dgmm::JobResult* result) {
        if (absl::GetFlag(FLAGS_poison)) {
          std::fill(c.begin(), c.end(), std::numeric_limits<float>::quiet_NaN());
        }
        const auto t0 = std::chrono::steady_clock::now();
        absl::StatusOr<dgmm::JobResult> r = client.Multiply(job, c.data(), c.size() * 4);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!r.ok()) {
          std::fprintf(stderr, "N=%lld K=%lld: %s\n", static_cast<long long>(n),
                       static_cast<long long>(k), r.status().ToString().c_str());
          return -1.0;
        }
        *result = *r;
        return s;
      };
      dgmm::JobResult result;
      if (run(&result) < 0) return 1;  // warm-up: connections open
      HoldFor(absl::GetFlag(FLAGS_ready_file));
      std::vector<double> times;
      int attempts = 0;
      bool checked = absl::GetFlag(FLAGS_check);
      double worst = 0;
      for (int i = 0; i < reps; ++i) {
        const double s = run(&result);
        if (s < 0) return 1;
        times.push_back(s);
        attempts += result.attempts;
        if (i == 0 && absl::GetFlag(FLAGS_check)) {
          for (int64_t r = 0; r < n; ++r) {
            for (int64_t col = 0; col < n; ++col) {
              const size_t idx = static_cast<size_t>(r * n + col);
              const double ref = static_cast<double>(a[idx]) * static_cast<double>(d[static_cast<size_t>(col)]);
              const double err = std::fabs(static_cast<double>(c[idx]) - ref) / ref;
              if (!(err <= worst)) worst = std::isnan(err) ? INFINITY : err;
            }
          }
          checked = worst <= 1e-6;
        }
      }
      std::vector<double> sorted = times;
      std::sort(sorted.begin(), sorted.end());
      const double median = sorted[sorted.size() / 2];
      std::printf("%lld,%lld,%d,%s,%d,%.4f,%.4f,%.3f,%d,%s,%.3g\n", static_cast<long long>(n),
                  static_cast<long long>(k), result.stripes, dgmm::TransferModeName(result.mode),
                  reps, median, sorted.front(), 2.0 * bytes / median / 1e9, attempts,
                  !absl::GetFlag(FLAGS_check) ? "skipped" : checked ? "true" : "false", worst);
      std::fflush(stdout);
      HoldFor(absl::GetFlag(FLAGS_ready_file).empty() ? ""
                                                      : absl::GetFlag(FLAGS_ready_file) + ".done");
    }
  }
  return 0;
}
