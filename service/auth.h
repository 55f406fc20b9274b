// Bearer-token authentication for dgmm's own RPCs. The health service and
// reflection stay open so that orchestrator probes and generic tools work.
#ifndef DGMM_SERVICE_AUTH_H_
#define DGMM_SERVICE_AUTH_H_

#include <map>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "grpcpp/grpcpp.h"

namespace dgmm {

class TokenAuth {
 public:
  // Reads the token from `path` (surrounding whitespace trimmed). Errors if
  // the file cannot be read or holds an empty token.
  static absl::StatusOr<TokenAuth> FromFile(const std::string& path);
  explicit TokenAuth(std::string token) : token_(std::move(token)) {}

  // OK when the call carries `authorization: Bearer <token>`; otherwise
  // UNAUTHENTICATED. The comparison takes the same time wherever the
  // presented token first differs.
  absl::Status Check(const std::multimap<grpc::string_ref, grpc::string_ref>& metadata) const;

 private:
  std::string token_;
};

// Compares in time that depends only on the lengths, not on the contents.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

}  // namespace dgmm

#endif  // DGMM_SERVICE_AUTH_H_
