// Bearer-token authentication for dgmm's own RPCs. The health service and
// reflection stay open so that orchestrator probes and generic tools work.
#ifndef DGMM_SERVICE_RPC_AUTH_H_
#define DGMM_SERVICE_RPC_AUTH_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace dgmm {

class TokenAuth {
 public:
  // Reads the tokens from `path`: one per line, surrounding whitespace
  // trimmed, empty lines and lines starting with '#' skipped. Errors if the
  // file cannot be read or holds no token. Each token is a client of its own
  // for the fair share of the queue (docs/admission.md).
  static absl::StatusOr<TokenAuth> FromFile(const std::string& path);
  explicit TokenAuth(std::string token) : tokens_{std::move(token)} {}

  // OK when the call carries `authorization: Bearer <token>` for one of the
  // tokens; otherwise UNAUTHENTICATED. The comparison takes the same time
  // wherever the presented token first differs.
  absl::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const {
    return Match(metadata).status();
  }
  // As Check; on success, which token matched: 0 when there is only one,
  // else its 1-based line among the tokens.
  absl::StatusOr<int> Match(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

 private:
  explicit TokenAuth(std::vector<std::string> tokens) : tokens_(std::move(tokens)) {}
  std::vector<std::string> tokens_;
};

// Compares in time that depends only on the lengths, not on the contents.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_AUTH_H_
