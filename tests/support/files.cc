#include "tests/support/files.h"

#include <fstream>
#include <sstream>
#include <utility>

namespace dgmm::testing {

std::optional<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::ostringstream contents;
  contents << in.rdbuf();
  // An empty file sets failbit on the copy; only a read error is one.
  if (in.bad()) return std::nullopt;
  return std::move(contents).str();
}

}  // namespace dgmm::testing
