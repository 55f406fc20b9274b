// dgmm::Client: the C++ client of the dgmm service (proto/dgmm/v1/dgmm.proto).
//
// A Client sends a job -- a dense matrix A, a diagonal d and a side -- and
// receives C = A·diag(d) (SIDE_RIGHT) or C = diag(d)·A (SIDE_LEFT) into a
// buffer the caller owns. Small jobs travel in one `Multiply` message; large
// ones are streamed in blocks of whole lines over `MultiplyStream`, with
// sending and receiving overlapped. The matrix is read straight from the
// caller's memory (no intermediate copy of the whole matrix) and result blocks
// are written straight into the caller's output buffer.
//
// Errors: every method returns an absl::Status whose code is the gRPC status
// code of the call (see the status table in dgmm.proto) and whose message is
// the server's. Problems the client detects itself (a buffer of the wrong
// size, unusable options, a server that breaks the protocol) are
// INVALID_ARGUMENT and INTERNAL.
//
// Jobs that fail in a way that is safe to repeat are retried (RetryPolicy);
// the job's deadline covers every attempt.
//
// Striping (docs/protocol.md, "The client policy"): a large job is split
// into K contiguous line ranges ("parts", ClientOptions.stripes), each an
// ordinary job tagged with JobHeader.group and sent on its own connection
// (its own channel), all at once; results land in place in the caller's
// output. A streamed part that fails with a retried error (RetryPolicy)
// after some result lines arrived is resumed: only the lines not yet
// received are sent again.
//
// Servers: one address ("127.0.0.1:50051"), a DNS name with several replicas
// ("dns:///dgmm.svc:50051") or a list ("ipv4:127.0.0.1:50051,127.0.0.1:50052")
// with load_balancing_policy "round_robin" to spread jobs over all of them.
//
// Thread safety: a Client is thread-safe; concurrent calls share one channel.
#ifndef DGMM_CLIENT_CPP_INCLUDE_DGMM_CLIENT_H_
#define DGMM_CLIENT_CPP_INCLUDE_DGMM_CLIENT_H_

#include <grpcpp/channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dgmm/credentials.h"
#include "dgmm/v1/dgmm.grpc.pb.h"
#include "dgmm/v1/dgmm.pb.h"
#include "grpc/health/v1/health.pb.h"

