// Assembles the running server: the gRPC server with dgmm's service and the
// Open Inference Protocol over the same jobs, the standard health service
// and reflection, and the optional metrics endpoint.
#ifndef DGMM_SERVICE_SERVER_H_
#define DGMM_SERVICE_SERVER_H_

#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "service/rpc/echo_service.h"
#include "service/engine/engine.h"
#include "service/job/watchdog.h"
#include "service/rpc/dgmm_service.h"
#include "service/rpc/oip_service.h"
#include "service/metrics.h"

namespace dgmm {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";
  // Empty: no metrics endpoint.
  std::string metrics_listen;
  // Most concurrent RPCs (HTTP/2 streams) per client connection.
  int max_concurrent_streams = 64;
  // Connections idle this long are closed (keepalive pings keep them alive).
  absl::Duration max_connection_idle = absl::Minutes(10);
  absl::Duration keepalive_time = absl::Minutes(1);
  absl::Duration keepalive_timeout = absl::Seconds(20);
  // A connection that has not completed its TLS and HTTP/2 handshakes within
  // this time is closed.
  absl::Duration handshake_timeout = absl::Seconds(10);
  // TLS: PEM files. Both cert and key turn TLS on; a client CA also requires
  // and verifies client certificates (mutual TLS).
  std::string tls_cert_file;
  std::string tls_key_file;
  std::string tls_client_ca_file;
  // If set, dgmm's RPCs need `authorization: Bearer <token from this file>`.
  std::string auth_token_file;
  // Also serve the benchmark-only dgmm.bench.v1.Echo (service/rpc/echo_service.h).
  bool enable_bench_echo = false;
  // Serve MultiplySmall; false: UNIMPLEMENTED, as a server older than it.
  bool multiply_small = true;
  // gRPC's own memory (receive buffers of messages being read, connection
  // state) is held to this many bytes by a grpc::ResourceQuota: past it,
  // gRPC shrinks its flow-control windows, closes idle connections and then
  // cancels streams ("Buffers full", RESOURCE_EXHAUSTED) until it is back
  // under. 0: no quota.
  int64_t transport_memory_bytes = 0;
  // Peer addresses of proxies whose `x-forwarded-for` metadata names the
  // client for the fair share (docs/admission.md).
  std::vector<std::string> trusted_proxies;
  // gRPC's bandwidth-delay-product probe: on, gRPC grows every stream's
  // receive window with the link, so that calls waiting to be read hold up
  // to that window each in transport memory (a flood then meets the quota's
  // reclaimer, which cancels streams at random); off, a waiting call holds
  // one initial window (64 KiB) and a call being read is given a window for
  // the message it reads (docs/operations.md §12).
  bool http2_bdp_probe = false;
  // Most Multiply calls that may wait for room to have their request read
  // (ReceiveGate); beyond it they get RESOURCE_EXHAUSTED with a pushback.
  int max_waiting_unary_calls = 1024;
  // When quiet MultiplyStreams are ended (service/job/watchdog.h).
  StreamTimeouts stream_timeouts;
  // How long Drain waits, after the engine has drained, for calls still in
  // progress (replies on their way out, requests refused with UNAVAILABLE)
  // before gRPC cancels what is left.
  absl::Duration shutdown_grace = absl::Seconds(5);
  // Same-host regions (docs/protocol.md "Regions"): on, as --allow_regions.
  bool allow_regions = true;
  // Most bytes all registered regions hold at once: bytes, or a percentage
  // of the host's free memory at start.
  Budget region_memory_budget = Budget::Percent(25);
  int max_regions_per_client = 64;
  // --max_region_share_percent: most of the region budget one uid may hold.
  int max_region_share_percent = 50;
  // Pin host regions at registration, else on reuse (--region_pin).
  bool pin_regions_on_register = false;
  // A region no job used for this long is dropped; zero: never.
  absl::Duration region_idle_timeout = absl::Seconds(600);
  // The local socket of region sessions (service/regions/local_socket.h):
  // its path ("auto": DefaultLocalSocketPath of the bound port), the mode
  // of its file, and how many connections it takes.
  std::string local_socket = "auto";
  mode_t local_socket_mode = 0666;
  int max_local_connections = 1024;
  // LocalHello.process_memory may be granted (process_memory.h).
  bool process_memory = true;
};

class Server {
 public:
  // Starts listening. The engine must be fully constructed.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options,
                                                       std::unique_ptr<Engine> engine);
  ~Server();

  int port() const { return port_; }
  int metrics_port() const { return metrics_ ? metrics_->port() : 0; }
  Engine& engine() { return *engine_; }

  // Graceful drain: health turns NOT_SERVING at once, new calls get
  // UNAVAILABLE, queued and running jobs get up to `timeout` to finish, then
  // up to shutdown_grace for the calls still in progress to end. Returns true
  // if no job was cut short. The process should then exit without shutting
  // the gRPC server down (server.cc says why); destroying the Server shuts it
  // down (tests, or a drain that is not followed by an exit).
  bool Drain(absl::Duration timeout);

 private:
  Server() = default;
  void SetServing(bool serving);

  std::unique_ptr<Engine> engine_;
  // After the engine (its GPUs unpin and close region memory), before the
  // service that uses it.
  std::unique_ptr<RegionRegistry> regions_;
  std::unique_ptr<DgmmService> service_;
  std::unique_ptr<DgmmGenericService> generic_;
  // The Open Inference Protocol over the same jobs (service/rpc/oip_service.h).
  std::unique_ptr<OipService> oip_;
  std::unique_ptr<EchoService> echo_;  // null unless enable_bench_echo
  std::unique_ptr<grpc::Server> grpc_;
  std::unique_ptr<MetricsServer> metrics_;
  int port_ = 0;
  absl::Duration shutdown_grace_;
  // The health service, once the gRPC server runs (SetServing may be called
  // from job workers at any time).
  std::mutex serving_mu_;
  grpc::HealthCheckServiceInterface* health_ = nullptr;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_SERVER_H_
