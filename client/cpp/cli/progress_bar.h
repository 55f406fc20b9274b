// A one-line transfer progress bar on stderr: bytes moved, rate and ETA.
// It appears only once a transfer has run for a second, and only when
// enabled (stderr is a terminal and --quiet is off), so scripts and short
// jobs see nothing.
#ifndef DGMM_CLIENT_CPP_CLI_PROGRESS_BAR_H_
#define DGMM_CLIENT_CPP_CLI_PROGRESS_BAR_H_

#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace dgmm::cli {

class ProgressBar {
 public:
  explicit ProgressBar(bool enabled) : enabled_(enabled), start_(absl::Now()) {}
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;
  ~ProgressBar() { Finish(); }

  // True when stderr is a terminal.
  static bool StderrIsTerminal();

  // Matches dgmm::ProgressCallback; calls must not overlap.
  void Update(int64_t bytes_sent, int64_t bytes_received, int64_t total_bytes);
  // Clears the bar if it was drawn.
  void Finish();

 private:
  const bool enabled_;
  const absl::Time start_;
  absl::Time last_draw_ = absl::InfinitePast();
  bool drawn_ = false;
};

}  // namespace dgmm::cli

#endif  // DGMM_CLIENT_CPP_CLI_PROGRESS_BAR_H_