namespace dgmm {

// Bytes per element of `dtype`: 2 for float16 and bfloat16, 4 for float32, 8
// for float64 and complex64, 16 for complex128, 0 otherwise.
size_t ElementSize(v1::DType dtype);

// NumPy's result_type of two dtypes (with ml_dtypes' bfloat16): `a` when
// they are equal; float16 with bfloat16 gives float32; real with complex
// gives the complex type wide enough for both (float64 with complex64 gives
// complex128); otherwise the wider. DTYPE_UNSPECIFIED when either is not a
// dtype of ElementSize's.
v1::DType PromoteDTypes(v1::DType a, v1::DType b);

// Called as a job's payload moves: matrix bytes sent so far, result bytes
// received so far, and the matrix size (each of the first two ends at it;
// a result of a wider dtype than A's is counted in A's bytes of its lines).
// May be called from gRPC threads; calls for one job never overlap.
using ProgressCallback =
    std::function<void(int64_t bytes_sent, int64_t bytes_received, int64_t total_bytes)>;

// Which failed jobs are tried again, how often and after how long
// (docs/protocol.md §9, rule 3). A dgmm server marks every error status it
// makes with the trailing metadata `dgmm-origin: server`; a status without
// it comes from gRPC or the network. A job is retried after
//  - UNAVAILABLE (nothing listening, the connection lost, a server draining
//    for shutdown), after an exponential backoff; with round_robin the next
//    attempt goes to another server;
//  - INTERNAL, UNKNOWN or RESOURCE_EXHAUSTED without `dgmm-origin: server`
//    (a stream reset by the transport, "Received RST_STREAM with error code
//    1"; gRPC's transport memory quota; a broken proxy), after the same
//    backoff: the transport failed, not the job (jobs are pure functions of
//    their inputs, so sending one again is safe);
//  - RESOURCE_EXHAUSTED that carries the `grpc-retry-pushback-ms` trailer
//    (the server's admission queue was full), after the time it names.
// Other errors are final: dgmm's own INTERNAL (a CUDA error) and
// RESOURCE_EXHAUSTED without a pushback (a job that can never fit), the
// caller's CANCELLED, DEADLINE_EXCEEDED, and every verdict on the request.
// No wait may end past the job's deadline. The policy applies to each part
// of a striped job on its own (max_attempts is per part); a retried part
// goes to the next connection ((part + attempt) % K), and a streamed part
// that had received some result lines is resumed from the first line it has
// not received (those lines are neither sent again nor received twice). The
// first final error of any part cancels the other parts and is the job's
// status.
//
// Every attempt fails fast when there is no connection (UNAVAILABLE at
// once, so that max_attempts = 1 sees a dead server as it is). A retried
// attempt first waits for its channel to connect (gRPC reconnects by itself,
// see ClientOptions' reconnect backoff), up to the job's deadline and at
// most max_reconnect_wait, and is then sent fail-fast too, not
// wait_for_ready: a connection lost after that wait (a server that exits at
// the end of its drain) fails the attempt at once instead of holding it
// until the deadline. A server that does not come back within that wait (or
// the job's deadline) ends the job with UNAVAILABLE ("no connection to the
// server within ...").
struct RetryPolicy {
  // Attempts per job, the first included; 1 turns retries off.
  int max_attempts = 4;
  // The wait before the second attempt after UNAVAILABLE (or a transport
  // failure, as above); each later wait is
  // backoff_multiplier times longer, up to max_backoff. Waits are jittered
  // by +-20% so that clients failed together do not retry together.
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(2);
  double backoff_multiplier = 2.0;
  // How long a retried attempt waits for a connection (bounded by the job's
  // deadline too). Covers a server restart; a server that stays down fails
  // the job after about this long instead of after the backoffs alone.
  absl::Duration max_reconnect_wait = absl::Seconds(5);
};

struct ClientOptions {
  // Deadline of each call; for a job it covers all of its attempts.
  // InfiniteDuration means none.
  absl::Duration deadline = absl::InfiniteDuration();
  // Largest Multiply request this client sends in one message. Match it to
  // the server's --max_unary_message_bytes (GetServerInfo.limits).
  int64_t max_unary_message_bytes = int64_t{16} << 20;
  // Largest block payload sent over MultiplyStream (whole lines are sent, so
  // a block holds max(1, chunk_bytes / line_bytes) lines). Must not exceed
  // the server's max_block_bytes.
  int64_t chunk_bytes = int64_t{4} << 20;
  // Multiply() streams when matrix plus diagonal exceed this many bytes. A
  // negative value means the smaller of chunk_bytes and 7/8 of
  // max_unary_message_bytes (room for the header and framing): a job that
  // fits one block goes in one message, and larger ones stream, because
  // streaming overlaps upload, compute and download (over loopback it beats
  // a single message from about 4 MiB up: 14.5 vs 17.3 ms at 4 MiB, 71 vs
  // 108 ms at 32 MiB).
  int64_t streaming_threshold_bytes = -1;
  // TLS (and mutual TLS with a client certificate); unset means plaintext.
  std::optional<TlsOptions> tls;
  // Other channel credentials, for what `tls` does not cover; at most one of
  // `tls` and `credentials`. Both unset: plaintext.
  std::shared_ptr<grpc::ChannelCredentials> credentials;
  // When not empty, sent as `authorization: Bearer <token>` metadata with
  // every call (server --auth_token_file). Without TLS it crosses the network
  // in clear text.
  std::string bearer_token;
  // Parts a job is striped into (K), each on its own connection. 0: auto,
  // K = min(8, max(1, floor(matrix_bytes / 32 MiB))), so a job under 64 MiB
  // is not striped. Either way K is at most the job's lines (rows of a
  // row-major matrix, columns of a column-major one), and 1 when the
  // diagonal's length does not fit the side (the server then says so).
  // From 0 to 256. A Client made from an existing channel sends every part
  // on that channel (K streams on one connection). With round_robin over an
  // "ipv4:"/"ipv6:" address list, part channel i prefers replica i mod n
  // (pick_first over the list rotated by i, so it moves on to the next
  // replica when that one is down): a fresh round_robin channel would send
  // its first call to whichever replica connected first, often the same for
  // every part. With a DNS name each part's channel uses round_robin.
  int stripes = 0;
  // gRPC load-balancing policy: "round_robin" spreads calls over every
  // address of the target (a DNS name with several replicas, or an
  // "ipv4:HOST:PORT,HOST:PORT" list); empty keeps gRPC's default
  // (pick_first: one address at a time).
  std::string load_balancing_policy;
  RetryPolicy retry;
  // How the channel reconnects after losing its server (gRPC channel args
  // grpc.initial_reconnect_backoff_ms, grpc.min_reconnect_backoff_ms,
  // grpc.max_reconnect_backoff_ms; ignored by the constructor that takes a
  // channel). gRPC's own defaults are 1 s, 20 s and 120 s, with which
  // clients took 19-22 s to reconnect to a restarted server. In
  // gRPC 1.51 (src/core/ext/filters/client_channel/subchannel.cc), each
  // value is raised to at least 100 ms, and:
  //  - initial_reconnect_backoff: the wait after the first failed connection
  //    attempt; each later wait is 1.6x longer (jittered by +-20%), up to
  //  - max_reconnect_backoff: so a restarted server is found at most about
  //    1.2x this long after it is up;
  //  - min_reconnect_backoff: despite its name, not a backoff but the
  //    shortest time a connection attempt (TCP connect, TLS and HTTP/2
  //    handshakes) may take before it is abandoned: an attempt's deadline is
  //    the later of its next backoff time and now + this. gRPC's 20 s here
  //    is what kept a client whose connect hung (no answer to its SYN) from
  //    trying again. Keep it above the slowest handshake you expect (TLS to
  //    a distant or loaded server), or connections never complete.
  absl::Duration initial_reconnect_backoff = absl::Milliseconds(100);
  absl::Duration min_reconnect_backoff = absl::Seconds(2);
  absl::Duration max_reconnect_backoff = absl::Seconds(1);
  // Regions (dgmm/regions.h): the server's local socket as this process
  // sees it. Empty: the path GetServerInfo reports (limits.local_socket);
  // set it when the socket is mounted elsewhere (another container).
  std::string local_socket;
  // The same-host path: when the server is on this host (its
  // local socket answers, with its instance id) and takes regions, Multiply
  // copies A into a staging region of this client (a sealed memfd the
  // server maps, registered once, grown geometrically, reused by every job
  // and pinned by the server once reused), runs the job there in place and
  // copies C out, with several threads: no payload crosses the socket.
  // Otherwise, or when that path fails before the job ran, the socket
  // (JobResult.socket_reason says why). Off: always the socket.
  // MultiplyUnary and MultiplyStream always use the socket.
  bool same_host = true;
  // Smaller matrices go over the socket (one small message costs less than
  // the copies and the region call).
  int64_t same_host_min_bytes = int64_t{1} << 20;
  // Blocks of a same-host job: 0 or 1 runs it as one region job with the
  // copies before and after it; K > 1 (at most 8) splits it into K blocks of
  // whole lines, one region job each, so that copying A in, the block jobs
  // and copying C out overlap. One by default: on the H200 host the
  // overlapped copies only shared the memory bandwidth
  // (bench/results/user_path/h200_ae98e10/README.md).
  int same_host_blocks = 0;
  // On the same-host path, ask the server to read A from, and write C to,
  // this process's own memory (docs/protocol.md "Process memory"): no
  // staging region and no copy here. The server grants it to a process of
  // its own uid in its PID namespace that the kernel lets it read; otherwise
  // the staging region above carries the job.
  bool process_memory = true;
};

// OK when `options` can be used: positive sizes, a sane retry policy and
// reconnect backoff (each from 1 ms to INT_MAX ms, max at least initial),
// usable TLS options and bearer token, not both `tls` and `credentials`.
// INVALID_ARGUMENT naming the field otherwise.
absl::Status CheckClientOptions(const ClientOptions& options);

// The matrix A, read-only, in the caller's memory. `data` must hold
// rows*cols elements of `dtype` in `layout` order (little-endian).
struct MatrixView {
  const void* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  v1::Layout layout = v1::LAYOUT_ROW_MAJOR;
};

// Size in bytes of `matrix`'s payload; INVALID_ARGUMENT for a non-positive
// dimension, an unknown dtype or a size that overflows.
absl::StatusOr<size_t> MatrixBytes(const MatrixView& matrix);

// One multiplication. The diagonal has cols elements for SIDE_RIGHT and
// rows for SIDE_LEFT, of `diagonal_dtype` (unspecified: the matrix's); for
// SIDE_BOTH `diagonal` is the left one (rows elements) and
// `right_diagonal` the right one (cols elements): C = diag(l)·A·diag(r).
// The server checks the lengths. The result C has A's shape and layout and
// the result dtype (ResultDType: `result_dtype`, unspecified: NumPy's result
// type of A and d, so a float32 A with a float64 diagonal gives a float64
// C); C's buffer is ResultBytes (docs/protocol.md "Element types"). A
// stated `result_dtype` must be that result type or one it widens to
// exactly (float32 with float32 into float64); the server refuses others.
struct Job {
  MatrixView matrix;
  const void* diagonal = nullptr;
  size_t diagonal_bytes = 0;
  v1::Side side = v1::SIDE_RIGHT;
  v1::Backend backend = v1::BACKEND_AUTO;
  const void* right_diagonal = nullptr;
  size_t right_diagonal_bytes = 0;
  v1::DType diagonal_dtype = v1::DTYPE_UNSPECIFIED;
  v1::DType result_dtype = v1::DTYPE_UNSPECIFIED;
  // This job's own deadline over all its parts and attempts; the earlier of
  // it and ClientOptions.deadline applies. InfiniteFuture: the client's only.
  absl::Time deadline = absl::InfiniteFuture();
  // W3C trace context (docs/protocol.md, "Trace context"): this traceparent
  // (and tracestate, when not empty) goes in the metadata of every call of
  // the job -- every part, stripe, retry and region call carries the same
  // value, so the same trace id and the caller's span as their parent; the
  // server gives each call a span of its own (JobStats.span_id). Empty: the
  // client makes a new one per job (a random trace id and span id, flags
  // 00), which JobResult::traceparent returns. INVALID_ARGUMENT before any
  // call for a traceparent that is not valid (uppercase hex, all-zero ids,
  // version ff, ...), or a tracestate without one.
  std::string traceparent;
  std::string tracestate;
};

// C's dtype for `job`: `result_dtype` when stated, else
// PromoteDTypes(A's dtype, diagonal_dtype or A's).
v1::DType ResultDType(const Job& job);

// Size in bytes of `job`'s result C: rows*cols elements of ResultDType;
// INVALID_ARGUMENT as MatrixBytes, or for an unknown result dtype.
absl::StatusOr<size_t> ResultBytes(const Job& job);

using HealthState = grpc::health::v1::HealthCheckResponse::ServingStatus;

// Cancels one job from any thread: pass it to Multiply (MultiplyUnary,
// MultiplyStream), then call Cancel(). Its calls in flight are cancelled, and
// a wait between attempts (a backoff, or a wait for a connection) ends at
// once; Multiply returns CANCELLED. A token cancelled before its job starts
// ends the job as it starts. One job at a time per token; thread-safe.
class CancelToken {
 public:
  void Cancel();
  bool cancelled() const;

