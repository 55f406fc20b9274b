// dgmm's one logging approach: timestamped lines on stderr, as text or, with
// --log_format=json (SetLogFormat), one JSON object per line. (This Abseil
// predates absl/log; gRPC's own logging stays gRPC's.)
#ifndef DGMM_SERVICE_CORE_LOG_H_
#define DGMM_SERVICE_CORE_LOG_H_

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dgmm {

enum class LogFormat { kText, kJson };

inline std::atomic<LogFormat>& LogFormatSetting() {
  static std::atomic<LogFormat> format{LogFormat::kText};
  return format;
}
// Set once at start, before any line is written (main.cc).
inline void SetLogFormat(LogFormat f) { LogFormatSetting().store(f, std::memory_order_relaxed); }
inline LogFormat log_format() { return LogFormatSetting().load(std::memory_order_relaxed); }

// "2026-01-02T03:04:05.678Z": UTC, milliseconds.
inline std::string LogTime() {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
}

// Appends `s` to `out` as a JSON string, quotes included (RFC 8259): `"`
// and `\` escaped, control characters and DEL as \uXXXX (\n, \r, \t short),
// valid UTF-8 as it is, and each byte of anything else as U+FFFD, so that
// the line stays valid JSON whatever bytes a message holds.
inline void AppendJsonString(std::string* out, absl::string_view s) {
  constexpr char kHex[] = "0123456789abcdef";
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '\r') {
      out->append("\\r");
    } else if (c == '\t') {
      out->append("\\t");
    } else if (c < 0x20 || c == 0x7f) {
      out->append("\\u00");
      out->push_back(kHex[c >> 4]);
      out->push_back(kHex[c & 0xf]);
    } else if (c < 0x80) {
      out->push_back(static_cast<char>(c));
    } else {
      // A UTF-8 sequence: its length from the lead byte, then continuation
      // bytes; overlong forms, surrogates and values past U+10FFFF refused.
      size_t n = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3
                 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
      bool ok = n != 0 && i + n <= s.size();
      for (size_t k = 1; ok && k < n; ++k) {
        ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
      }
      if (ok && n >= 3) {
        const auto c1 = static_cast<unsigned char>(s[i + 1]);
        ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0) &&
             !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);
      }
      if (ok) {
        out->append(s.data() + i, n);
        i += n;
      } else {
        out->append("\\ufffd");
        ++i;
      }
      continue;
    }
    ++i;
  }
  out->push_back('"');
}

inline std::string JsonString(absl::string_view s) {
  std::string out;
  AppendJsonString(&out, s);
  return out;
}

// Writes one whole line (ending in '\n') to stderr.
inline void WriteLogLine(const std::string& line) { std::fputs(line.c_str(), stderr); }

// A line of `args`: "<time> dgmm: <args>" as text, or
// {"time":...,"level":"info","msg":"<args>"} as JSON.
template <typename... Args>
void LogInfo(const Args&... args) {
  if (log_format() == LogFormat::kJson) {
    std::string line = absl::StrCat("{\"time\":\"", LogTime(), "\",\"level\":\"info\",\"msg\":");
    AppendJsonString(&line, absl::StrCat(args...));
    line.append("}\n");
    WriteLogLine(line);
    return;
  }
  WriteLogLine(absl::StrCat(LogTime(), " dgmm: ", args..., "\n"));
}

// DGMM_TRACE_JOBS=1 in the server's environment: a "trace:" line per job
// with its host-side phases (the CUDA job context's; a region job's from the
// call's arrival to its reply), read by bench/pinned_region_timeline.py and
// bench/small_region_job_bench.py.
inline bool TraceJobs() {
  static const bool on = [] {
    const char* v = std::getenv("DGMM_TRACE_JOBS");
    return v != nullptr && std::string(v) == "1";
  }();
  return on;
}

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_LOG_H_
