#include "cli/progress_bar.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "cli/commands.h"

namespace dgmm::cli {
namespace {

constexpr absl::Duration kShowAfter = absl::Seconds(1);
constexpr absl::Duration kRedrawEvery = absl::Milliseconds(100);
constexpr int kBarWidth = 30;

}  // namespace

bool ProgressBar::StderrIsTerminal() { return isatty(STDERR_FILENO) == 1; }

void ProgressBar::Update(int64_t bytes_sent, int64_t bytes_received, int64_t total_bytes) {
  if (!enabled_ || total_bytes <= 0) return;
  const absl::Time now = absl::Now();
  const absl::Duration elapsed = now - start_;
  if (elapsed < kShowAfter || now - last_draw_ < kRedrawEvery) return;
  last_draw_ = now;
  // Each byte of A goes up and each byte of C comes back.
  const int64_t moved = bytes_sent + bytes_received;
  const int64_t total = 2 * total_bytes;
  const double fraction =
      std::clamp(static_cast<double>(moved) / static_cast<double>(total), 0.0, 1.0);
  const double rate = static_cast<double>(moved) / absl::ToDoubleSeconds(elapsed);
  const int filled = static_cast<int>(fraction * kBarWidth);
  std::string eta = "--";
  if (rate > 0) {
    eta = absl::StrFormat("%.0fs", static_cast<double>(total - moved) / rate);
  }
  std::fprintf(stderr, "\r[%s%s] %s / %s  %s/s  ETA %s\033[K", std::string(filled, '#').c_str(),
               std::string(kBarWidth - filled, '.').c_str(), FormatBytes(moved).c_str(),
               FormatBytes(total).c_str(), FormatBytes(static_cast<int64_t>(rate)).c_str(),
               eta.c_str());
  std::fflush(stderr);
  drawn_ = true;
}

void ProgressBar::Finish() {
  if (!drawn_) return;
  std::fprintf(stderr, "\r\033[K");
  std::fflush(stderr);
  drawn_ = false;
}

}  // namespace dgmm::cli