  // While a Watch lives, Cancel() calls `on_cancel` (at once, from the
  // constructor, when the token was cancelled before); the watch it
  // replaced comes back when it ends. For code that runs a job's calls
  // (each call's context TryCancels); `token` may be null.
  class Watch {
   public:
    Watch(CancelToken* token, std::function<void()> on_cancel);
    ~Watch();
    Watch(const Watch&) = delete;
    Watch& operator=(const Watch&) = delete;

   private:
    CancelToken* token_;
    std::function<void()> previous_;
  };

  // Sleeps `wait`, or less when the token (may be null) is cancelled
  // meanwhile; false when it was.
  static bool SleepUnlessCancelled(absl::Duration wait, const CancelToken* token);

 private:
  friend class Client;
  mutable std::mutex mu_;
  bool cancelled_ = false;              // guarded by mu_
  std::function<void()> on_cancel_;     // the running job's; guarded by mu_
};

// How a job's bytes travelled: one Multiply message, a MultiplyStream, or
// (kRegion) through memory: the same-host path, a staging region the server
// maps (ClientOptions.same_host).
enum class TransferMode { kUnary, kStream, kRegion };

// "unary", "stream" or "shm".
const char* TransferModeName(TransferMode mode);

struct JobResult {
  // Where and how long the job ran, as the server measured it. Striped: the
  // first part's stats, with h2d, compute and d2h summed over the parts and
  // queue_wait and total the largest of any part.
  v1::JobStats stats;
  // Which RPC carried the job: kUnary when every attempt of every part went
  // as one Multiply, else kStream (docs/protocol.md §9).
  TransferMode mode = TransferMode::kUnary;
  // Attempts the job took over all its parts: K when each part's first
  // attempt succeeded (see RetryPolicy).
  int attempts = 1;
  // Parts the job was striped into (K); 1: not striped.
  int stripes = 1;
  // Stats of each part's successful (last) attempt, in line order.
  std::vector<v1::JobStats> part_stats;
  // The traceparent every call of the job carried: Job::traceparent, or the
  // one the client made for the job.
  std::string traceparent;
  // Result bytes that arrived over every attempt of every part, counted as
  // each unary reply and each result block came. Equal to the result's size
  // (ResultBytes) when no line was received twice (a resumed part asks only
  // for the rest).
  int64_t received_bytes = 0;
  // Retries that resumed a stream after part of its result had arrived.
  int resumed = 0;
  // Why a job that could have taken the same-host path went over the socket
  // (the server is remote, has no regions, its region budget is full, ...);
  // empty when it took that path (mode kRegion) or was not a candidate
  // (same_host off, a forced mode, a matrix under same_host_min_bytes).
  std::string socket_reason;
  // On the same-host path: whether the server read and wrote the caller's
  // own memory (ClientOptions.process_memory; no copies), or a staging
  // region carried the job.
  bool process_memory = false;
  // The same-host path's phases as this client saw them, in seconds (zero on
  // other paths): opening the session and taking (or making and
  // registering) the staging region, copying A in, the region job's RPC, and
  // copying C out. A job in the caller's own regions, or in its process
  // memory, has no copies (setup is the session's, on a first job).
  struct SameHostPhases {
    double setup = 0;
    double copy_in = 0;
    double job = 0;
    double copy_out = 0;
  } same_host;
};

// Attempts a failed job made over all its parts (a Multiply error carries
// them as a status payload); 0 when the status has none (an error found
// before any call, or another status).
int AttemptsOf(const absl::Status& status);

// The server's pushback (`grpc-retry-pushback-ms`, its admission queue was
// full) carried by a failed job's or batch's final status, in milliseconds;
// nullopt when the last failed call had none.
std::optional<int64_t> RetryAfterMsOf(const absl::Status& status);

// Rule 1 as a number: the largest matrix-plus-diagonal request sent in one
// Multiply message when no line is longer than chunk_bytes,
// min(chunk_bytes, 7/8 of max_unary_message_bytes).
int64_t UnaryThreshold(int64_t max_unary_message_bytes, int64_t chunk_bytes);
// Whole lines per stream block: max(1, chunk_bytes / line_bytes).
int64_t LinesPerBlock(int64_t line_bytes, int64_t chunk_bytes);

// The client policy as pure functions (docs/protocol.md; the conformance
// suite's policy vectors check them).
//
// Rule 1: unary when the request (matrix plus diagonal) is at most
// min(chunk_bytes, 7/8 of max_unary_message_bytes), or when one line
// (`line_bytes`; 0: unknown) is longer than chunk_bytes and the request is
// at most max_unary_message_bytes - 64 KiB (no stream block the server takes
// could hold that line, one Multiply can; 64 KiB leaves room for the
// message's framing); else stream.
TransferMode ChooseTransferMode(int64_t request_bytes, int64_t max_unary_message_bytes,
                                int64_t chunk_bytes, int64_t line_bytes = 0);
// Rule 2: K for a job of `matrix_bytes` in `lines` lines; `stripes_option`
// 0 (or negative) means auto.
int ChooseStripes(int64_t matrix_bytes, int64_t lines, int stripes_option);
struct LineRange {
  int64_t first_line = 0;
  int64_t lines = 0;
};
// `lines` split into `stripes` contiguous near-equal ranges, the first
// (lines % stripes) one line longer.
std::vector<LineRange> SplitLines(int64_t lines, int stripes);
// Rule 4: "auto", "cpu", "cuda-kernel", "cublas" or an enum name
// (BACKEND_AUTO, ...); INVALID_ARGUMENT for anything else.
absl::StatusOr<v1::Backend> ParseBackendName(absl::string_view name);

// One job of a MultiplyBatch, and where its result goes: `out` must hold
// exactly the result's size (ResultBytes).
struct BatchItem {
  Job job;
  void* out = nullptr;
  size_t out_bytes = 0;
};

struct BatchResult {
  // One per item, in order: the job's stats (its result is in its `out`),
  // or the job's own error: what a Multiply call of it would have ended
  // with (INVALID_ARGUMENT for a bad header, RESOURCE_EXHAUSTED for a job
  // that can never fit, ...), or INVALID_ARGUMENT from the client for an
  // item whose buffers are unusable (that job is not sent).
  std::vector<absl::StatusOr<v1::JobStats>> jobs;
  // Attempts the batch took (see RetryPolicy: the whole batch is sent
  // again, its jobs being pure); 0 when there was nothing to send (no
  // items, or none the client could send).
  int attempts = 1;
  // The traceparent the batch's calls carried (MultiplyBatch's, or one
  // made for the batch).
  std::string traceparent;
};

class LocalSession;  // dgmm/regions.h

class Client {
 public:
  // A client of `target` (see the top of this file); INVALID_ARGUMENT when
  // CheckClientOptions rejects `options`. Connects lazily, at the first call.
  static absl::StatusOr<std::unique_ptr<Client>> Create(const std::string& target,
                                                        const ClientOptions& options = {});

