#include "service/server.h"

#include <algorithm>
#include <fstream>
#include <optional>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/resource_quota.h"
#include "proto/wire.h"
#include "service/rpc/server_info.h"
#include "service/rpc/inline_reactions.h"
#include "service/core/log.h"

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
  s->shutdown_grace_ = options.shutdown_grace;
  std::optional<TokenAuth> auth;
  if (!options.auth_token_file.empty()) {
    auto loaded = TokenAuth::FromFile(options.auth_token_file);
    if (!loaded.ok()) return loaded.status();
    auth = std::move(*loaded);
  }
  auto credentials = Credentials(options);
  if (!credentials.ok()) return credentials.status();
  // Multiply requests not yet admitted get half the transport budget (at
  // least one largest request); the other half is for stream blocks in
  // flight, connections and the windows of calls waiting at the gate. With
  // all of it for requests, gRPC's quota still cancelled a few of a flood's
  // calls (hardening_test's flood: 5 of 48 retried).
  const int64_t unary_receive = std::max<int64_t>(
      options.transport_memory_bytes / 2, s->engine_->options().limits.max_unary_message_bytes);
  RegionOptions region_options;
  region_options.enabled = options.allow_regions;
  region_options.budget_bytes =
      options.region_memory_budget.Of(s->engine_->cpu().free_memory_at_start_bytes());
  region_options.max_per_client = options.max_regions_per_client;
  region_options.max_uid_share_percent = options.max_region_share_percent;
  region_options.idle_timeout = options.region_idle_timeout;
  region_options.pin_on_register = options.pin_regions_on_register;
  s->regions_ = std::make_unique<RegionRegistry>(region_options, GpuRegionOps(*s->engine_));
  s->service_ =
      std::make_unique<DgmmService>(s->engine_.get(), auth, options.stream_timeouts, unary_receive,
                                    options.max_waiting_unary_calls, s->regions_.get());
  s->service_->set_trusted_proxies(options.trusted_proxies);
  s->service_->set_multiply_small(options.multiply_small);
  s->generic_ = std::make_unique<DgmmGenericService>(s->service_.get());
  s->oip_ = std::make_unique<OipService>(s->service_.get(), s->generic_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  if (options.transport_memory_bytes > 0) {
    grpc::ResourceQuota quota("dgmm-transport");
    quota.Resize(static_cast<size_t>(options.transport_memory_bytes));
    builder.SetResourceQuota(quota);
  }
  // Requests are never inflated: gzip and deflate are not offered, a call
  // that uses them anyway is refused by gRPC before its message is read
  // (UNIMPLEMENTED, "Compression algorithm 'gzip' is disabled"), and the
  // decompression filter is left out. The payloads are floating point and
  // would not compress; a compressed all-zero matrix would inflate ~1000x.
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_DEFLATE, false);
  builder.SetCompressionAlgorithmSupportStatus(GRPC_COMPRESS_GZIP, false);
  builder.AddChannelArgument(GRPC_ARG_ENABLE_PER_MESSAGE_DECOMPRESSION, 0);
  builder.AddListeningPort(options.listen, *credentials, &s->port_);
  builder.RegisterService(s->service_.get());
  builder.RegisterService(s->oip_.get());
  builder.RegisterCallbackGenericService(s->generic_.get());
  if (options.enable_bench_echo) {
    s->echo_ = std::make_unique<EchoService>(s->engine_.get(), auth);
    builder.RegisterService(s->echo_.get());
  }
  // gRPC checks its message limit only once a message has arrived whole
  // (message_size_filter), so it saves no memory; the handlers check each
  // message against its own limit instead (Multiply: --max_unary_message_bytes,
  // a stream block: --max_block_bytes plus framing) and count the refusal as
  // message_too_large (the unary control RPCs refuse theirs too, uncounted:
  // reactors.h, CheckRequestSize). What a message can hold while it arrives
  // is bounded by the transport quota above.
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, options.http2_bdp_probe ? 1 : 0);
  for (const auto& [key, value] : wire::ExtraChannelArgs()) builder.AddChannelArgument(key, value);
  builder.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.max_connection_idle)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_timeout)));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  // Keepalive must keep probing a peer that stopped reading, data or not.
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // A connection that has not finished its TLS and HTTP/2 handshakes in time
  // is closed (gRPC's default is 120 s): idle sockets opened by a flood give
  // their slot under --max_connections back soon.
  builder.AddChannelArgument(
      GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS,
      static_cast<int>(absl::ToInt64Milliseconds(options.handshake_timeout)));
  // The listener is in place before any job can run (a job that ends with a
  // device error calls it from a worker); it does nothing until the gRPC
  // server exists.
  Server* raw = s.get();
  s->engine_->set_serving_listener([raw](bool serving) { raw->SetServing(serving); });
  s->grpc_ = builder.BuildAndStart();
  if (s->grpc_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options.listen, " (address in use or invalid)"));
  }
  if (options.allow_regions) {
    // With --local_socket=auto regions are best effort (they are on by
    // default): where no place for the socket can be had (a read-only
    // root, say) the server serves without them and says why. A path given
    // is the operator's: failing to use it stops the start.
    const bool best_effort = options.local_socket == "auto";
    const auto regions_off = [&](const absl::Status& why) {
      s->regions_->Disable();
      LogInfo("warning: regions off, every client uses the gRPC socket: ", why.ToString(),
              " (give --local_socket a path, or --allow_regions=false to say so)");
    };
    LocalSocketOptions local;
    absl::Status made;
    if (best_effort) {
      auto path = DefaultLocalSocketPath(s->port_);
      if (path.ok()) {
        local.path = *path;
      } else {
        made = path.status();
      }
    } else {
      local.path = options.local_socket;
    }
    local.mode = options.local_socket_mode;
    local.max_connections = options.max_local_connections;
    local.process_memory = options.process_memory;
    local.max_connections_per_uid = std::max(1, options.max_local_connections / 4);
    local.instance_id = s->regions_->instance_id();
    if (made.ok()) made = s->regions_->StartLocalSocket(std::move(local));
    if (made.ok()) {
      LogInfo("regions: local socket ", s->regions_->local_socket_path());
    } else if (best_effort) {
      regions_off(made);
    } else {
      return made;
    }
  }
  {
    std::lock_guard lock(s->serving_mu_);
    s->health_ = s->grpc_->GetHealthCheckService();
  }
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
  {
    std::lock_guard lock(serving_mu_);
    health_ = nullptr;
  }
  if (grpc_ != nullptr) {
    grpc_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    grpc_->Wait();
  }
  // The registry outlives the engine (jobs still running hold its regions),
  // but pins go through the engine's GPUs: none may start once they go.
  if (regions_ != nullptr) regions_->StopPinning();
  engine_.reset();
}

