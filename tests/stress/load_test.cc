// dgmm_load_test: the load and fault test. Starts the real dgmm-server on a
// fixed loopback port, runs --clients concurrent clients through --jobs
// mixed jobs (every result checked against float64), abandons jobs midway
// from extra clients, SIGKILLs the server --kills times and restarts it on
// the same port, then checks that no job was lost or wrong and that the
// server's reservations are back to zero. Writes a markdown report and exits
// non-zero if any check fails.
#include <sys/utsname.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <sstream>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "tests/stress/job_mix.h"
#include "tests/stress/load_clients.h"
#include "tests/stress/report.h"
#include "tests/stress/server_supervisor.h"
#include "tests/support/server_process.h"

ABSL_FLAG(std::string, server, "",
          "dgmm-server binary to start (default: the one built with this test, or "
          "$DGMM_SERVER_BIN).");
ABSL_FLAG(std::string, server_flags, "--host_memory_budget=256MiB --max_queue=8",
          "Flags for the started server, space-separated. The default budget and queue are "
          "small so that jobs queue and some get queue-full pushback. Add --backend=... to "
          "choose where jobs run (the server's default is auto: the GPU if it has one).");
ABSL_FLAG(std::string, address, "",
          "Use the server already at HOST:PORT instead of starting one (no kills, no RSS).");
ABSL_FLAG(int, clients, 64, "Concurrent clients, each on its own connection.");
ABSL_FLAG(int, jobs, 10000, "Jobs in total, shared by the clients.");
ABSL_FLAG(int64_t, max_n, 4096, "Largest rows or cols of a job.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the job mix (the same seed gives the same jobs).");
ABSL_FLAG(double, stream_fraction, 0.25,
          "Share of the jobs small enough for Multiply that are streamed anyway.");
ABSL_FLAG(int, abandon_clients, 3,
          "Extra clients that abandon streamed jobs midway, in turn: cancel, deadline, "
          "disconnect (a child process that exits mid-stream).");
ABSL_FLAG(int, kills, 1, "Times to SIGKILL the server, evenly spread over the run's jobs.");
ABSL_FLAG(int, restart_after_ms, 1000, "Time the server stays down after each SIGKILL.");
ABSL_FLAG(int, attempt_timeout_s, 120, "Deadline of one attempt of a job.");
ABSL_FLAG(int, retry_window_s, 120,
          "How long a job keeps retrying UNAVAILABLE and queue-full before it counts as lost.");
ABSL_FLAG(int, max_duration_s, 900,
          "Stop handing out jobs after this long; jobs not run make the test fail.");
ABSL_FLAG(std::string, report, "", "Write the markdown report here (it is printed too).");
ABSL_FLAG(std::string, commit, "",
          "Commit to name in the report (default: git rev-parse in the source tree).");
ABSL_FLAG(bool, abandon_child, false, "Internal: run as the disconnecting child process.");
ABSL_FLAG(int64_t, abandon_max_block_bytes, 4 << 20, "Internal: for --abandon_child.");

namespace dgmm::stress {
namespace {

std::string Trim(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s;
}

std::string Shell(const std::string& command) {
  std::string out;
  testing::RunCommand(command, &out);
  return Trim(out);
}

std::string QuoteArgs(int argc, char** argv) {
  std::vector<std::string> words;
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a.find_first_of(" '\"$\\") != std::string::npos) {
      std::string q = "'";
      for (char c : a) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
      a = q + "'";
    }
    words.push_back(a);
  }
  return absl::StrJoin(words, " ");
}

std::string Machine() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  utsname u{};
  uname(&u);
  std::string cpu = Shell("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
  std::string mem = Shell("awk '/MemTotal/ {printf \"%.0f GiB\", $2/1048576}' /proc/meminfo");
  return absl::StrCat(host, ", ", Trim(cpu.empty() ? "unknown CPU" : cpu.substr(1)), " x ",
                      std::thread::hardware_concurrency(), " hardware threads, ", mem,
                      " RAM, Linux ", u.release);
}