  // As Create, but options that CheckClientOptions rejects make every call
  // return that error instead.
  explicit Client(const std::string& target, const ClientOptions& options = {});
  // Uses an existing channel; options' tls, credentials and load-balancing
  // policy are ignored (they belong to the channel).
  Client(std::shared_ptr<grpc::Channel> channel, ClientOptions options = {});

  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;
  ~Client();

  // Starts opening, without waiting, the connections a job striped into
  // `stripes` parts uses (1: the client's one channel): a caller that knows
  // its job before it has the data (dgmm-cli while it reads or makes A)
  // hides the connection set-up behind that work. Jobs connect by
  // themselves; this only starts it earlier. `stripes` is clamped to 1..256.
  // A thread of the client waits on the connections (up to
  // RetryPolicy.max_reconnect_wait) while the caller works: gRPC makes
  // progress on a connection only while a thread waits on it, and abandons
  // an attempt after ClientOptions.min_reconnect_backoff.
  void Connect(int stripes = 1);

  // Runs `job` and writes C into out[0, out_bytes), which must be exactly
  // ResultBytes(job); C has A's shape and layout and ResultDType(job). Striped into
  // ClientOptions.stripes parts; each part uses Multiply when it is at most
  // the streaming threshold (see ClientOptions), else MultiplyStream.
  // Retries and resumes as RetryPolicy says. `progress` sums the parts.
  // On error the contents of `out` are unspecified.
  // `cancel`, when given, cancels the job from another thread (CancelToken).
  absl::StatusOr<JobResult> Multiply(const Job& job, void* out, size_t out_bytes,
                                     const ProgressCallback& progress = nullptr,
                                     CancelToken* cancel = nullptr);

