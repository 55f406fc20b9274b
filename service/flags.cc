#include "service/flags.h"

#include <algorithm>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "service/core/log.h"
#include "service/engine/server_backend.h"
#include "service/job/stream_job.h"
#include "util/flag_names.h"
#include "util/flag_types.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:50051",
          "gRPC listen address HOST:PORT. Use 0.0.0.0:50051 to accept remote clients; port 0 "
          "picks a free port (see --port_file).");
ABSL_FLAG(std::string, port_file, "",
          "If set, write the port actually bound to this file (a number and a newline) once "
          "serving. For tests and supervisors that use --listen=...:0.");
ABSL_FLAG(dgmm::ServerBackend, backend, dgmm::ServerBackend::kAuto,
          "Where BACKEND_AUTO jobs run: auto (GPU if one is usable, else CPU, said at start), "
          "cpu, cuda (GPU, fastest kernel), cuda-kernel (dgmm's kernel) or cublas "
          "(cublas<t>dgmm). Clients may still ask for a specific backend per job.");
ABSL_FLAG(dgmm::ByteSize, auto_cpu_max_bytes, dgmm::ByteSize::MiB(1),
          "With --backend=auto on a host with a GPU: BACKEND_AUTO jobs sent over the socket "
          "(Multiply, MultiplyStream, MultiplyBatch) or run on host regions (MultiplyRegion, "
          "the same-host path) whose matrix is at most this size run on the CPU backend, since "
          "a GPU job's fixed cost (device set-up, a copy each way, a synchronization, a thread "
          "hop) is more than such a job. JobStats.backend says where a job ran; GetServerInfo "
          "limits.auto_cpu_max_bytes says the value in force. 0: every BACKEND_AUTO job on the "
          "GPU.");
ABSL_FLAG(dgmm::ByteSize, max_unary_message_bytes, dgmm::ByteSize::MiB(16),
          "Largest Multiply request accepted (bytes, or with a unit: 64MiB). Larger matrices "
          "must use MultiplyStream, which the dgmm clients do on their own.");
ABSL_FLAG(dgmm::ByteSize, max_block_bytes, dgmm::ByteSize::MiB(4),
          "Largest MultiplyStream block payload. A streamed job holds a few blocks each way.");
ABSL_FLAG(int64_t, max_batch_jobs, 4096,
          "Most jobs one MultiplyBatch request may carry; a larger batch gets "
          "RESOURCE_EXHAUSTED. The whole request is also held to --max_unary_message_bytes.");