std::string Commit() {
  if (!absl::GetFlag(FLAGS_commit).empty()) return absl::GetFlag(FLAGS_commit);
  const std::string git = "git -C '" DGMM_SOURCE_DIR "' ";
  std::string sha = Shell(git + "rev-parse --short HEAD");
  if (sha.empty() || sha.find(' ') != std::string::npos) return "unknown";
  if (!Shell(git + "status --porcelain --untracked-files=no -- service client proto tests")
           .empty()) {
    sha += " (with uncommitted changes in service/, client/, proto/ or tests/)";
  }
  return sha;
}

const char* DTypeName(v1::DType t) { return t == v1::DTYPE_FLOAT64 ? "float64" : "float32"; }

std::string Describe(int index, const JobSpec& s) {
  return absl::StrFormat("job %d: %dx%d %s %s %s %s", index, s.rows, s.cols, DTypeName(s.dtype),
                         s.layout == v1::LAYOUT_COL_MAJOR ? "col-major" : "row-major",
                         s.side == v1::SIDE_LEFT ? "left" : "right",
                         s.streamed ? absl::StrCat("streamed (", s.block_lines, " lines a block)")
                                    : std::string("unary"));
}

std::string DeviceName(const v1::DeviceInfo& d) {
  return d.index() < 0 ? std::string("cpu") : absl::StrCat("cuda:", d.index());
}

// Reserved bytes, queued and running jobs of every device; true if all zero.
bool Idle(const v1::GetServerInfoResponse& info, std::string* state, std::string* counters) {
  bool idle = true;
  std::vector<std::string> states, counts;
  for (const v1::DeviceInfo& d : info.devices()) {
    idle = idle && d.reserved_bytes() == 0 && d.queued_jobs() == 0 && d.running_jobs() == 0;
    states.push_back(absl::StrCat(DeviceName(d), ": ", d.reserved_bytes(), " B, ", d.queued_jobs(),
                                  " queued, ", d.running_jobs(), " running"));
    std::vector<std::string> rejected;
    for (const auto& [reason, n] : d.rejected_jobs()) {
      if (n > 0) rejected.push_back(absl::StrCat(reason, " ", n));
    }
    std::sort(rejected.begin(), rejected.end());
    counts.push_back(
        absl::StrCat(DeviceName(d), ": completed ", d.completed_jobs(),
                     rejected.empty() ? "" : ", ended otherwise: ", absl::StrJoin(rejected, ", ")));
  }
  *state = absl::StrJoin(states, "; ");
  *counters = absl::StrJoin(counts, "; ");
  return idle;
}

// Mean of rows*cols for independent dims, log-uniform or uniform in [1, n].
double LogUniformMean(int64_t n) {
  const double m = static_cast<double>(n) / std::log(static_cast<double>(n) + 1);
  return m * m;
}
double UniformMean(int64_t n) {
  const double m = (static_cast<double>(n) + 1) / 2;
  return m * m;
}

std::string MixRule(const MixOptions& o) {
  return absl::StrFormat(
      "%d jobs from seed %d. Rows and cols are drawn independently and log-uniformly from "
      "[1, %d], so most jobs are small while about %.0f%% have a side over %d; the first five "
      "jobs are the extremes 1x1, %dx%d (float32 and float64), 1x%d and %dx1. Dtype, layout "
      "and side are each a fair coin. Jobs over %s (half the server's max unary message) are "
      "always streamed, %.0f%% of the others are streamed too; a streamed job uses the largest "
      "block (<= max_block_bytes %s) half the time, else a log-uniform number of lines per "
      "block, in at most %d blocks. Every payload value is in [0.5, 2).\n\n"
      "Why log-uniform: the mean of rows*cols is then about (max_n / ln max_n)^2, %.0f "
      "elements for max_n %d, against (max_n / 2)^2 = %.0f for uniform dims, which would "
      "move %.0fx the bytes; the table below gives the planned volume.",
      o.jobs, o.seed, o.max_n, 100.0 * (1.0 - std::log(o.max_n / 2.0) / std::log(o.max_n + 1.0)),
      o.max_n / 2, o.max_n, o.max_n, o.max_n, o.max_n,
      absl::StrCat(o.unary_limit_bytes >> 20, " MiB"), 100 * o.stream_fraction,
      absl::StrCat(o.max_block_bytes >> 20, " MiB"), o.max_blocks, LogUniformMean(o.max_n), o.max_n,
      UniformMean(o.max_n), UniformMean(o.max_n) / LogUniformMean(o.max_n));
}

