#include "service/rpc/auth.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace dgmm {

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Walk the presented value fully whatever the expected length, so that
  // neither a mismatch position nor the expected length shows in the timing
  // beyond the presented length.
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const unsigned char expected = b.empty() ? 0 : static_cast<unsigned char>(b[i % b.size()]);
    diff |= static_cast<unsigned char>(a[i]) ^ expected;
  }
  return diff == 0;
}

absl::StatusOr<TokenAuth> TokenAuth::FromFile(const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::InvalidArgumentError(absl::StrCat("--auth_token_file: cannot read ", path));
  std::vector<std::string> tokens;
  std::string line;
  while (std::getline(f, line)) {
    const absl::string_view t = absl::StripAsciiWhitespace(line);
    if (t.empty() || t.front() == '#') continue;
    tokens.emplace_back(t);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--auth_token_file: ", path, " holds no token"));
  }
  return TokenAuth(std::move(tokens));
}

absl::StatusOr<int> TokenAuth::Match(
    const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
  auto it = metadata.find("authorization");
  if (it == metadata.end()) {
    return absl::UnauthenticatedError(
        "this server requires a bearer token: send metadata 'authorization: Bearer <token>'");
  }
  absl::string_view value(it->second.data(), it->second.size());
  constexpr absl::string_view kBearer = "Bearer ";
  if (value.size() >= kBearer.size() && value.substr(0, kBearer.size()) == kBearer) {
    const absl::string_view presented = value.substr(kBearer.size());
    // Every token is compared, so the timing does not tell which matched.
    int matched = -1;
    for (std::size_t i = 0; i < tokens_.size(); ++i) {
      if (ConstantTimeEquals(presented, tokens_[i]) && matched < 0) matched = static_cast<int>(i);
    }
    if (matched >= 0) return tokens_.size() == 1 ? 0 : matched + 1;
  }
  return absl::UnauthenticatedError("the bearer token is not valid for this server");
}

}  // namespace dgmm