  // Runs `job` (each part of it, when striped) in one Multiply message,
  // whatever its size.
  absl::StatusOr<JobResult> MultiplyUnary(const Job& job, void* out, size_t out_bytes,
                                          const ProgressCallback& progress = nullptr,
                                          CancelToken* cancel = nullptr);

  // Runs `job` (each part of it, when striped) over MultiplyStream, whatever
  // its size: header, then blocks of whole lines (rows of a row-major
  // matrix, columns of a column-major one) of at most chunk_bytes, while
  // result blocks are placed into `out` as they arrive. A resumed part sends
  // only the lines it has not received back.
  absl::StatusOr<JobResult> MultiplyStream(const Job& job, void* out, size_t out_bytes,
                                           const ProgressCallback& progress = nullptr,
                                           CancelToken* cancel = nullptr);

  // Runs many small independent jobs in one MultiplyBatch call (the RPC's
  // cost is paid once for all of them), each with its own result and
  // status; one bad job does not fail the others. The call's own errors
  // (the batch over the server's message or --max_batch_jobs limits, or its
  // jobs together over the memory budget: RESOURCE_EXHAUSTED; the deadline,
  // a cancel, the transport) are the returned status, and are retried as
  // RetryPolicy says for a job. Every job travels in the one message, so
  // the batch must stay under the server's max_unary_message_bytes
  // (GetServerInfo.limits, with max_batch_jobs); nothing is striped,
  // streamed or sent through regions. On a job's error the contents of its
  // `out` are unspecified. `traceparent` and `tracestate` go with every
  // attempt of the call, as Job's do (the items' own are not used: the
  // batch is one call); an empty traceparent: a new one for the batch.
  absl::StatusOr<BatchResult> MultiplyBatch(const std::vector<BatchItem>& items,
                                            CancelToken* cancel = nullptr,
                                            const std::string& traceparent = "",
                                            const std::string& tracestate = "");