int Run(const std::string& command) {
  RunSummary sum;
  sum.command = command;
  sum.date = absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::Now(), absl::UTCTimeZone());
  sum.machine = Machine();
  sum.commit = Commit();
  sum.clients = absl::GetFlag(FLAGS_clients);
  sum.abandon_clients = absl::GetFlag(FLAGS_abandon_clients);
  const int jobs = absl::GetFlag(FLAGS_jobs);
  const int kills = absl::GetFlag(FLAGS_kills);

  std::unique_ptr<ServerSupervisor> server;
  std::string address = absl::GetFlag(FLAGS_address);
  if (address.empty()) {
    const std::string binary =
        absl::GetFlag(FLAGS_server).empty() ? testing::ServerBinary() : absl::GetFlag(FLAGS_server);
    std::vector<std::string> flags =
        absl::StrSplit(absl::GetFlag(FLAGS_server_flags), ' ', absl::SkipEmpty());
    server = std::make_unique<ServerSupervisor>(binary, flags);
    sum.server = absl::StrCat(binary, " --listen=", server->address(), " ",
                              absl::GetFlag(FLAGS_server_flags));
    if (absl::Status s = server->Start(absl::Seconds(120)); !s.ok()) {
      std::fprintf(stderr, "load_test: %s\n", std::string(s.message()).c_str());
      return 2;
    }
    address = server->address();
  } else {
    sum.supervised = false;
    sum.server = "already running at " + address;
  }

  std::unique_ptr<v1::Dgmm::Stub> info_stub = ConnectOwn(address);
  v1::GetServerInfoResponse info;
  if (!FetchInfo(info_stub.get(), absl::Seconds(30), &info)) {
    std::fprintf(stderr, "load_test: GetServerInfo failed at %s\n", address.c_str());
    return 2;
  }
  for (const v1::DeviceInfo& d : info.devices()) {
    sum.devices.push_back(
        absl::StrCat(DeviceName(d), ": ", d.name(), ", budget ", d.budget_bytes() >> 20, " MiB",
                     d.index() < 0 ? std::string() : absl::StrCat(", ", d.streams(), " streams")));
  }
  sum.devices.push_back(absl::StrCat("default backend ", v1::Backend_Name(info.default_backend())));

  MixOptions mix;
  mix.jobs = jobs;
  mix.max_n = absl::GetFlag(FLAGS_max_n);
  mix.seed = absl::GetFlag(FLAGS_seed);
  mix.stream_fraction = absl::GetFlag(FLAGS_stream_fraction);
  mix.unary_limit_bytes = info.limits().max_unary_message_bytes() / 2;
  mix.max_block_bytes = info.limits().max_block_bytes();
  const std::vector<JobSpec> plan = PlanJobs(mix);
  sum.planned = jobs;
  sum.mix_rule = MixRule(mix);
  sum.mix_table = DescribeMix(plan);

  RetryPolicy policy;
  policy.attempt_timeout = absl::Seconds(absl::GetFlag(FLAGS_attempt_timeout_s));
  policy.window = absl::Seconds(absl::GetFlag(FLAGS_retry_window_s));

  std::vector<JobResult> results(plan.size());
  std::vector<char> ran(plan.size(), 0);
  std::atomic<int> next{0};
  std::atomic<int64_t> completed{0};
  std::atomic<int> clients_left{sum.clients};
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < sum.clients; ++c) {
    threads.emplace_back([&, c] {
      Connection connection(address);
      std::mt19937_64 rng(mix.seed * 7919 + static_cast<uint64_t>(c));
      for (int i = next++; i < jobs && !stop; i = next++) {
        results[static_cast<std::size_t>(i)] = RunJob(&connection, plan[i], policy, &rng);
        ran[static_cast<std::size_t>(i)] = 1;
        ++completed;
      }
      --clients_left;
    });
  }
  std::mutex abandoned_mu;
  std::atomic<bool> stop_abandoning{false};
  std::vector<std::thread> abandoners;
  for (int a = 0; a < sum.abandon_clients; ++a) {
    abandoners.emplace_back([&, a] {
      const Abandon kind = kAbandonKinds[a % std::size(kAbandonKinds)];
      Connection connection(address);
      std::mt19937_64 rng(mix.seed * 104729 + static_cast<uint64_t>(a));
      while (!stop_abandoning) {
        const std::string saw =
            AbandonJob(kind, address, connection.stub(), rng(), mix.max_n, mix.max_block_bytes);
        if (saw == CodeName(grpc::StatusCode::UNAVAILABLE)) connection.Reopen();
        {
          std::lock_guard lock(abandoned_mu);
          ++sum.abandoned[absl::StrCat(AbandonName(kind), ": ", saw)];
        }
        absl::SleepFor(absl::Milliseconds(std::uniform_int_distribution<int>(20, 200)(rng)));
      }
    });
  }

  // The main thread supervises the server: it must be the one that starts it
  // (the server dies with the thread that forked it).
  const absl::Time start = absl::Now();
  const absl::Duration cap = absl::Seconds(absl::GetFlag(FLAGS_max_duration_s));
  auto restart = [&](const char* why) {
    if (absl::Status s = server->Start(absl::Seconds(120)); !s.ok()) {
      sum.problems.push_back(absl::StrCat("restart after ", why, " failed: ", s.message()));
      stop = true;
    }
  };
  while (clients_left > 0) {
    if (server != nullptr) {
      if (std::optional<int> status = server->ExitedUnexpectedly()) {
        sum.unexpected_exits.push_back(
            absl::StrCat("wait status ", *status, " at ", absl::FormatDuration(absl::Now() - start),
                         "; log tail:\n\n```\n", server->LogTail(3000), "\n```"));
        server->KeepLogs();
        restart("an unexpected exit");
      }
      const int done = static_cast<int>(sum.kills.size());
      if (done < kills && !stop &&
          completed >= static_cast<int64_t>(jobs) * (done + 1) / (kills + 1)) {
        KillRecord k;
        k.completed_before = completed;
        k.at_s = absl::ToDoubleSeconds(absl::Now() - start);
        const absl::Time killed = absl::Now();
        k.peak_rss_bytes = server->Kill();
        absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_restart_after_ms)));
        restart("SIGKILL");
        k.down_s = absl::ToDoubleSeconds(absl::Now() - killed);
        sum.kills.push_back(k);
      }
    }
    if (!stop && absl::Now() - start > cap) stop = true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  for (std::thread& t : threads) t.join();
  stop_abandoning = true;
  for (std::thread& t : abandoners) t.join();
  sum.wall_s = absl::ToDoubleSeconds(absl::Now() - start);
  if (server != nullptr && static_cast<int>(sum.kills.size()) < kills) {
    sum.problems.push_back(absl::StrCat("only ", sum.kills.size(), " of ", kills,
                                        " SIGKILLs happened before the jobs ran out"));
  }

  // Cancelled and disconnected jobs end on the server shortly after the
  // client leaves; give the last ones a moment.
  const absl::Time settle = absl::Now() + absl::Seconds(30);
  do {
    v1::GetServerInfoResponse last;
    sum.reservations_zero = FetchInfo(info_stub.get(), absl::Seconds(5), &last) &&
                            Idle(last, &sum.final_state, &sum.final_counters);
    if (sum.final_state.empty()) sum.final_state = "GetServerInfo failed";
    if (!sum.reservations_zero) absl::SleepFor(absl::Milliseconds(100));
  } while (!sum.reservations_zero && absl::Now() < settle);
  if (server != nullptr) {
    sum.final_peak_rss_bytes = server->PeakRssBytes();
    const std::optional<int> status = server->Stop(absl::Seconds(60));
    sum.stop_clean = status && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
    sum.stop_status = !status              ? "still running after 60 s: SIGKILLed"
                      : WIFEXITED(*status) ? absl::StrCat("exit code ", WEXITSTATUS(*status))
                                           : absl::StrCat("killed by signal ", WTERMSIG(*status));
  }

  std::vector<double> all_ms, unary_ms, streamed_ms;
  for (std::size_t i = 0; i < plan.size(); ++i) {
    const JobResult& r = results[i];
    if (!ran[i]) {
      ++sum.not_run;
      continue;
    }
    sum.unavailable_retries += r.unavailable_retries;
    sum.pushback_retries += r.pushback_retries;
    sum.jobs_retried += r.unavailable_retries + r.pushback_retries > 0;
    if (r.verdict == JobResult::Verdict::kLost) {
      ++sum.lost;
      if (sum.failures.size() < 20) {
        sum.failures.push_back(absl::StrCat(Describe(static_cast<int>(i), plan[i]),
                                            ": lost, last status ", CodeName(r.code), ": ",
                                            r.message));
      }
      continue;
    }
    if (r.verdict == JobResult::Verdict::kWrong) {
      ++sum.wrong;
      if (sum.failures.size() < 20) {
        sum.failures.push_back(absl::StrFormat("%s: wrong, max relative error %g",
                                               Describe(static_cast<int>(i), plan[i]),
                                               r.max_rel_error));
      }
      continue;
    }
    ++sum.correct;
    sum.bytes_moved += r.bytes_moved;
    ++sum.backends[v1::Backend_Name(r.backend)];
    double& worst =
        plan[i].dtype == v1::DTYPE_FLOAT64 ? sum.max_rel_error_f64 : sum.max_rel_error_f32;
    worst = std::max(worst, r.max_rel_error);
    const double ms = absl::ToDoubleMilliseconds(r.latency);
    all_ms.push_back(ms);
    (plan[i].streamed ? streamed_ms : unary_ms).push_back(ms);
  }
  if (server != nullptr && !sum.Verdicts().empty()) {
    server->KeepLogs();
    sum.kept_logs = server->log_dir();
  }
  sum.all = Percentiles(all_ms);
  sum.unary = Percentiles(unary_ms);
  sum.streamed = Percentiles(streamed_ms);

  const std::string report = RenderReport(sum);
  std::fputs(report.c_str(), stdout);
  if (const std::string path = absl::GetFlag(FLAGS_report); !path.empty()) {
    std::ofstream(path) << report;
  }
  return sum.Verdicts().empty() ? 0 : 1;
}

}  // namespace
}  // namespace dgmm::stress

int main(int argc, char** argv) {
  const std::string command = dgmm::stress::QuoteArgs(argc, argv);
  absl::SetProgramUsageMessage(
      "load and fault test of dgmm-server: many clients, mixed jobs checked against "
      "float64, abandoned streams, SIGKILL and restart; writes a markdown report.");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_abandon_child)) {
    return dgmm::stress::AbandonChildMain(absl::GetFlag(FLAGS_address), absl::GetFlag(FLAGS_seed),
                                          absl::GetFlag(FLAGS_max_n),
                                          absl::GetFlag(FLAGS_abandon_max_block_bytes));
  }
  return dgmm::stress::Run(command);
}