void Server::SetServing(bool serving) {
  std::lock_guard lock(serving_mu_);
  if (health_ == nullptr) return;
  GrpcOpScope op;  // may write to health Watch calls (inline_reactions.h)
  health_->SetServingStatus(serving);
  health_->SetServingStatus("dgmm.v1.Dgmm", serving);
  health_->SetServingStatus("inference.GRPCInferenceService", serving);
}

bool Server::Drain(absl::Duration timeout) {
  SetServing(false);
  // No new region sessions: the socket file goes now (the process exits
  // without destructors after draining, main.cc).
  if (regions_ != nullptr && regions_->local_socket() != nullptr)
    regions_->local_socket()->Unlink();
  const bool clean = engine_->Drain(timeout);
  // Replies of finished jobs may still be on their way out, and calls that
  // arrive now are refused with UNAVAILABLE by the handlers: wait until no
  // call is in progress. gRPC's own Shutdown is not called: in gRPC 1.51 a
  // call that reaches an open connection after Shutdown has begun and before
  // its GOAWAY goes out is dropped by gRPC core, and its client sees
  // CANCELLED (src/core/lib/surface/server.cc, StartNewRpc: "ZOMBIED"). The
  // process exits instead (main.cc), closing every connection: a call caught
  // in flight then fails with UNAVAILABLE at its client, which may retry it.
  const absl::Time grace_end = absl::Now() + shutdown_grace_;
  while (service_->calls_in_progress() > 0 && absl::Now() < grace_end) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  return clean;
}

}  // namespace dgmm