  // The server's version, devices, budgets, queue and limits (of the one
  // server the call reached). Not retried. `deadline`: the call's, when
  // sooner than ClientOptions.deadline from now.
  absl::StatusOr<v1::GetServerInfoResponse> GetServerInfo(
      absl::Time deadline = absl::InfiniteFuture());

  // Standard grpc.health.v1 Check of `service` ("" is the whole server):
  // SERVING, NOT_SERVING, ... An RPC failure is an error: UNAVAILABLE when
  // nothing listens, NOT_FOUND for a service the server does not know. Not
  // retried, so that a probe sees the server as it is. `deadline` as for
  // GetServerInfo.
  absl::StatusOr<HealthState> Health(const std::string& service = "",
                                     absl::Time deadline = absl::InfiniteFuture());

  const ClientOptions& options() const { return options_; }

  // What Multiply (`mode` nullopt), MultiplyUnary or MultiplyStream would do
  // with `job` under this client's options: K parts, the RPC of the first
  // part, and whether parts get slices of the diagonal. The one place these
  // are decided; INVALID_ARGUMENT for a matrix MatrixBytes refuses.
  struct JobPlan {
    int stripes = 1;
    // The first part's RPC; every part's when `forced`.
    TransferMode mode = TransferMode::kUnary;
    // Set by MultiplyUnary/MultiplyStream or ClientOptions.streaming_threshold_bytes.
    std::optional<TransferMode> forced;
    bool slice_diagonal = false;
  };
  absl::StatusOr<JobPlan> Plan(const Job& job,
                               std::optional<TransferMode> mode = std::nullopt) const;