ABSL_FLAG(int64_t, max_dim, int64_t{1} << 20,
          "Largest rows or cols of a job; larger shapes get RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, threads, 0, "CPU backend worker threads; 0 = one per hardware thread.");
ABSL_FLAG(dgmm::Budget, host_memory_budget, dgmm::Budget::Percent(50),
          "Host memory that CPU jobs and all host-side buffers of jobs (request and result "
          "payloads, stream windows) may reserve at once: bytes (8GiB) or a percentage of "
          "MemAvailable at start (50%).");
ABSL_FLAG(dgmm::Budget, gpu_memory_budget, dgmm::Budget::Percent(80),
          "Device memory jobs may reserve per GPU: bytes (1GiB) or a percentage of the "
          "device's free memory at start (80%).");
ABSL_FLAG(int, max_queue, 1024,
          "Most jobs waiting for budget at once. When it is full, a new job takes the place of "
          "the newest job of the client with the most waiting, which gets RESOURCE_EXHAUSTED "
          "with a grpc-retry-pushback-ms hint (the newcomer gets it when its own client has the "
          "most).");
ABSL_FLAG(int, max_head_wait_ms, 2000,
          "Queue fairness: jobs that fit may pass a larger job at the queue's head only until "
          "it has waited this long; then nothing passes it.");
ABSL_FLAG(std::string, metrics_listen, "",
          "If set (HOST:PORT), serve Prometheus metrics at http://HOST:PORT/metrics.");
ABSL_FLAG(int, drain_timeout_s, 30,
          "On SIGTERM/SIGINT: seconds queued and running jobs get to finish before exit.");
ABSL_FLAG(int, max_concurrent_streams, 64,
          "Most concurrent RPCs per client connection; further calls wait on the client side.");
ABSL_FLAG(int, stream_header_timeout_s, 30,
          "A MultiplyStream that sends no header within this many seconds is ended with "
          "DEADLINE_EXCEEDED.");
ABSL_FLAG(int, stream_first_block_timeout_s, 10,
          "An admitted MultiplyStream that sends no block within this many seconds of its "
          "acceptance is ended with DEADLINE_EXCEEDED and its memory given back.");
ABSL_FLAG(int, max_running_per_client, 8,
          "Fair share: jobs one client connection may have admitted within its share; its "
          "further jobs wait behind other clients' jobs and run when no job within its share "
          "waits for room (never refused for it). 0 = no limit.");
ABSL_FLAG(int, max_queued_per_client, 0,
          "Hard cap: most jobs one client connection may have waiting for admission; beyond it "
          "its jobs get RESOURCE_EXHAUSTED (client_limit) with a grpc-retry-pushback-ms hint. "
          "0 = no cap (default): a full queue is shared by displacement (--max_queue).");
ABSL_FLAG(int, max_client_share_percent, 50,
          "Fair share: most of each memory budget one client host (its bearer token, else its "
          "address) may hold within its share while it has a job running; beyond it its jobs "
          "wait behind others' and run when nobody else needs the room. 100 = no limit.");
ABSL_FLAG(std::string, trusted_proxies, "",
          "Comma-separated peer addresses (e.g. 10.0.0.5,::1) of proxies trusted to name the "
          "client: from them, the first address of the x-forwarded-for metadata is the client "
          "for the fair share. Empty: none (every client behind a proxy shares its address; "
          "each connection still takes its own turn).");
ABSL_FLAG(bool, http2_bdp_probe, false,
          "Let gRPC grow stream windows with the link's bandwidth-delay product. Off (default), "
          "a call waiting to be read holds at most one 64 KiB window of transport memory, so "
          "that honest floods never reach the transport quota's reclaimer (which cancels "
          "streams at random); on, waiting calls hold larger windows.");
ABSL_FLAG(std::string, transport_memory_budget, "auto",
          "Memory gRPC itself may hold (messages being received, connection buffers), as a "
          "grpc::ResourceQuota: bytes (128MiB), or auto = half the host budget within [64MiB, "
          "256MiB], and at least --max_unary_message_bytes + 16MiB (a unary request is held "
          "whole). "
          "Past it gRPC shrinks its windows, closes idle connections, then cancels streams with "
          "RESOURCE_EXHAUSTED. The server's peak memory is about --host_memory_budget plus this "
          "plus a fixed overhead (docs/operations.md).");
ABSL_FLAG(int, handshake_timeout_s, 10,
          "A connection that has not completed its TLS and HTTP/2 handshakes within this many "
          "seconds is closed (a socket opened and left silent gives its slot back).");
ABSL_FLAG(int, max_connections, 4096,
          "Most client connections held at once (counted as open file descriptors beyond the "
          "server's own); a connection beyond it is closed at once (the client sees "
          "UNAVAILABLE). Also kept 64 below the open-files limit, which the server raises to "
          "its hard limit at start.");
ABSL_FLAG(int, stream_idle_timeout_s, 120,
          "An admitted MultiplyStream that neither sends a block nor takes a result for this "
          "many seconds is ended with DEADLINE_EXCEEDED and its memory given back.");
ABSL_FLAG(int, max_connection_idle_s, 600,
          "Connections with no call for this long are closed (clients reconnect on demand).");
ABSL_FLAG(int, keepalive_time_s, 60,
          "Interval of the server's keepalive pings on idle-but-open connections; a peer that "
          "does not answer is dropped.");
ABSL_FLAG(int, keepalive_timeout_s, 20,
          "How long the server waits for a keepalive ping's answer before it drops the "
          "connection and cancels its jobs (a frozen or vanished client).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate chain of the server. With --tls_key, the server speaks TLS only.");
ABSL_FLAG(std::string, tls_key, "", "PEM private key for --tls_cert.");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: when set, clients must present a certificate signed by it (mutual "
          "TLS); others fail the handshake.");
ABSL_FLAG(std::string, auth_token_file, "",
          "File holding a bearer token. When set, dgmm's RPCs need metadata 'authorization: "
          "Bearer <token>' (UNAUTHENTICATED otherwise); health and reflection stay open for "
          "probes.");
ABSL_FLAG(int, cuda_streams, 4,
          "CUDA streams per GPU; a job's tiles round-robin over them so that copies in both "
          "directions and kernels overlap.");
ABSL_FLAG(int, cuda_pieces_in_flight, 0,
          "Tiles of one job queued on the GPU at once; 0 = 2 x --cuda_streams. A streamed job "
          "reserves 2 x this many tiles of device memory.");
ABSL_FLAG(dgmm::ByteSize, cuda_tile_bytes, dgmm::ByteSize::MiB(8),
          "Pipeline tile size on the GPU: one device slot, and one pinned staging buffer "
          "(2 x --cuda_pieces_in_flight of them per GPU, allocated only if a job brings "
          "pageable memory; the RPCs receive into pinned memory and need none).");
ABSL_FLAG(bool, enable_bench_echo, false,
          "Also serve dgmm.bench.v1.Echo, a benchmark-only RPC with MultiplyStream's shape that "
          "returns each block unchanged (the transport floor bench/stream_bench.sh compares "
          "jobs with). Leave off in production.");
ABSL_FLAG(bool, multiply_small, true,
          "Serve MultiplySmall, the cheaper unary method the dgmm clients use for small jobs "
          "(requests of at most 256 KiB). false answers it UNIMPLEMENTED, as a server older than "
          "the method does, and the clients send those jobs with Multiply: for comparisons and "
          "client tests.");
ABSL_FLAG(bool, allow_regions, true,
          "Serve the region RPCs (RegisterRegion, MultiplyRegion...) and the local socket "
          "(--local_socket): clients on this host pass the descriptors of their own memory "
          "(memfd, shm_open, CUDA VMM) or CUDA IPC handles, or their own memory "
          "(--process_memory), and run jobs with no payload on the gRPC socket. On by "
          "default, so that the C++, Python and Node clients and dgmm-cli on this host take "
          "the same-host path without flags. The server maps only memory a client passed "
          "it, so a client reaches nothing it could not open itself; regions belong to the "
          "client's uid (docs/protocol.md \"Regions\"). --allow_regions=false: no local "
          "socket, region RPCs are FAILED_PRECONDITION, every client uses the gRPC socket.");
ABSL_FLAG(std::string, local_socket, "auto",
          "With --allow_regions: path of the Unix socket where clients on this host get a "
          "region session and pass their memory's descriptors. 'auto': "
          "/run/dgmm/dgmm-<port>.sock when the server can write /run/dgmm (root, or the "
          "container image, which makes it the server's), else "
          "$XDG_RUNTIME_DIR/dgmm-<port>.sock, else /tmp/dgmm-<uid>/dgmm-<port>.sock. "
          "GetServerInfo reports it (limits.local_socket). In containers, share its directory "
          "through a volume.");
ABSL_FLAG(std::string, local_socket_mode, "0666",
          "Permission bits (octal) of the --local_socket file: who on this host may connect. "
          "Anyone is safe (a client registers only memory it could open itself, and its regions "
          "are its uid's alone); 0660 with a group limits regions to that group.");
ABSL_FLAG(int, max_local_connections, 1024,
          "Most connections the local socket holds at once (one per client object using "
          "regions: a C++, Python or Node Client); one uid may hold a quarter of them.");
ABSL_FLAG(bool, process_memory, true,
          "With --allow_regions: a client on this host whose local-socket hello asks for it "
          "may name its own memory in MultiplyRegion (RegionRef.process_address): the server "
          "copies the matrix out of the client process and the result into it "
          "(process_vm_readv/writev), with no region and no copy in the client. Granted only to "
          "a process of the server's own uid in its PID namespace, which the kernel lets it "
          "read (docs/protocol.md \"Process memory\"); others use regions.");
ABSL_FLAG(dgmm::Budget, region_memory_budget, dgmm::Budget::Percent(25),
          "Most bytes all registered regions may hold at once (host regions are mapped and, "
          "on a GPU server, pinned: pinned memory is scarce): bytes (e.g. 8GiB) or a "
          "percentage of the host's free memory at start (e.g. 25%).");
ABSL_FLAG(std::string, region_pin, "reuse",
          "When a GPU server pins a host region for DMA: 'reuse' (registration only maps; a "
          "region's first job streams through the GPU's pinned staging, and the region is "
          "pinned in the background once a second job uses it) or 'register' (while "
          "RegisterRegion runs: ~50 ms per 100 MB on an H200). On the H200, registering and "
          "running a first job at N=10000 took 67 ms with 'reuse' and 212 ms with 'register' "
          "(bench/results/regions/h200_c40dbc3/).");
ABSL_FLAG(int, max_regions_per_client, 64,
          "Most regions one owner (a uid, with its bearer token when the server has several) "
          "may have registered at once.");
ABSL_FLAG(int, max_region_share_percent, 50,
          "Most of --region_memory_budget one uid's regions may hold, in percent (1-100): so "
          "that no local user can register the whole budget (a sparse memfd costs nothing) "
          "and shut the others out of regions.");
ABSL_FLAG(int, region_idle_timeout_s, 600,
          "A region no job has used for this many seconds is unregistered by the server; 0 = "
          "never. A region is also unregistered when the local-socket connection it was "
          "registered through closes (its client exited).");
ABSL_FLAG(std::string, log_format, "text",
          "How the server's log lines on stderr are written: 'text' (a timestamp, 'dgmm:', the "
          "message) or 'json' (one JSON object per line, for a log shipper: time, level, msg; "
          "a job's line also has its id, RPC, client, trace ids, status, device, bytes and "
          "stage times; docs/operations.md \"Logs\"). gRPC's own messages stay text.");
ABSL_FLAG(bool, log_jobs, true,
          "One log line per job that ends or is refused once its header is valid, naming its RPC, "
          "client and W3C trace context (traceparent). false: only the parts of striped jobs "
          "are logged. A line costs a write to stderr, which MultiplyBatch pays per job.");


namespace dgmm {
namespace {

// What the flags' types cannot say: the ranges of numbers. Errors name the
// flag. The CUDA flags are checked on every host, so that a bad one fails
// here too and not only where a GPU is found.
absl::Status CheckFlagRanges() {
  // Durations gRPC takes as int milliseconds (and the drain timeout, for symmetry).
  constexpr int64_t kMaxSeconds = INT32_MAX / 1000;
  const absl::Status checks[] = {
      CheckFlagRange("max_unary_message_bytes", absl::GetFlag(FLAGS_max_unary_message_bytes).bytes,
                     1),
      CheckFlagRange("max_block_bytes", absl::GetFlag(FLAGS_max_block_bytes).bytes, 1,
                     INT32_MAX - static_cast<int64_t>(kBlockFramingSlack)),
      CheckFlagRange("max_dim", absl::GetFlag(FLAGS_max_dim), 1),
      CheckFlagRange("max_batch_jobs", absl::GetFlag(FLAGS_max_batch_jobs), 0, 1 << 20),
      CheckFlagRange("threads", absl::GetFlag(FLAGS_threads), 0, 4096),
      CheckFlagRange("max_queue", absl::GetFlag(FLAGS_max_queue), 1),
      CheckFlagRange("max_head_wait_ms", absl::GetFlag(FLAGS_max_head_wait_ms), 0),
      CheckFlagRange("drain_timeout_s", absl::GetFlag(FLAGS_drain_timeout_s), 0, kMaxSeconds),
      CheckFlagRange("max_concurrent_streams", absl::GetFlag(FLAGS_max_concurrent_streams), 1),
      CheckFlagRange("stream_header_timeout_s", absl::GetFlag(FLAGS_stream_header_timeout_s), 1),
      CheckFlagRange("stream_idle_timeout_s", absl::GetFlag(FLAGS_stream_idle_timeout_s), 1),
      CheckFlagRange("stream_first_block_timeout_s",
                     absl::GetFlag(FLAGS_stream_first_block_timeout_s), 1),
      CheckFlagRange("max_running_per_client", absl::GetFlag(FLAGS_max_running_per_client), 0),
      CheckFlagRange("max_queued_per_client", absl::GetFlag(FLAGS_max_queued_per_client), 0),
      CheckFlagRange("max_client_share_percent", absl::GetFlag(FLAGS_max_client_share_percent), 1,
                     100),
      CheckFlagRange("max_connections", absl::GetFlag(FLAGS_max_connections), 1),
      CheckFlagRange("max_local_connections", absl::GetFlag(FLAGS_max_local_connections), 1,
                     1 << 20),
      CheckFlagRange("max_regions_per_client", absl::GetFlag(FLAGS_max_regions_per_client), 1,
                     1024),
      CheckFlagRange("max_region_share_percent", absl::GetFlag(FLAGS_max_region_share_percent),
                     1, 100),
      CheckFlagRange("region_idle_timeout_s", absl::GetFlag(FLAGS_region_idle_timeout_s), 0,
                     kMaxSeconds),
      CheckFlagRange("handshake_timeout_s", absl::GetFlag(FLAGS_handshake_timeout_s), 1, 3600),
      CheckFlagRange("max_connection_idle_s", absl::GetFlag(FLAGS_max_connection_idle_s), 1,
                     kMaxSeconds),
      CheckFlagRange("keepalive_time_s", absl::GetFlag(FLAGS_keepalive_time_s), 1, kMaxSeconds),
      CheckFlagRange("keepalive_timeout_s", absl::GetFlag(FLAGS_keepalive_timeout_s), 1,
                     kMaxSeconds),
      // The ranges CreateCudaDevices enforces, checked on hosts without a GPU too.
      CheckFlagRange("cuda_streams", absl::GetFlag(FLAGS_cuda_streams), 1, 64),
      CheckFlagRange("cuda_pieces_in_flight", absl::GetFlag(FLAGS_cuda_pieces_in_flight), 0, 256),
      CheckFlagRange("cuda_tile_bytes", absl::GetFlag(FLAGS_cuda_tile_bytes).bytes, 16),
  };
  for (const absl::Status& s : checks) {
    if (!s.ok()) return s;
  }
  if (const std::string format = absl::GetFlag(FLAGS_log_format);
      format != "text" && format != "json") {
    return absl::InvalidArgumentError(
        absl::StrCat("--log_format=", format, " is not 'text' or 'json'"));
  }
  if (const std::string pin = absl::GetFlag(FLAGS_region_pin);
      pin != "reuse" && pin != "register") {
    return absl::InvalidArgumentError(
        absl::StrCat("--region_pin=", pin, " is not 'reuse' or 'register'"));
  }
  return absl::OkStatus();
}


absl::StatusOr<mode_t> ParseMode(const std::string& mode) {
  char* end = nullptr;
  const long bits = std::strtol(mode.c_str(), &end, 8);
  if (mode.empty() || *end != '\0' || bits < 0 || bits > 0777) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--local_socket_mode must be octal permission bits such as 0666 or 0660, got '", mode,
        "'"));
  }
  return static_cast<mode_t>(bits);
}

