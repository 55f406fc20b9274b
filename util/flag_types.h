// Flag types for sizes and budgets, so that a bad value is refused when the
// command line (or a DGMM_<FLAG> variable) is parsed, with a message naming
// the flag, rather than when the value is first used.
//
//   ABSL_FLAG(dgmm::ByteSize, max_block_bytes, dgmm::ByteSize::MiB(4), "...");
//   ABSL_FLAG(dgmm::Budget, host_memory_budget, dgmm::Budget::Percent(50), "...");
#ifndef DGMM_UTIL_FLAG_TYPES_H_
#define DGMM_UTIL_FLAG_TYPES_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace dgmm {

// A byte count, written as ParseBytes accepts it: 1048576, 64MiB, 4KiB,
// 8GiB, 2GB. Never negative.
struct ByteSize {
  int64_t bytes = 0;

  static constexpr ByteSize KiB(int64_t n) { return ByteSize{n << 10}; }
  static constexpr ByteSize MiB(int64_t n) { return ByteSize{n << 20}; }
  static constexpr ByteSize GiB(int64_t n) { return ByteSize{n << 30}; }
  friend bool operator==(const ByteSize&, const ByteSize&) = default;
};

// Abseil's flag hooks. Parse accepts what ParseBytes accepts and writes its
// error to *error; Unparse writes the largest binary unit that divides the
// count exactly (64MiB, 1536), which parses back to the same value.
bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error);
std::string AbslUnparseFlag(ByteSize size);

// A memory budget: an absolute byte count (8GiB) or a percentage in (0, 100]
// of a base known only later, such as the memory free at start (80%).
class Budget {
 public:
  Budget() = default;
  static Budget Bytes(int64_t bytes) { return Budget(bytes, 0); }
  static Budget Percent(double percent) { return Budget(0, percent); }

  bool is_percent() const { return percent_ > 0; }
  // The percentage, or 0 for a byte count.
  double percent() const { return percent_; }
  // The budget in bytes, for a percentage of `base_bytes`.
  int64_t Of(int64_t base_bytes) const;

  friend bool operator==(const Budget&, const Budget&) = default;

 private:
  Budget(int64_t bytes, double percent) : bytes_(bytes), percent_(percent) {}
  int64_t bytes_ = 0;
  double percent_ = 0;  // > 0 for a percentage
};

// Parse accepts "80%" (a percentage in (0, 100]) or a byte count of at least
// 1 (ParseBytes); Unparse writes it back in a form ParseBudget accepts too.
bool AbslParseFlag(absl::string_view text, Budget* budget, std::string* error);
std::string AbslUnparseFlag(const Budget& budget);

// OK when min <= value <= max; otherwise INVALID_ARGUMENT naming the flag,
// its value and the range ("--max_queue=0 is out of range: at least 1").
// For the checks a flag's type cannot express (a queue of at least one job).
absl::Status CheckFlagRange(absl::string_view flag, int64_t value, int64_t min,
                            int64_t max = INT64_MAX);

}  // namespace dgmm

#endif  // DGMM_UTIL_FLAG_TYPES_H_
