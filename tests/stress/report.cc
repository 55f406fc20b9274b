#include "tests/stress/report.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace dgmm::stress {
namespace {

std::string MiB(int64_t bytes) {
  return bytes < 0 ? "n/a" : absl::StrFormat("%.1f MiB", static_cast<double>(bytes) / (1 << 20));
}

std::string LatencyRow(const char* name, const LatencyStats& l) {
  return absl::StrFormat("| %s | %d | %.1f | %.1f | %.1f | %.1f |\n", name, l.count, l.p50_ms,
                         l.p90_ms, l.p99_ms, l.max_ms);
}

}  // namespace

LatencyStats Percentiles(std::vector<double> ms) {
  LatencyStats l;
  l.count = static_cast<int64_t>(ms.size());
  if (ms.empty()) return l;
  std::sort(ms.begin(), ms.end());
  auto at = [&](double q) {
    const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(ms.size())));
    return ms[std::clamp<std::size_t>(rank, 1, ms.size()) - 1];
  };
  l.p50_ms = at(0.50);
  l.p90_ms = at(0.90);
  l.p99_ms = at(0.99);
  l.max_ms = ms.back();
  return l;
}

std::vector<std::string> RunSummary::Verdicts() const {
  std::vector<std::string> v;
  if (lost > 0) v.push_back(absl::StrCat(lost, " jobs lost"));
  if (wrong > 0) v.push_back(absl::StrCat(wrong, " wrong results"));
  if (not_run > 0) v.push_back(absl::StrCat(not_run, " jobs not run (duration cap)"));
  if (!reservations_zero) v.push_back("reservations not back to zero: " + final_state);
  for (const std::string& e : unexpected_exits) v.push_back("server exited by itself: " + e);
  if (!stop_clean) v.push_back("server did not stop cleanly on SIGTERM: " + stop_status);
  v.insert(v.end(), problems.begin(), problems.end());
  return v;
}

std::string RenderReport(const RunSummary& s) {
  const std::vector<std::string> verdicts = s.Verdicts();
  std::string out = "# dgmm load and fault test\n\n";
  absl::StrAppend(&out, "- Date: ", s.date, "\n- Machine: ", s.machine,
                  "\n- Server devices: ", absl::StrJoin(s.devices, "; "), "\n- Commit: ", s.commit,
                  "\n- Server: `", s.server, "`\n- Command:\n\n```\n", s.command, "\n```\n\n");
  absl::StrAppend(&out, "## Result: ", verdicts.empty() ? "PASS" : "FAIL", "\n\n");
  for (const std::string& v : verdicts) absl::StrAppend(&out, "- ", v, "\n");
  if (!s.kept_logs.empty()) absl::StrAppend(&out, "- Server logs kept in ", s.kept_logs, "\n");
  if (!verdicts.empty()) out += "\n";

  out += "| | |\n|---|---:|\n";
  absl::StrAppend(&out, "| jobs planned | ", s.planned, " |\n");
  absl::StrAppend(&out, "| jobs completed and correct | ", s.correct, " |\n");
  absl::StrAppend(&out, "| jobs lost | ", s.lost, " |\n");
  absl::StrAppend(&out, "| wrong results | ", s.wrong, " |\n");
  absl::StrAppend(&out, "| jobs not run (duration cap) | ", s.not_run, " |\n");
  absl::StrAppendFormat(&out, "| largest relative error float32 / float64 | %.3g / %.3g |\n",
                        s.max_rel_error_f32, s.max_rel_error_f64);
  absl::StrAppend(&out, "| retries after UNAVAILABLE | ", s.unavailable_retries, " |\n");
  absl::StrAppend(&out, "| retries after queue full (pushback honoured) | ", s.pushback_retries,
                  " |\n");
  absl::StrAppend(&out, "| jobs that needed a retry | ", s.jobs_retried, " |\n");
  absl::StrAppendFormat(&out, "| wall time | %.1f s |\n", s.wall_s);
  absl::StrAppendFormat(
      &out, "| payload moved (sent + received, correct jobs) | %.2f GiB (%.0f MiB/s) |\n",
      static_cast<double>(s.bytes_moved) / (1 << 30),
      static_cast<double>(s.bytes_moved) / (1 << 20) / std::max(s.wall_s, 1e-9));
  std::vector<std::string> backends;
  for (const auto& [name, n] : s.backends) backends.push_back(absl::StrCat(name, " ", n));
  absl::StrAppend(&out, "| backends that ran the jobs (JobStats) | ", absl::StrJoin(backends, ", "),
                  " |\n");
  if (s.supervised) {
    for (std::size_t i = 0; i < s.kills.size(); ++i) {
      const KillRecord& k = s.kills[i];
      absl::StrAppendFormat(&out,
                            "| SIGKILL %d: at %.1f s, after %d jobs; down for (until serving) | "
                            "%.2f s |\n",
                            i + 1, k.at_s, k.completed_before, k.down_s);
      absl::StrAppend(&out, "| peak server RSS (VmHWM) before SIGKILL ", i + 1, " | ",
                      MiB(k.peak_rss_bytes), " |\n");
    }
    absl::StrAppend(&out, "| peak server RSS (VmHWM) of the last server, at the end | ",
                    MiB(s.final_peak_rss_bytes), " |\n");
  }
  absl::StrAppend(&out, "| at the end: reserved bytes, queued, running (per device) | ",
                  s.final_state, " |\n");
  absl::StrAppend(&out, "| last server's counters at the end | ", s.final_counters, " |\n");
  if (s.supervised)
    absl::StrAppend(&out, "| server exit on SIGTERM at the end | ", s.stop_status, " |\n");

  out += "\n## Latency (client side, per job, retries and waits included)\n\n";
  out += "| jobs | count | p50 ms | p90 ms | p99 ms | max ms |\n|---|---:|---:|---:|---:|---:|\n";
  out +=
      LatencyRow("all", s.all) + LatencyRow("unary", s.unary) + LatencyRow("streamed", s.streamed);

  absl::StrAppend(&out, "\n## Abandoned jobs (", s.abandon_clients,
                  " extra clients, not counted above)\n\n| kind: what the client saw | jobs |\n"
                  "|---|---:|\n");
  for (const auto& [what, n] : s.abandoned) absl::StrAppend(&out, "| ", what, " | ", n, " |\n");

  absl::StrAppend(&out, "\n## Job mix\n\n", s.mix_rule, "\n\n", s.mix_table);
  if (!s.failures.empty()) {
    out += "\n## Lost and wrong jobs (first ones)\n\n";
    for (const std::string& f : s.failures) absl::StrAppend(&out, "- ", f, "\n");
  }
  return out;
}

}  // namespace dgmm::stress
