#include "service/server.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "service/util/log.h"

namespace dgmm {

namespace {

absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& path) {
  std::ifstream f(path);
  if (!f) return absl::InvalidArgumentError(absl::StrCat("--", flag, ": cannot read ", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> Credentials(const ServerOptions& o) {
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls_cert and --tls_key must be given together");
  }
  if (o.tls_cert_file.empty()) {
    if (!o.tls_client_ca_file.empty()) {
      return absl::InvalidArgumentError("--tls_client_ca needs --tls_cert and --tls_key");
    }
    return grpc::InsecureServerCredentials();
  }
  auto cert = ReadPem("tls_cert", o.tls_cert_file);
  if (!cert.ok()) return cert.status();
  auto key = ReadPem("tls_key", o.tls_key_file);
  if (!key.ok()) return key.status();
  grpc::SslServerCredentialsOptions ssl;
  ssl.pem_key_cert_pairs.push_back({*key, *cert});
  if (!o.tls_client_ca_file.empty()) {
    auto ca = ReadPem("tls_client_ca", o.tls_client_ca_file);
    if (!ca.ok()) return ca.status();
    ssl.pem_root_certs = *ca;
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      std::unique_ptr<Engine> engine) {
  std::unique_ptr<Server> s(new Server());
  s->engine_ = std::move(engine);
  std::optional<TokenAuth> auth;
  if (!options.auth_token_file.empty()) {
    auto loaded = TokenAuth::FromFile(options.auth_token_file);
    if (!loaded.ok()) return loaded.status();
    auth = std::move(*loaded);
  }
  auto credentials = Credentials(options);
  if (!credentials.ok()) return credentials.status();
  s->service_ = std::make_unique<DgmmService>(s->engine_.get(), auth);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, *credentials, &s->port_);
  builder.RegisterService(s->service_.get());
  if (options.enable_bench_echo) {
    s->echo_ = std::make_unique<EchoService>(s->engine_.get(), auth);
    builder.RegisterService(s->echo_.get());
  }
  const EngineOptions& eo = s->engine_->options();
  // Stream blocks travel in messages too: the limit must admit the largest block.
  const int64_t max_message = std::max<int64_t>(eo.max_unary_message_bytes,
                                                eo.limits.max_block_bytes +
                                                    static_cast<int64_t>(kBlockFramingSlack));
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(max_message, INT32_MAX)));
  builder.SetMaxSendMessageSize(static_cast<int>(std::min<int64_t>(max_message, INT32_MAX)));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.max_connection_idle)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  // Keepalive must keep probing a peer that stopped reading, data or not.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  s->grpc_ = builder.BuildAndStart();
  if (s->grpc_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, " (address in use or invalid)"));
  }
  Server* raw = s.get();
  s->engine_->set_serving_listener([raw](bool serving) { raw->SetServing(serving); });
  s->SetServing(s->engine_->serving());

  if (!options.metrics_listen.empty()) {
    auto metrics = MetricsServer::Start(options.metrics_listen, s->engine_.get());
    if (!metrics.ok()) return metrics.status();
    s->metrics_ = std::move(*metrics);
  }
  return s;
}

Server::~Server() {
  metrics_.reset();
  if (grpc_ != nullptr) {
    grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc_->Wait();
  }
  engine_.reset();
}

void Server::SetServing(bool serving) {
  grpc::HealthCheckServiceInterface* health = grpc_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus(serving);
  health->SetServingStatus("dgmm.v1.Dgmm", serving);
}

bool Server::Drain(absl::Duration timeout) {
  SetServing(false);
  const bool clean = engine_->Drain(timeout);
  // Replies of finished jobs may still be on their way out: give them a moment.
  grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc_->Wait();
  grpc_.reset();
  return clean;
}

}  // namespace dgmm
