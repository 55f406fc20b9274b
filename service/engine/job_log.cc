#include "service/engine/job_log.h"

#include "absl/strings/str_cat.h"
#include "service/core/log.h"
#include "service/core/outcome.h"

namespace dgmm {
namespace {

bool IsPart(const JobLogEntry& e) { return e.group != nullptr && e.group->has_value(); }

uint64_t JobId(const JobLogEntry& e) { return e.stats != nullptr ? e.stats->job_id : 0; }

std::string OutcomeText(const absl::Status& s) {
  return s.ok() ? "completed" : OutcomeName(OutcomeOf(s));
}

const std::optional<JobTrace>& TraceOf(const JobLogEntry& e) {
  static const std::optional<JobTrace> none;
  return e.call != nullptr ? e.call->trace : none;
}

const char* Level(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return "info";
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
    case absl::StatusCode::kDataLoss:
      return "error";
    default:
      return "warning";
  }
}

}  // namespace

std::string JobLogText(const JobLogEntry& e) {
  std::string line = absl::StrCat("job ", JobId(e));
  if (IsPart(e)) {
    const JobGroup& g = **e.group;
    absl::StrAppend(&line, " group ", g.id, " lines [", g.first_line, ",", g.first_line + e.lines,
                    ") of ", g.total_lines, " (", g.parts, " parts)");
  }
  absl::StrAppend(&line, ": ", OutcomeText(e.status));
  if (!e.status.ok()) {
    absl::StrAppend(&line, " (", absl::StatusCodeToString(e.status.code()), ": ",
                    e.status.message(), ")");
  }
  const std::optional<JobTrace>& trace = TraceOf(e);
  absl::StrAppend(&line, "; method=", e.call != nullptr ? e.call->method : "-",
                  " client=", e.call != nullptr && !e.call->client.empty() ? e.call->client : "-",
                  " trace=", trace.has_value() ? trace->parent.trace_id_hex() : "-",
                  " parent=", trace.has_value() ? trace->parent.span_id_hex() : "-",
                  " span=", trace.has_value() ? ToHex(trace->span_id)
                                              : "-");
  return line;
}

std::string JobLogJson(const JobLogEntry& e) {
  std::string line = absl::StrCat("{\"time\":\"", LogTime(), "\",\"level\":\"", Level(e.status),
                                  "\",\"msg\":\"job\",\"job_id\":", JobId(e), ",\"method\":");
  AppendJsonString(&line, e.call != nullptr ? e.call->method : "");
  line.append(",\"client\":");
  AppendJsonString(&line, e.call != nullptr ? e.call->client : "");
  const std::optional<JobTrace>& trace = TraceOf(e);
  if (trace.has_value()) {
    absl::StrAppend(&line, ",\"trace_id\":\"", trace->parent.trace_id_hex(),
                    "\",\"parent_span_id\":\"", trace->parent.span_id_hex(), "\",\"span_id\":\"",
                    ToHex(trace->span_id), "\",\"trace_flags\":\"",
                    trace->parent.flags_hex(), "\"");
  } else {
    line.append(",\"trace_id\":null,\"parent_span_id\":null,\"span_id\":null,\"trace_flags\":null");
  }
  absl::StrAppend(&line, ",\"status\":\"", absl::StatusCodeToString(e.status.code()),
                  "\",\"outcome\":\"", OutcomeText(e.status), "\"");
  if (!e.status.ok()) {
    line.append(",\"error\":");
    AppendJsonString(&line, e.status.message());
  }
  if (IsPart(e)) {
    const JobGroup& g = **e.group;
    line.append(",\"group\":{\"id\":");
    AppendJsonString(&line, g.id);
    absl::StrAppend(&line, ",\"first_line\":", g.first_line, ",\"lines\":", e.lines,
                    ",\"total_lines\":", g.total_lines, ",\"parts\":", g.parts, "}");
  }
  if (e.stats != nullptr) {
    const JobStats& s = *e.stats;
    line.append(",\"device\":");
    AppendJsonString(&line, s.device);
    absl::StrAppend(&line, ",\"device_index\":", s.device_index);
    if (s.backend.has_value()) {
      line.append(",\"backend\":");
      AppendJsonString(&line, BackendName(*s.backend));
    }
    absl::StrAppend(&line, ",\"bytes_in\":", s.bytes_in, ",\"bytes_out\":", s.bytes_out,
                    ",\"queue_wait_ns\":", s.queue_wait_ns, ",\"h2d_ns\":", s.h2d_ns,
                    ",\"compute_ns\":", s.compute_ns, ",\"d2h_ns\":", s.d2h_ns,
                    ",\"total_ns\":", s.total_ns);
  }
  line.push_back('}');
  return line;
}

void LogJob(const JobLogEntry& e, bool all_jobs) {
  if (!all_jobs && !IsPart(e)) return;
  if (log_format() == LogFormat::kJson) {
    WriteLogLine(JobLogJson(e) + "\n");
  } else {
    WriteLogLine(absl::StrCat(LogTime(), " dgmm: ", JobLogText(e), "\n"));
  }
}

}  // namespace dgmm
