#include "util/flag_types.h"

#include <cmath>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "util/flag_names.h"

namespace dgmm {

bool AbslParseFlag(absl::string_view text, ByteSize* size, std::string* error) {
  absl::StatusOr<int64_t> bytes = ParseBytes(text);
  if (!bytes.ok()) {
    *error = std::string(bytes.status().message());
    return false;
  }
  size->bytes = *bytes;
  return true;
}

std::string AbslUnparseFlag(ByteSize size) {
  static constexpr struct {
    int shift;
    const char* unit;
  } kUnits[] = {{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}};
  for (const auto& u : kUnits) {
    const int64_t unit = int64_t{1} << u.shift;
    if (size.bytes >= unit && size.bytes % unit == 0) {
      return absl::StrCat(size.bytes / unit, u.unit);
    }
  }
  return absl::StrCat(size.bytes);
}

int64_t Budget::Of(int64_t base_bytes) const {
  if (!is_percent()) return bytes_;
  return static_cast<int64_t>(static_cast<double>(base_bytes) * percent_ / 100.0);
}

bool AbslParseFlag(absl::string_view text, Budget* budget, std::string* error) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (absl::ConsumeSuffix(&t, "%")) {
    double percent = 0;
    if (!absl::SimpleAtod(t, &percent) || !std::isfinite(percent) || percent <= 0 ||
        percent > 100) {
      *error = absl::StrCat("'", text, "' is not a percentage in (0, 100]; expected e.g. 80%");
      return false;
    }
    *budget = Budget::Percent(percent);
    return true;
  }
  ByteSize size;
  if (!AbslParseFlag(t, &size, error)) {
    *error = absl::StrCat(*error, "; or give a percentage such as 80%");
    return false;
  }
  if (size.bytes < 1) {
    *error = absl::StrCat("'", text, "': a budget must be at least 1 byte (or a percentage)");
    return false;
  }
  *budget = Budget::Bytes(size.bytes);
  return true;
}

std::string AbslUnparseFlag(const Budget& budget) {
  if (!budget.is_percent()) return AbslUnparseFlag(ByteSize{budget.Of(0)});
  return absl::StrCat(budget.percent(), "%");
}

absl::Status CheckFlagRange(absl::string_view flag, int64_t value, int64_t min, int64_t max) {
  if (value >= min && value <= max) return absl::OkStatus();
  return absl::InvalidArgumentError(
      max == INT64_MAX
          ? absl::StrCat("--", flag, "=", value, " is out of range: at least ", min)
          : absl::StrCat("--", flag, "=", value, " is out of range: ", min, " to ", max));
}

}  // namespace dgmm
