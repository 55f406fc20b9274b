#include "util/flag_names.h"

#include <cctype>
#include <cstdlib>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace dgmm {

std::vector<std::string> NormalizeFlagNames(int argc, char** argv) {
  std::vector<std::string> out;
  bool after_terminator = false;
  for (int i = 0; i < argc; ++i) {
    std::string arg = argv[i];
    if (i > 0 && !after_terminator && arg == "--") {
      after_terminator = true;
    } else if (i > 0 && !after_terminator && arg.size() > 2 && arg[0] == '-') {
      std::size_t start = arg[1] == '-' ? 2 : 1;
      std::size_t end = arg.find('=');
      if (end == std::string::npos) end = arg.size();
      for (std::size_t k = start; k < end; ++k) {
        if (arg[k] == '-') arg[k] = '_';
      }
    }
    out.push_back(std::move(arg));
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> ApplyFlagsFromEnv(
    absl::string_view prefix, const std::vector<std::string>& args) {
  std::vector<std::string> applied;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    std::string var = absl::StrCat(prefix, absl::AsciiStrToUpper(name));
    const char* value = std::getenv(var.c_str());
    if (value == nullptr) continue;
    bool on_command_line = false;
    for (const std::string& a : args) {
      absl::string_view v = a;
      if (!absl::ConsumePrefix(&v, "--") && !absl::ConsumePrefix(&v, "-")) continue;
      if (absl::ConsumePrefix(&v, "no")) {
        if (v == name) on_command_line = true;
        v = a;
        absl::ConsumePrefix(&v, "--") || absl::ConsumePrefix(&v, "-");
      }
      if (v == name || absl::StartsWith(v, absl::StrCat(name, "="))) on_command_line = true;
    }
    if (on_command_line) continue;
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          absl::StrCat("environment variable ", var, "='", value, "': ", error));
    }
    applied.push_back(std::string(name));
  }
  return applied;
}

absl::Status CheckFlagValues(const std::vector<std::string>& args) {
  for (std::size_t i = 1; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (arg == "--") break;
    if (arg.size() < 2 || arg[0] != '-') continue;
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const std::size_t equals = arg.find('=');
    const absl::string_view name = arg.substr(0, equals);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    absl::string_view value;
    if (equals != absl::string_view::npos) {
      value = arg.substr(equals + 1);
    } else if (!flag->IsOfType<bool>() && i + 1 < args.size()) {
      value = args[++i];
    } else {
      continue;
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      // Abseil's error starts by naming the flag and the value again.
      absl::string_view detail = error;
      if (absl::ConsumePrefix(&detail, absl::StrCat("Illegal value '", value,
                                                    "' specified for flag '", name, "'"))) {
        absl::ConsumePrefix(&detail, "; ");
      }
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, "=", value, ": ",
                       detail.empty() ? "not a valid value for this flag" : detail));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ParseBytes(absl::string_view text) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  std::size_t digits = 0;
  while (digits < t.size() && (std::isdigit(static_cast<unsigned char>(t[digits])) || t[digits] == '.')) {
    ++digits;
  }
  double number = 0;
  std::string unit = absl::AsciiStrToLower(absl::StripAsciiWhitespace(t.substr(digits)));
  if (digits == 0 || !absl::SimpleAtod(t.substr(0, digits), &number)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "' is not a byte count; expected e.g. 1073741824, 512MiB, 1GiB or 2GB"));
  }
  double scale = 1;
  if (unit.empty() || unit == "b") {
    scale = 1;
  } else if (unit == "kib" || unit == "k") {
    scale = 1024.0;
  } else if (unit == "mib" || unit == "m") {
    scale = 1024.0 * 1024;
  } else if (unit == "gib" || unit == "g") {
    scale = 1024.0 * 1024 * 1024;
  } else if (unit == "tib" || unit == "t") {
    scale = 1024.0 * 1024 * 1024 * 1024;
  } else if (unit == "kb") {
    scale = 1e3;
  } else if (unit == "mb") {
    scale = 1e6;
  } else if (unit == "gb") {
    scale = 1e9;
  } else if (unit == "tb") {
    scale = 1e12;
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", text, "': unknown unit '", unit, "'; expected B, KiB, MiB, GiB, TiB, KB, MB, GB or TB"));
  }
  double bytes = number * scale;
  if (bytes > 9.0e18) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' is too large"));
  }
  return static_cast<int64_t>(bytes);
}

absl::StatusOr<int64_t> ParseBudget(absl::string_view text, int64_t base_bytes) {
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (absl::ConsumeSuffix(&t, "%")) {
    double pct = 0;
    if (!absl::SimpleAtod(t, &pct) || pct <= 0 || pct > 100) {
      return absl::InvalidArgumentError(absl::StrCat(
          "'", text, "' is not a percentage in (0, 100]; expected e.g. 80%"));
    }
    return static_cast<int64_t>(static_cast<double>(base_bytes) * pct / 100.0);
  }
  return ParseBytes(t);
}

}  // namespace dgmm
