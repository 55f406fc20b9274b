// small_job_bench: the C++ client's rate for small jobs (1x1 and 100x100
// float32, Multiply) against an empty RPC (a grpc.health.v1 Check) on the
// same Client, at 1 and 8 threads sharing that Client . Each measurement runs for --seconds after a warm-up; the ratios
// are printed next to the target (1x1 jobs >= 0.8 x the empty-RPC rate).
//
//   small_job_bench --server=127.0.0.1:50051 --threads=1,8 --seconds=3
//
// --batch=1,16,256 adds the batched call (MultiplyBatch):
// jobs per second for 1x1 and 100x100 float32 jobs sent B at a time, next
// to the per-job Multiply rate and the empty RPC of the same run and thread
// count, with MET or MISSED for "batched wins by more than 2x over per-job"
// (at every B of 16 or more and every thread count, for each job size).
// --batch= skips it.
//
// With --server_pid (the server on this host), a second table gives the CPU
// time and the thread switches (voluntary and not, all threads) per call of
// the server and of this client process: figures that the other processes
// of a busy machine disturb much less than the rates.
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
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
ABSL_FLAG(std::string, batch, "1,16,256",
          "jobs per MultiplyBatch call for the batched table; empty: none");
ABSL_FLAG(int, server_pid, 0, "the server's pid, for its CPU time and switches per call");
ABSL_FLAG(double, loop_1x1_seconds, 0,
          "if > 0: only run 1x1 jobs on one thread for this long and print their rate (a load "
          "to profile the server under, e.g. with perf record -p)");

namespace {

// CPU time (s) and thread switches of process `pid`, all threads (those
// alive now; the server's and the client's threads live for the whole run).
struct Usage {
  double cpu_s = 0;
  int64_t switches = 0;
};

Usage UsageOf(int pid) {
  Usage u;
  const std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return u;
  const double tick = static_cast<double>(sysconf(_SC_CLK_TCK));
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] == '.') continue;
    const std::string task = dir + "/" + e->d_name;
    std::ifstream stat(task + "/stat");
    std::string line;
    std::getline(stat, line);
    const size_t paren = line.rfind(')');
    if (paren != std::string::npos) {
      // Fields after the command: state is field 3; utime, stime are 14, 15.
      std::istringstream rest(line.substr(paren + 2));
      std::string field;
      double utime = 0, stime = 0;
      for (int i = 3; i <= 15 && rest >> field; ++i) {
        if (i == 14) utime = std::stod(field);
        if (i == 15) stime = std::stod(field);
      }
      u.cpu_s += (utime + stime) / tick;
    }
    std::ifstream status(task + "/status");
    while (std::getline(status, line)) {
      if (line.rfind("voluntary_ctxt_switches:", 0) == 0 ||
          line.rfind("nonvoluntary_ctxt_switches:", 0) == 0) {
        u.switches += std::stoll(line.substr(line.find(':') + 1));
      }
    }
  }
  closedir(d);
  return u;
}

// Per call of one measurement: CPU microseconds and switches, server and
// client.
struct PerCall {
  double server_us = 0, server_switches = 0, client_us = 0, client_switches = 0;
};