  // Hook for the region calls of dgmm/regions.h: the typed stub of this
  // client's channel, and `context` set up as for every call of this client
  // (`deadline`, the bearer token), or the error of options that
  // CheckClientOptions rejects.
  v1::Dgmm::Stub* stub() const { return stub_.get(); }
  absl::Status PrepareCall(grpc::ClientContext* context, absl::Time deadline) const;
  // Also for the region calls: waits until the client's channel is
  // connected (driving the connection meanwhile), at most
  // RetryPolicy.max_reconnect_wait or until `deadline`, and no longer once
  // a connection attempt it saw start has failed; UNAVAILABLE otherwise. A
  // region call made on a channel whose last attempt failed would fail at
  // once without trying.
  absl::Status AwaitChannel(absl::Time deadline) const;
  // The region calls' session on the server's local socket (dgmm/regions.h),
  // opened on first use and again when the server closed it; kept for the
  // client's life.
  absl::StatusOr<std::shared_ptr<LocalSession>> RegionSession();

 private:
  // One connection: a channel and the generic stub on it.
  struct Lane {
    std::shared_ptr<grpc::Channel> channel;
    std::unique_ptr<grpc::GenericStub> stub;
  };
  // The state one logical job's parts share.
  struct JobRun;
  // Unstriped jobs: the client's channel. Striped ones: stripe lane `i`,
  // made on first use, each its own channel and connection(s).
  Lane* GetLane(int i, bool striped);
  // Runs a job striped per the options; `mode`: nullopt picks per part.
  absl::StatusOr<JobResult> RunJob(const Job& job, void* out, size_t out_bytes,
                                   const ProgressCallback& progress,
                                   std::optional<TransferMode> mode, CancelToken* cancel);
  // One part with its retries and resumes; the final status.
  absl::Status RunPart(JobRun* run, int index, LineRange range);
  // The deadline of a call or job starting now.
  absl::Time Deadline() const;
  // Applies `deadline` and the bearer token to a fresh context. Calls are
  // never wait_for_ready (see RetryPolicy).
  void PrepareContext(grpc::ClientContext* context, absl::Time deadline) const;
  // Before a retried attempt: waits until `lane` is connected, up to
  // `deadline` and RetryPolicy::max_reconnect_wait. UNAVAILABLE if it is not.
  // Ends early (CANCELLED) when the job has failed or been cancelled.
  absl::Status AwaitConnection(Lane* lane, JobRun* run);
  // One try of a job: its outcome, and what decides whether to try again.
  struct Attempt;
  Attempt UnaryAttempt(Lane* lane, JobRun* run, const v1::JobHeader& header, const Job& job,
                       size_t matrix_bytes, void* out, const ProgressCallback& progress);
  Attempt StreamAttempt(Lane* lane, JobRun* run, const v1::JobHeader& header, const Job& job,
                        size_t matrix_bytes, void* out, const ProgressCallback& progress);

