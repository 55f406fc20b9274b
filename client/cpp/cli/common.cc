#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "cli/commands.h"
#include "util/flag_types.h"

ABSL_FLAG(std::string, server, "",
          "Server address HOST:PORT, or any gRPC target such as dns:///dgmm.example:50051. "
          "Empty (the default): the port of $DGMM_LISTEN on this host when that is set (the "
          "server's own setting, e.g. in its container), else 127.0.0.1:50051.");
ABSL_FLAG(double, deadline, 0,
          "Deadline of each RPC in seconds, for a job covering all of its attempts; 0 means "
          "none. An expired job fails with DEADLINE_EXCEEDED.");
ABSL_FLAG(dgmm::ByteSize, chunk_bytes, dgmm::ByteSize::MiB(4),
          "Largest block sent over MultiplyStream (whole rows or columns per block); at most "
          "the server's --max_block_bytes. Accepts 4194304, 4MiB, 1GiB, ...");
ABSL_FLAG(dgmm::ByteSize, max_unary_message_bytes, dgmm::ByteSize::MiB(16),
          "The server's --max_unary_message_bytes: no job over 7/8 of it is sent in one "
          "message.");
ABSL_FLAG(std::string, load_balancing_policy, "",
          "gRPC load-balancing policy, e.g. round_robin over a DNS name with several "
          "replicas; empty for gRPC's default.");
ABSL_FLAG(int, max_attempts, 4,
          "Attempts per job, the first included: a job that fails with UNAVAILABLE (or "
          "RESOURCE_EXHAUSTED with the server's retry-pushback hint) is tried again after a "
          "backoff, within --deadline. 1 turns retries off.");
ABSL_FLAG(bool, tls, false,
          "Connect with TLS, trusting the system's root CAs unless --tls_ca is given. Implied "
          "by --tls_ca, --tls_cert and --tls_key.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM file of the CA(s) that signed the server's certificate (server --tls_cert).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM file of this client's certificate chain, for a server that requires mutual TLS "
          "(server --tls_client_ca); needs --tls_key.");
ABSL_FLAG(std::string, tls_key, "", "PEM file of the private key of --tls_cert.");
ABSL_FLAG(std::string, tls_server_name, "",
          "Name to check the server's certificate against instead of the --server host, e.g. "
          "when a certificate for dgmm.example is reached by IP address.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding a bearer token (surrounding whitespace ignored), sent as "
          "'authorization: Bearer <token>' with every call (server --auth_token_file). Use "
          "with TLS: without it the token crosses the network in clear text.");
ABSL_FLAG(std::string, local_socket, "",
          "With --shm: the server's local socket as this process sees it (default: the path "
          "GetServerInfo reports). Set it in a container that mounts the socket's directory "
          "elsewhere.");
ABSL_FLAG(bool, quiet, false, "Print only errors (and what a subcommand exists to print).");

