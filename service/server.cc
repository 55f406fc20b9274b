#include "service/server.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "grpcpp/ext/proto_server_reflection_plugin.h"
#include "grpcpp/health_check_service_interface.h"
#include "service/util/log.h"

namespace dgmm {

absl::StatusOr<std::unique_ptr<Server>> Server::Start(const ServerOptions& options,
                                                      std::unique_ptr<Engine> engine) {
  std::unique_ptr<Server> s(new Server());
  s->engine_ = std::move(engine);
  s->service_ = std::make_unique<DgmmService>(s->engine_.get());

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->service_.get());
  const EngineOptions& eo = s->engine_->options();
  // Stream blocks travel in messages too: the limit must admit the largest block.
  const int64_t max_message = std::max<int64_t>(eo.max_unary_message_bytes,
                                                eo.limits.max_block_bytes + (int64_t{1} << 16));
  builder.SetMaxReceiveMessageSize(static_cast<int>(std::min<int64_t>(max_message, INT32_MAX)));
  builder.SetMaxSendMessageSize(static_cast<int>(std::min<int64_t>(max_message, INT32_MAX)));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.max_connection_idle)));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(absl::ToInt64Milliseconds(options.keepalive_time)));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
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