EngineOptions EngineFlags() {
  EngineOptions eo;
  eo.backend = absl::GetFlag(FLAGS_backend);
  eo.host_memory_budget = absl::GetFlag(FLAGS_host_memory_budget);
  eo.gpu_memory_budget = absl::GetFlag(FLAGS_gpu_memory_budget);
  eo.max_queue = absl::GetFlag(FLAGS_max_queue);
  eo.max_head_wait = absl::Milliseconds(absl::GetFlag(FLAGS_max_head_wait_ms));
  eo.limits.max_dim = absl::GetFlag(FLAGS_max_dim);
  eo.limits.max_unary_message_bytes = absl::GetFlag(FLAGS_max_unary_message_bytes).bytes;
  eo.limits.max_block_bytes = absl::GetFlag(FLAGS_max_block_bytes).bytes;
  eo.limits.max_batch_jobs = absl::GetFlag(FLAGS_max_batch_jobs);
  eo.client_limits.max_running = absl::GetFlag(FLAGS_max_running_per_client);
  eo.client_limits.max_queued = absl::GetFlag(FLAGS_max_queued_per_client);
  eo.client_limits.max_share_percent = absl::GetFlag(FLAGS_max_client_share_percent);
  eo.auto_cpu_max_bytes = absl::GetFlag(FLAGS_auto_cpu_max_bytes).bytes;
  eo.log_jobs = absl::GetFlag(FLAGS_log_jobs);
  return eo;
}