namespace dgmm::cli {

int ReportError(const absl::Status& status, int exit_code) {
  std::fprintf(stderr, "error: %s: %s\n", absl::StatusCodeToString(status.code()).c_str(),
               std::string(status.message()).c_str());
  return exit_code;
}

namespace {

// --tls*, --auth_token_file: TLS options and bearer token read from files.
absl::Status ApplySecurityFlags(ClientOptions* options) {
  const std::string ca = absl::GetFlag(FLAGS_tls_ca);
  const std::string cert = absl::GetFlag(FLAGS_tls_cert);
  const std::string key = absl::GetFlag(FLAGS_tls_key);
  const std::string server_name = absl::GetFlag(FLAGS_tls_server_name);
  if (absl::GetFlag(FLAGS_tls) || !ca.empty() || !cert.empty() || !key.empty()) {
    if (cert.empty() != key.empty()) {
      return absl::InvalidArgumentError("--tls_cert and --tls_key go together (mutual TLS)");
    }
    absl::StatusOr<TlsOptions> tls = LoadTlsFiles(ca, cert, key);
    if (!tls.ok()) return tls.status();
    tls->server_name_override = server_name;
    options->tls = *std::move(tls);
  } else if (!server_name.empty()) {
    return absl::InvalidArgumentError("--tls_server_name needs TLS (--tls or --tls_ca)");
  }
  const std::string token_file = absl::GetFlag(FLAGS_auth_token_file);
  if (!token_file.empty()) {
    absl::StatusOr<std::string> token = LoadBearerToken(token_file);
    if (!token.ok()) return token.status();
    options->bearer_token = *std::move(token);
  }
  return absl::OkStatus();
}

}  // namespace

std::string ServerFromListen(absl::string_view listen) {
  if (listen.empty()) return std::string(kDefaultServer);
  const size_t colon = listen.rfind(':');
  if (colon == absl::string_view::npos) return std::string(listen);
  const absl::string_view host = listen.substr(0, colon);
  const absl::string_view port = listen.substr(colon);  // ":PORT"
  // A wildcard address is bound on every interface, loopback included.
  if (host.empty() || host == "0.0.0.0" || host == "*") return absl::StrCat("127.0.0.1", port);
  if (host == "[::]") return absl::StrCat("[::1]", port);
  return std::string(listen);
}

std::string ServerAddress() {
  const std::string server = absl::GetFlag(FLAGS_server);
  if (!server.empty()) return server;
  const char* listen = std::getenv("DGMM_LISTEN");
  return ServerFromListen(listen == nullptr ? "" : listen);
}

absl::StatusOr<std::unique_ptr<Client>> MakeClient(int stripes, bool same_host,
                                                   bool process_memory) {
  ClientOptions options;
  options.stripes = stripes;
  options.same_host = same_host;
  options.process_memory = process_memory;
  const double deadline = absl::GetFlag(FLAGS_deadline);
  if (deadline < 0 || !std::isfinite(deadline)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--deadline=", deadline, " must be a positive number of seconds (or 0)"));
  }
  if (deadline > 0) options.deadline = absl::Seconds(deadline);
  options.chunk_bytes = absl::GetFlag(FLAGS_chunk_bytes).bytes;
  if (absl::Status s = CheckFlagRange("chunk_bytes", options.chunk_bytes, 1); !s.ok()) return s;
  options.max_unary_message_bytes = absl::GetFlag(FLAGS_max_unary_message_bytes).bytes;
  if (absl::Status s =
          CheckFlagRange("max_unary_message_bytes", options.max_unary_message_bytes, 1);
      !s.ok()) {
    return s;
  }
  options.load_balancing_policy = absl::GetFlag(FLAGS_load_balancing_policy);
  options.local_socket = absl::GetFlag(FLAGS_local_socket);
  options.retry.max_attempts = absl::GetFlag(FLAGS_max_attempts);
  if (options.retry.max_attempts < 1) {
    return absl::InvalidArgumentError("--max_attempts must be at least 1 (1: no retries)");
  }
  if (absl::Status security = ApplySecurityFlags(&options); !security.ok()) return security;
  return Client::Create(ServerAddress(), options);
}

namespace {

// "BACKEND_CUDA_KERNEL" -> "cuda_kernel".
std::string ShortName(const std::string& enum_name, absl::string_view prefix) {
  std::string name = absl::AsciiStrToLower(enum_name);
  if (absl::StartsWith(enum_name, prefix)) name.erase(0, prefix.size());
  return name;
}

}  // namespace

std::string BackendName(v1::Backend backend) {
  return ShortName(v1::Backend_Name(backend), "BACKEND_");
}

std::string DTypeName(v1::DType dtype) { return ShortName(v1::DType_Name(dtype), "DTYPE_"); }

std::string FormatBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (std::fabs(value) >= 1024 && unit < 5) {
    value /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.1f %s", value, kUnits[unit]);
}

}  // namespace dgmm::cli
