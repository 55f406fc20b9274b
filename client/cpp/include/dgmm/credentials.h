// What a dgmm::Client presents to a server that requires it: TLS (server
// --tls_cert/--tls_key), a client certificate for mutual TLS (server
// --tls_client_ca) and a bearer token (server --auth_token_file).
#ifndef DGMM_CLIENT_CPP_INCLUDE_DGMM_CREDENTIALS_H_
#define DGMM_CLIENT_CPP_INCLUDE_DGMM_CREDENTIALS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace dgmm {

// TLS settings of a channel. Every field holds PEM text, not a path
// (LoadTlsFiles reads them from files).
struct TlsOptions {
  // CA certificates that signed the server's certificate; empty trusts the
  // system's root CAs.
  std::string root_ca_pem;
  // This client's certificate chain and private key, for a server that
  // requires mutual TLS; both or neither.
  std::string cert_chain_pem;
  std::string private_key_pem;
  // The name checked against the server's certificate instead of the
  // target's host: for a certificate issued to a DNS name reached by IP, or
  // one address of several in a multi-address target. Empty checks the host.
  std::string server_name_override;
};

// Reads TlsOptions from PEM files; an empty path leaves its field empty.
// INVALID_ARGUMENT naming the file when one cannot be read or is empty, or
// when only one of cert_path and key_path is given.
absl::StatusOr<TlsOptions> LoadTlsFiles(const std::string& root_ca_path,
                                        const std::string& cert_chain_path,
                                        const std::string& private_key_path);

// Reads a bearer token from `path`, without surrounding whitespace.
// INVALID_ARGUMENT when the file cannot be read, is empty, or the token is
// not usable as metadata (see CheckBearerToken).
absl::StatusOr<std::string> LoadBearerToken(const std::string& path);

// OK when `token` can travel in `authorization: Bearer <token>`: non-empty
// and only visible ASCII (no spaces or control characters).
absl::Status CheckBearerToken(const std::string& token);

// OK when `tls` is usable: certificate chain and private key both or neither.
absl::Status CheckTlsOptions(const TlsOptions& tls);

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_INCLUDE_DGMM_CREDENTIALS_H_
