// dgmm-cli: multiply matrices by diagonals on a dgmm server, inspect it, and
// probe its health. See kUsage.
#include <cstdio>
#include <string>

#include "absl/status/status.h"
#include "cli/command_line.h"
#include "cli/commands.h"
#include "dgmm/client.h"

namespace {

constexpr char kUsage[] = R"(dgmm-cli: client of the dgmm service, which computes C = A·diag(d)
(--side=right: column j of A scaled by d[j]) or C = diag(d)·A (--side=left: row i
scaled by d[i]) on the server's GPUs or CPU.

Usage:
  dgmm-cli multiply --matrix=A.npy --diag=d.npy --out=C.npy [--side=right|left]
                    [--backend=auto|cpu|cuda-kernel|cublas] [--mode=auto|unary|stream]
                    [--stripes=K] [--check] [common flags]
  dgmm-cli multiply --matrix=A.npy --side=both --left=l.npy --right=r.npy --out=C.npy ...
  dgmm-cli multiply --random=N [--cols=M] [--dtype=f16|bf16|f32|f64|c64|c128]
                    [--layout=row|col] [--side=right|left|both] [--seed=S] [--check]
                    [--out=C.npy] ...
  dgmm-cli info [common flags]
  dgmm-cli health [--service=NAME] [common flags]
  dgmm-cli --help

Subcommands:
  multiply  Sends A and d to the server and receives C. With --matrix/--diag, reads
            .npy files (float16 '<f2', bfloat16 as np.save writes ml_dtypes.bfloat16
            ('<V2'), float32, float64, complex64 '<c8' or complex128 '<c16'; C or
            Fortran order; d of any of these dtypes; len(d) = cols for right,
            rows for left; --side=both takes --left (rows) and --right (cols) of
            one dtype) and writes C to --out in A's order and the result dtype:
            NumPy's result type of A and d (float32 A with a float64 d gives
            float64) or a wider --result_dtype. With --random=N, generates an N x M matrix (M =
            --cols, default N) and its diagonal(s), values uniform in [0.5, 2). Prints
            the mode (unary or stream), the backend and device, the server's timings
            (queue wait, h2d, compute, d2h, total, in ms) and the throughput.
            A job that fits in one --chunk_bytes block (and under 7/8 of
            --max_unary_message_bytes) goes in one message; larger ones are
            streamed in blocks of whole rows (or columns), overlapping upload,
            compute and download.
  info      Prints the server's version, default backend, dtypes, limits and, per
            device, memory, budget, reserved bytes and queued/running/completed/
            rejected job counts.
  health    Asks the standard grpc.health.v1 service; prints the state (SERVING,
            NOT_SERVING, ...) and exits 0 only when SERVING.
            The server answers it without a token (--auth_token_file is not
            needed); a TLS server needs --tls_ca (plus --tls_server_name when
            its certificate does not name the --server host, and --tls_cert/
            --tls_key under mutual TLS).

