#include "cli/command_line.h"

#include "absl/flags/commandlineflag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "util/flag_names.h"

namespace dgmm::cli {
namespace {

absl::Status UsageError(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(what, "; run 'dgmm-cli --help' for usage"));
}

}  // namespace

absl::StatusOr<CommandLine> ParseCommandLine(int argc, char** argv) {
  const std::vector<std::string> args = NormalizeFlagNames(argc, argv);
  CommandLine result;
  bool only_positional = false;
  for (size_t i = 1; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (only_positional || arg.size() < 2 || arg[0] != '-') {
      if (result.positional.empty() && arg == "help") result.help = true;
      result.positional.emplace_back(arg);
      continue;
    }
    if (arg == "--") {
      only_positional = true;
      continue;
    }
    arg.remove_prefix(arg[1] == '-' ? 2 : 1);
    const size_t equals = arg.find('=');
    const absl::string_view name = arg.substr(0, equals);
    if (name == "help" || name == "h" || name == "helpfull") {
      result.help = true;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string value;
    if (flag == nullptr && absl::StartsWith(name, "no") && equals == absl::string_view::npos) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag != nullptr && !flag->IsOfType<bool>()) flag = nullptr;
      value = "false";
    } else if (flag != nullptr && equals != absl::string_view::npos) {
      value = std::string(arg.substr(equals + 1));
    } else if (flag != nullptr && flag->IsOfType<bool>()) {
      value = "true";
    } else if (flag != nullptr) {
      if (i + 1 == args.size()) {
        return UsageError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = args[++i];
    }
    if (flag == nullptr) return UsageError(absl::StrCat("unknown flag --", name));
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return UsageError(absl::StrCat("bad value '", value, "' for --", name, ": ", error));
    }
  }
  return result;
}

}  // namespace dgmm::cli