absl::StatusOr<ServerOptions> ServerFlags() {
  ServerOptions so;
  so.listen = absl::GetFlag(FLAGS_listen);
  so.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  so.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  so.max_connection_idle = absl::Seconds(absl::GetFlag(FLAGS_max_connection_idle_s));
  so.keepalive_time = absl::Seconds(absl::GetFlag(FLAGS_keepalive_time_s));
  so.keepalive_timeout = absl::Seconds(absl::GetFlag(FLAGS_keepalive_timeout_s));
  so.handshake_timeout = absl::Seconds(absl::GetFlag(FLAGS_handshake_timeout_s));
  so.tls_cert_file = absl::GetFlag(FLAGS_tls_cert);
  so.tls_key_file = absl::GetFlag(FLAGS_tls_key);
  so.tls_client_ca_file = absl::GetFlag(FLAGS_tls_client_ca);
  so.auth_token_file = absl::GetFlag(FLAGS_auth_token_file);
  so.enable_bench_echo = absl::GetFlag(FLAGS_enable_bench_echo);
  so.multiply_small = absl::GetFlag(FLAGS_multiply_small);
  so.http2_bdp_probe = absl::GetFlag(FLAGS_http2_bdp_probe);
  for (absl::string_view p :
       absl::StrSplit(absl::GetFlag(FLAGS_trusted_proxies), ',', absl::SkipWhitespace())) {
    so.trusted_proxies.emplace_back(absl::StripAsciiWhitespace(p));
  }
  so.stream_timeouts.header = absl::Seconds(absl::GetFlag(FLAGS_stream_header_timeout_s));
  so.stream_timeouts.idle = absl::Seconds(absl::GetFlag(FLAGS_stream_idle_timeout_s));
  so.stream_timeouts.first_block =
      absl::Seconds(absl::GetFlag(FLAGS_stream_first_block_timeout_s));
  so.allow_regions = absl::GetFlag(FLAGS_allow_regions);
  so.pin_regions_on_register = absl::GetFlag(FLAGS_region_pin) == "register";
  so.region_memory_budget = absl::GetFlag(FLAGS_region_memory_budget);
  so.max_regions_per_client = absl::GetFlag(FLAGS_max_regions_per_client);
  so.max_region_share_percent = absl::GetFlag(FLAGS_max_region_share_percent);
  so.region_idle_timeout = absl::Seconds(absl::GetFlag(FLAGS_region_idle_timeout_s));
  so.local_socket = absl::GetFlag(FLAGS_local_socket);
  auto mode = ParseMode(absl::GetFlag(FLAGS_local_socket_mode));
  if (!mode.ok()) return mode.status();
  so.local_socket_mode = *mode;
  so.max_local_connections = absl::GetFlag(FLAGS_max_local_connections);
  so.process_memory = absl::GetFlag(FLAGS_process_memory);
  return so;
}

}  // namespace