multiply flags:
  --matrix=PATH        A, a 2-D .npy file.
  --diag=PATH          d, a 1-D .npy file.
  --left=PATH, --right=PATH
                       With --side=both: l (len rows) and r (len cols), 1-D .npy files.
  --out=PATH           Where to write C as .npy (required with --matrix).
  --side=right|left|both
                       right: C = A·diag(d) (default); left: C = diag(d)·A; both:
                       C = diag(l)·A·diag(r) in one pass.
  --backend=NAME       auto (default: the server's fastest), cpu, cuda-kernel, cublas.
  --mode=NAME          auto (default), unary (one message) or stream.
  --shm=auto|on|off    A and C through memory, not the gRPC socket, when the server is
                       on this host and runs with --allow_regions (mode: shm): auto
                       (default) when it can and the matrix has 1 MiB or more, else
                       the socket, and the report's path line says why; on always,
                       else fail; off never. --mode=unary|stream forces the socket.
  --process_memory=true|false
                       With --shm: when the server grants it (same user, same
                       host), it reads A from and writes C into this process's
                       memory itself; with --matrix/--out the .npy files are
                       mapped and nothing is copied here (default true). false:
                       a staging region (a memfd the server maps) and copies.
  --stripes=K          Split the job into K line ranges, each on its own
                       connection (spread over the replicas with round_robin);
                       0 (default): auto, min(8, matrix bytes / 32 MiB), so jobs
                       under 64 MiB go whole. K and the mode are printed first.
  --random=N           Random operands with N rows instead of files.
  --cols=M             With --random: columns (default N).
  --dtype=NAME         With --random: f16, bf16, f32 (default), f64, c64 or c128.
  --result_dtype=NAME  C's dtype, f16 ... c128: NumPy's result type of A and d
                       (default) or a type it widens to exactly.
  --layout=row|col     With --random: C (row) or Fortran (col) order (default row).
  --seed=S             With --random: random seed (default 1).
  --check              Compare C with a float64 (complex128) reference computed here
                       and print the largest relative error; exit 3 above --tolerance.
  --tolerance=X        Default 1e-6 for f32 and c64, 1e-14 for f64 and c128, 2e-3 for
                       f16, 1.6e-2 for bf16 (a scaled element is exact to a rounding or
                       two).

health flags:
  --service=NAME       Service to check: "" (default) is the whole server,
                       dgmm.v1.Dgmm the dgmm service.

Common flags:
  --server=HOST:PORT   Server address or gRPC target (e.g. dns:///dgmm.example:50051
                       with round_robin). Default: the port of $DGMM_LISTEN on
                       this host when that variable is set (0.0.0.0:P -> 127.0.0.1:P,
                       [::]:P -> [::1]:P, any other address as it is), else
                       127.0.0.1:50051. So in the server's container (which sets
                       DGMM_LISTEN) `dgmm-cli health` probes the configured port.
  --deadline=SECONDS   Deadline of each RPC (default none), for a job covering all
                       of its attempts; an expired job fails with
                       DEADLINE_EXCEEDED.
  --chunk_bytes=BYTES  Largest streamed block (default 4MiB; at most the server's
                       max_block_bytes, see `info`). Accepts 4194304, 4MiB, 1GiB.
  --max_unary_message_bytes=BYTES
                       The server's unary message limit (default 16MiB).
  --local_socket=PATH  With --shm: the server's local socket as seen here (default:
                       the path the server reports; set it in a container that
                       mounts the socket's directory elsewhere).
  --load_balancing_policy=NAME
                       gRPC load-balancing policy: round_robin spreads jobs over
                       every address of --server (a DNS name with several
                       replicas, or ipv4:127.0.0.1:50051,127.0.0.1:50052).
  --max_attempts=N     Attempts per job (default 4; 1 = no retries). A job that
                       fails with UNAVAILABLE, or RESOURCE_EXHAUSTED with the
                       server's grpc-retry-pushback-ms hint (queue full), is
                       tried again after a backoff (or the hinted wait) within
                       --deadline; a streamed job only before any result arrived.
  --tls                Connect with TLS, trusting the system's root CAs. Implied
                       by the other --tls_* flags.
  --tls_ca=PEM         CA certificate(s) that signed the server's certificate
                       (server --tls_cert/--tls_key).
  --tls_cert=PEM       This client's certificate chain, for mutual TLS (server
  --tls_key=PEM        --tls_client_ca), and its private key; both or neither.
  --tls_server_name=NAME
                       Check the server's certificate against NAME instead of
                       the --server host.
  --auth_token_file=PATH
                       Send the token in PATH as "authorization: Bearer <token>"
                       with every call (server --auth_token_file); use with TLS.
  --quiet              Print only errors (and health's state). A progress bar
                       (bytes, rate, ETA) is shown on a terminal for transfers
                       longer than a second unless --quiet.
  --help               This text.
Flags take --name=value or --name value; dashes and underscores in names are
interchangeable (--chunk-bytes = --chunk_bytes).

Errors print "error: <gRPC code>: <message>". Exit codes: 0 success; 1 an RPC
failed, the server is not SERVING, or the output could not be written; 2 a usage
error or an unusable input file; 3 --check failed.
)";

}  // namespace

int main(int argc, char** argv) {
  dgmm::ConfigureGrpcForQuickExit();  // exits promptly after a job (client.h)
  using dgmm::cli::ReportError;
  absl::StatusOr<dgmm::cli::CommandLine> command_line = dgmm::cli::ParseCommandLine(argc, argv);
  if (!command_line.ok()) return ReportError(command_line.status(), dgmm::cli::kExitUsage);
  if (command_line->help) {
    std::fputs(kUsage, stdout);
    return dgmm::cli::kExitOk;
  }
  if (command_line->positional.empty()) {
    std::fputs(kUsage, stderr);
    return dgmm::cli::kExitUsage;
  }
  const std::string& command = command_line->positional[0];
  if (command_line->positional.size() > 1) {
    return ReportError(
        absl::InvalidArgumentError("unexpected argument '" + command_line->positional[1] +
                                   "'; run 'dgmm-cli --help' for usage"),
        dgmm::cli::kExitUsage);
  }
  if (command == "multiply") return dgmm::cli::RunMultiply();
  if (command == "info") return dgmm::cli::RunInfo();
  if (command == "health") return dgmm::cli::RunHealth();
  return ReportError(absl::InvalidArgumentError("unknown subcommand '" + command +
                                                "'; expected multiply, info or health"),
                     dgmm::cli::kExitUsage);
}
