// dgmm-server's command line: every flag (also read from DGMM_<FLAG>
// environment variables), checked and turned into the options of the engine,
// the server and the process around them.
#ifndef DGMM_SERVICE_FLAGS_H_
#define DGMM_SERVICE_FLAGS_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/engine/engine.h"
#include "service/server.h"

namespace dgmm {

struct ServerConfig {
  EngineOptions engine;
  ServerOptions server;  // all but transport_memory_bytes (TransportMemoryBytes)
  int cpu_threads = 0;   // --threads
  // --cuda_streams, --cuda_tile_bytes, --cuda_pieces_in_flight.
  int cuda_streams = 4;
  int64_t cuda_tile_bytes = int64_t{8} << 20;
  int cuda_pieces_in_flight = 0;
  // "auto" or a size (TransportMemoryBytes reads it).
  std::string transport_memory_budget = "auto";
  int max_connections = 4096;
  std::string port_file;
  absl::Duration drain_timeout = absl::Seconds(30);
  // Flags set through DGMM_<FLAG> variables, for the start log.
  std::vector<std::string> from_environment;
};

// Parses the command line and the DGMM_<FLAG> variables (the command line
// wins; dashes and underscores in names are interchangeable), then checks
// what the flags' types cannot: ranges, --region_pin, --local_socket_mode.
// --help and --version print and exit here. An error names the flag; the
// caller exits with status 2.
absl::StatusOr<ServerConfig> ReadFlags(int argc, char** argv);

// gRPC's own memory quota: --transport_memory_budget, or with `auto` half the
// host budget within [64 MiB, 256 MiB]; at least --max_unary_message_bytes +
// 16 MiB either way (gRPC holds a unary request whole before the server sees
// it). INVALID_ARGUMENT for a value that is not a size or is too small.
absl::StatusOr<int64_t> TransportMemoryBytes(const ServerConfig& config, int64_t host_budget);

}  // namespace dgmm

#endif  // DGMM_SERVICE_FLAGS_H_