  ClientOptions options_;
  // CheckClientOptions(options_), returned by every call when not OK.
  absl::Status options_status_;
  // The target, for more lanes; empty for a Client made from a channel.
  std::string target_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Dgmm::Stub> stub_;
  // For Multiply/MultiplyStream, whose payloads are sent from the caller's
  // memory and received into it without proto copies (see proto/wire.h):
  // one lane per stripe, each its own connection.
  // A std::mutex rather than absl::Mutex: the thread sanitizer can see it
  // (Debian's Abseil is not instrumented).
  std::mutex lanes_mu_;
  std::vector<std::unique_ptr<Lane>> lanes_;         // channel_'s; guarded by lanes_mu_
  std::vector<std::unique_ptr<Lane>> stripe_lanes_;  // guarded by lanes_mu_
  std::mutex session_mu_;
  std::shared_ptr<LocalSession> session_;  // guarded by session_mu_
  // Connect()'s thread, which waits on the connections it started; stopped
  // (and joined) by the next Connect and by the destructor.
  std::mutex connect_mu_;
  std::thread connector_;  // guarded by connect_mu_
  std::atomic<bool> stop_connecting_{false};
  // Set once the server answered MultiplySmall with UNIMPLEMENTED (a server
  // older than it): small unary jobs go with Multiply from then on.
  std::atomic<bool> no_multiply_small_{false};

  // Regions this client's SharedMemoryRegions registered, by base address:
  // a job whose matrix (and output) lie in them runs there, with no copy.
  friend class SharedMemoryRegion;
  struct OwnRegion {
    size_t bytes = 0;
    std::string name;
  };
  std::mutex own_regions_mu_;
  std::map<uintptr_t, OwnRegion> own_regions_;  // guarded by own_regions_mu_
  // Where [p, p + bytes) lies in one of them, as a ref.
  std::optional<v1::RegionRef> OwnRegionRef(const void* p, size_t bytes);

  // The same-host path (src/same_host.cc).
  struct Staging;
  // The job through a staging region: its result, or nullopt (with *why)
  // when it should go over the socket instead.
  // `probe`: the connection the job would use over the socket, where the
  // server is asked whether it takes regions (so that a server that does not
  // costs no extra connection).
  // `cancel` (may be null) ends it as CANCELLED, its region calls included.
  std::optional<absl::StatusOr<JobResult>> SameHostJob(const Job& job, void* out,
                                                       size_t matrix_bytes,
                                                       const ProgressCallback& progress,
                                                       Lane* probe, CancelToken* cancel,
                                                       std::string* why);
  // GetServerInfo over `lane`'s connection.
  absl::StatusOr<v1::GetServerInfoResponse> InfoOn(Lane* lane);
  // RegionSession() with the server's info already at hand.
  absl::StatusOr<std::shared_ptr<LocalSession>> RegionSessionWith(
      const v1::GetServerInfoResponse& info);
  // A staging region of at least `bytes` (from the free list, else new).
  absl::StatusOr<std::shared_ptr<Staging>> TakeStaging(size_t bytes);
  void ReturnStaging(std::shared_ptr<Staging> staging);
  std::mutex staging_mu_;
  std::vector<std::shared_ptr<Staging>> staging_;  // free ones; guarded by staging_mu_
  // Why the server is not usable through memory, and when that was found
  // (checked again a minute later); OK: usable or not checked yet.
  absl::Status same_host_off_;          // guarded by staging_mu_
  absl::Time same_host_checked_;        // guarded by staging_mu_
};

// For a short-lived program (a command-line tool, a batch job): call first
// thing in main(), before any gRPC use. Selects gRPC's "poll" poller unless
// the environment already sets GRPC_POLL_STRATEGY. With gRPC 1.51's default
// epoll1 poller, a process that made a callback-API call (every streamed
// job) waits up to about 10 s in grpc_shutdown on a 16-core host: the
// callback completion queue's threads (cores / 2 of them, from 2 to 16;
// src/cpp/common/completion_queue_cc.cc) are joined one after another, each
// waking from its 1 s poll. Measured on an H200 host: dgmm-cli multiply
// exited 10.3 s after its job with epoll1, 0.3 s with poll
// (bench/results/cli_exit/). Long-running servers and clients need not call it.
// Seen with epoll1 too (tests/client_cpp/stripe_test.cc, OnePartsFinalError...): a
// Client destroyed right after a striped job whose failure cancelled a part
// before that part's channel had connected took about 10 s to destroy in 2
// of 16 runs; with "poll", 0 of 16 (each under 10 ms).
void ConfigureGrpcForQuickExit();

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_INCLUDE_DGMM_CLIENT_H_
