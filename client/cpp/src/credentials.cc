#include "dgmm/credentials.h"

#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace dgmm {
namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path, absl::string_view what) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream contents;
  if (file) contents << file.rdbuf();
  if (!file || file.bad()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " file '", path, "'"));
  }
  if (contents.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("the ", what, " file '", path, "' is empty"));
  }
  return contents.str();
}

}  // namespace

absl::Status CheckTlsOptions(const TlsOptions& tls) {
  if (tls.cert_chain_pem.empty() != tls.private_key_pem.empty()) {
    return absl::InvalidArgumentError(
        "TLS: a client certificate needs its private key and a key needs its certificate; give "
        "both (mutual TLS) or neither");
  }
  return absl::OkStatus();
}

absl::Status CheckBearerToken(const std::string& token) {
  if (token.empty()) return absl::InvalidArgumentError("the bearer token is empty");
  for (char c : token) {
    if (c < 0x21 || c > 0x7e) {
      return absl::InvalidArgumentError(
          "the bearer token may hold only visible ASCII characters (no spaces or control "
          "characters)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<TlsOptions> LoadTlsFiles(const std::string& root_ca_path,
                                        const std::string& cert_chain_path,
                                        const std::string& private_key_path) {
  TlsOptions tls;
  struct Field {
    const std::string& path;
    std::string* pem;
    const char* what;
  };
  for (const Field& field : {Field{root_ca_path, &tls.root_ca_pem, "CA certificate"},
                             Field{cert_chain_path, &tls.cert_chain_pem, "client certificate"},
                             Field{private_key_path, &tls.private_key_pem, "client key"}}) {
    if (field.path.empty()) continue;
    absl::StatusOr<std::string> pem = ReadFile(field.path, field.what);
    if (!pem.ok()) return pem.status();
    *field.pem = *std::move(pem);
  }
  if (absl::Status usable = CheckTlsOptions(tls); !usable.ok()) return usable;
  return tls;
}

absl::StatusOr<std::string> LoadBearerToken(const std::string& path) {
  absl::StatusOr<std::string> contents = ReadFile(path, "bearer token");
  if (!contents.ok()) return contents.status();
  std::string token(absl::StripAsciiWhitespace(*contents));
  if (absl::Status usable = CheckBearerToken(token); !usable.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(usable.message(), " (from '", path, "')"));
  }
  return token;
}

}  // namespace dgmm