absl::StatusOr<ServerConfig> ReadFlags(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "computes C = A·diag(d) (side right) or diag(d)·A (side left) for "
      "clients over gRPC,\non GPUs when the host has them and on the CPU otherwise.\n\n"
      "Usage: dgmm-server [--listen=127.0.0.1:50051] [--backend=auto] [flags]\n"
      "Every flag may also be set as an environment variable DGMM_<FLAG> (e.g. "
      "DGMM_LISTEN=0.0.0.0:50051);\nthe command line wins. Dashes and underscores in flag "
      "names are interchangeable.");
  absl::FlagsUsageConfig usage;
  usage.contains_help_flags = [](absl::string_view file) {
    return absl::StrContains(file, "service/flags.cc");
  };
  usage.version_string = [] { return std::string("dgmm-server " DGMM_VERSION "\n"); };
  absl::SetFlagsUsageConfig(usage);

  std::vector<std::string> args = NormalizeFlagNames(argc, argv);
  // absl::ParseCommandLine exits with 1 on a value that does not parse; a
  // usage error is 2 here, so the values are parsed once before it.
  if (absl::Status values = CheckFlagValues(args); !values.ok()) return values;
  std::vector<char*> cargs;
  for (auto& a : args) cargs.push_back(a.data());
  absl::ParseCommandLine(static_cast<int>(cargs.size()), cargs.data());
  auto from_env = ApplyFlagsFromEnv("DGMM_", args);
  if (!from_env.ok()) return from_env.status();
  if (absl::Status ranges = CheckFlagRanges(); !ranges.ok()) return ranges;
  SetLogFormat(absl::GetFlag(FLAGS_log_format) == "json" ? LogFormat::kJson : LogFormat::kText);

  ServerConfig config;
  config.engine = EngineFlags();
  auto server = ServerFlags();
  if (!server.ok()) return server.status();
  config.server = *std::move(server);
  config.cpu_threads = absl::GetFlag(FLAGS_threads);
  config.cuda_streams = absl::GetFlag(FLAGS_cuda_streams);
  config.cuda_tile_bytes = absl::GetFlag(FLAGS_cuda_tile_bytes).bytes;
  config.cuda_pieces_in_flight = absl::GetFlag(FLAGS_cuda_pieces_in_flight);
  config.transport_memory_budget = absl::GetFlag(FLAGS_transport_memory_budget);
  config.max_connections = absl::GetFlag(FLAGS_max_connections);
  config.port_file = absl::GetFlag(FLAGS_port_file);
  config.drain_timeout = absl::Seconds(absl::GetFlag(FLAGS_drain_timeout_s));
  config.from_environment = *std::move(from_env);
  return config;
}

absl::StatusOr<int64_t> TransportMemoryBytes(const ServerConfig& config, int64_t host_budget) {
  const int64_t floor = config.engine.limits.max_unary_message_bytes + (int64_t{16} << 20);
  if (config.transport_memory_budget == "auto") {
    return std::max<int64_t>(
        std::clamp<int64_t>(host_budget / 2, int64_t{64} << 20, int64_t{256} << 20), floor);
  }
  auto parsed = ParseBytes(config.transport_memory_budget);
  if (!parsed.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--transport_memory_budget=",
                                                   config.transport_memory_budget, ": ",
                                                   parsed.status().message()));
  }
  if (*parsed < floor) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--transport_memory_budget=", *parsed, " must be at least --max_unary_message_bytes + ",
        "16MiB = ", floor, " (gRPC holds a unary request whole before the server sees it)"));
  }
  return *parsed;
}

}  // namespace dgmm
