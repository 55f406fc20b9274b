// The load test's findings and their markdown report.
#ifndef DGMM_TESTS_STRESS_REPORT_H_
#define DGMM_TESTS_STRESS_REPORT_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace dgmm::stress {

struct KillRecord {
  int64_t completed_before = 0;  // jobs completed when it was killed
  double at_s = 0;               // seconds into the run
  int64_t peak_rss_bytes = -1;   // VmHWM of the killed server, just before
  double down_s = 0;             // from SIGKILL until the new server served
};

struct LatencyStats {
  int64_t count = 0;
  double p50_ms = 0, p90_ms = 0, p99_ms = 0, max_ms = 0;
};
// Nearest-rank percentiles of `ms` (sorted here).
LatencyStats Percentiles(std::vector<double> ms);

struct RunSummary {
  // Where and how.
  std::string date, machine, commit, command, server, mix_rule, mix_table;
  std::vector<std::string> devices;  // from the first GetServerInfo
  int clients = 0, abandon_clients = 0;

  // Jobs.
  int64_t planned = 0, correct = 0, wrong = 0, lost = 0, not_run = 0;
  int64_t unavailable_retries = 0, pushback_retries = 0, jobs_retried = 0;
  double max_rel_error_f32 = 0, max_rel_error_f64 = 0;
  std::map<std::string, int64_t> backends;  // JobStats.backend of correct jobs
  std::vector<std::string> failures;        // the first lost and wrong jobs, described
  LatencyStats all, unary, streamed;
  double wall_s = 0;
  int64_t bytes_moved = 0;  // payload bytes sent plus received, correct jobs

  // Abandoned jobs: "kind: outcome" -> count.
  std::map<std::string, int64_t> abandoned;

  // The server.
  bool supervised = true;
  std::vector<KillRecord> kills;
  std::vector<std::string> unexpected_exits;
  int64_t final_peak_rss_bytes = -1;
  bool reservations_zero = false;
  std::string final_state;  // reserved/queued/running per device at the end
  std::string final_counters;
  std::string stop_status;
  bool stop_clean = true;
  // Where the server logs were kept (a failed run keeps them).
  std::string kept_logs;

  // Other failures found by the run (a restart that failed, a kill that
  // never happened).
  std::vector<std::string> problems;

  // Why the run failed; empty if it passed.
  std::vector<std::string> Verdicts() const;
};

std::string RenderReport(const RunSummary& s);

}  // namespace dgmm::stress

#endif  // DGMM_TESTS_STRESS_REPORT_H_