// Calls per second of `call` from `threads` threads for `seconds`.
double Rate(int threads, double seconds, const std::function<bool()>& call,
            PerCall* per_call) {
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
  const int server_pid = absl::GetFlag(FLAGS_server_pid);
  const Usage server0 = server_pid > 0 ? UsageOf(server_pid) : Usage();
  const Usage client0 = UsageOf(getpid());
  measuring = true;
  const auto t0 = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  const int64_t n = calls.load();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const Usage server1 = server_pid > 0 ? UsageOf(server_pid) : Usage();
  const Usage client1 = UsageOf(getpid());
  if (n > 0) {
    const double calls_n = static_cast<double>(n);
    per_call->server_us = (server1.cpu_s - server0.cpu_s) * 1e6 / calls_n;
    per_call->server_switches = static_cast<double>(server1.switches - server0.switches) / calls_n;
    per_call->client_us = (client1.cpu_s - client0.cpu_s) * 1e6 / calls_n;
    per_call->client_switches = static_cast<double>(client1.switches - client0.switches) / calls_n;
  }
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
  if (const double loop = absl::GetFlag(FLAGS_loop_1x1_seconds); loop > 0) {
    float a = 1.5f, d = 2.0f, c = 0;
    dgmm::Job job;
    job.matrix = {&a, 1, 1, dgmm::v1::DTYPE_FLOAT32, dgmm::v1::LAYOUT_ROW_MAJOR};
    job.diagonal = &d;
    job.diagonal_bytes = sizeof(float);
    int64_t n = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const auto end = t0 + std::chrono::duration<double>(loop);
    while (std::chrono::steady_clock::now() < end) {
      if (!client.Multiply(job, &c, sizeof(c)).ok() || c != 3.0f) return 1;
      ++n;
    }
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("1x1 jobs, one thread: %lld in %.2f s, %.0f/s\n", static_cast<long long>(n), dt,
                static_cast<double>(n) / dt);
    return 0;
  }
  std::printf("| threads | empty RPC (health Check) /s | 1x1 job /s | ratio | 100x100 job /s | ratio "
              "| target 1x1 >= 0.8 x empty |\n|---|---|---|---|---|---|---|\n");
  bool all_met = true;
  std::string costs =
      "\n| threads | call | server CPU us/call | server switches/call | client CPU us/call | "
      "client switches/call |\n|---|---|---|---|---|---|\n";
  const auto cost_row = [&costs](int threads, const char* what, const PerCall& p) {
    char row[256];
    std::snprintf(row, sizeof(row), "| %d | %s | %.1f | %.2f | %.1f | %.2f |\n", threads, what,
                  p.server_us, p.server_switches, p.client_us, p.client_switches);
    costs += row;
  };
  std::vector<int> batch_sizes;
  for (absl::string_view part :
       absl::StrSplit(absl::GetFlag(FLAGS_batch), ',', absl::SkipEmpty())) {
    int b = 0;
    if (!absl::SimpleAtoi(part, &b) || b < 1) return 2;
    batch_sizes.push_back(b);
  }
  std::string batched =
      "\n| threads | job | jobs per call | batched jobs/s | x per-job Multiply | x empty RPC | "
      "server CPU us/job | client CPU us/job | target batched > 2 x per-job |\n"
      "|---|---|---|---|---|---|---|---|---|\n";
  std::map<int64_t, bool> batch_met = {{1, true}, {100, true}};  // by job size n
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int threads = 0;
    if (!absl::SimpleAtoi(part, &threads) || threads < 1) return 2;
    PerCall empty_cost, one_cost, hundred_cost;
    const double empty =
        Rate(threads, seconds, [&] { return client.Health().ok(); }, &empty_cost);
    const auto job_rate = [&](int64_t n, PerCall* cost) {
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
      }, cost);
    };
    const double one = job_rate(1, &one_cost);
    const double hundred = job_rate(100, &hundred_cost);
    for (const int64_t n : {int64_t{1}, int64_t{100}}) {
      const double per_job = n == 1 ? one : hundred;
      for (const int b : batch_sizes) {
        PerCall cost;
        const double calls = Rate(
            threads, seconds,
            [&client, n, b] {
              thread_local std::vector<float> a, d;
              thread_local std::vector<std::vector<float>> c;
              thread_local std::vector<dgmm::BatchItem> items;
              if (static_cast<int>(items.size()) != b || a.size() != static_cast<size_t>(n * n)) {
                a.assign(static_cast<size_t>(n * n), 1.5f);
                d.assign(static_cast<size_t>(n), 2.0f);
                c.assign(static_cast<size_t>(b), std::vector<float>(a.size()));
                items.assign(static_cast<size_t>(b), dgmm::BatchItem());
                for (int i = 0; i < b; ++i) {
                  dgmm::BatchItem& item = items[static_cast<size_t>(i)];
                  item.job.matrix = {a.data(), n, n, dgmm::v1::DTYPE_FLOAT32,
                                     dgmm::v1::LAYOUT_ROW_MAJOR};
                  item.job.diagonal = d.data();
                  item.job.diagonal_bytes = d.size() * sizeof(float);
                  item.out = c[static_cast<size_t>(i)].data();
                  item.out_bytes = a.size() * sizeof(float);
                }
              }
              absl::StatusOr<dgmm::BatchResult> r = client.MultiplyBatch(items);
              if (!r.ok()) return false;
              for (size_t i = 0; i < items.size(); ++i) {
                if (!r->jobs[i].ok() || c[i][0] != 3.0f) return false;
              }
              return true;
            },
            &cost);
        const double jobs = calls * b;
        const bool met = jobs > 2 * per_job;
        if (b >= 16) batch_met[n] = batch_met[n] && met;
        char row[320];
        std::snprintf(row, sizeof(row),
                      "| %d | %lldx%lld | %d | %.0f | %.2f | %.2f | %.1f | %.1f | %s |\n", threads,
                      static_cast<long long>(n), static_cast<long long>(n), b, jobs, jobs / per_job,
                      jobs / empty, cost.server_us / b, cost.client_us / b, met ? "MET" : "MISSED");
        batched += row;
      }
    }
    cost_row(threads, "empty RPC", empty_cost);
    cost_row(threads, "1x1 job", one_cost);
    cost_row(threads, "100x100 job", hundred_cost);
    const bool met = one >= 0.8 * empty;
    all_met = all_met && met;
    std::printf("| %d | %.0f | %.0f | %.2f | %.0f | %.2f | %s |\n", threads, empty, one,
                one / empty, hundred, hundred / empty, met ? "MET" : "MISSED");
    std::fflush(stdout);
  }
  std::printf("%s", costs.c_str());
  if (!batch_sizes.empty()) {
    std::printf("%s", batched.c_str());
    std::printf("\n");
    for (const auto& [n, met] : batch_met) {
      std::printf(
          "batched call (MultiplyBatch) > 2 x the per-job Multiply rate at 16 or more jobs per "
          "call, every thread count, %lldx%lld jobs: %s\n",
          static_cast<long long>(n), static_cast<long long>(n), met ? "MET" : "MISSED");
    }
  }
  return all_met ? 0 : 3;
}
