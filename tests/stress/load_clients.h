// What the load test's clients do: a job with bounded retries and its
// float64 check, and jobs abandoned midway (cancel, deadline, disconnect).
#ifndef DGMM_TESTS_STRESS_LOAD_CLIENTS_H_
#define DGMM_TESTS_STRESS_LOAD_CLIENTS_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>

#include "absl/time/time.h"
#include "dgmm/v1/dgmm.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "tests/stress/job_mix.h"

namespace dgmm::stress {

// A stub on a channel with its own TCP connection (no subchannel sharing
// between channels), with gRPC's own retries off so that every retry is ours.
std::unique_ptr<v1::Dgmm::Stub> ConnectOwn(const std::string& address);

// One client's channel to the server, reopened after the server went away.
class Connection {
 public:
  explicit Connection(std::string address)
      : address_(std::move(address)), stub_(ConnectOwn(address_)) {}
  v1::Dgmm::Stub* stub() { return stub_.get(); }
  // Replaces the channel with a new one, which tries to connect at once.
  void Reopen();

 private:
  std::string address_;
  std::unique_ptr<v1::Dgmm::Stub> stub_;
};

// "UNAVAILABLE", "CANCELLED", ...
std::string CodeName(grpc::StatusCode code);

// GetServerInfo with a deadline; false if the server did not answer.
bool FetchInfo(v1::Dgmm::Stub* stub, absl::Duration timeout, v1::GetServerInfoResponse* info);

struct RetryPolicy {
  // Deadline of one attempt.
  absl::Duration attempt_timeout = absl::Seconds(120);
  // A job stops retrying once this long has passed since its first attempt.
  absl::Duration window = absl::Seconds(120);
  int max_attempts = 200;
  // Backoff after UNAVAILABLE: doubles from initial to max, +-20% jitter.
  absl::Duration initial_backoff = absl::Milliseconds(50);
  absl::Duration max_backoff = absl::Seconds(1);
};

struct JobResult {
  enum class Verdict { kCorrect, kWrong, kLost };
  Verdict verdict = Verdict::kLost;
  // From the first attempt's start to the last reply: retries and waits included.
  absl::Duration latency;
  int unavailable_retries = 0;
  int pushback_retries = 0;
  double max_rel_error = 0;
  v1::Backend backend = v1::BACKEND_AUTO;
  int64_t bytes_moved = 0;
  // Status of the last attempt.
  grpc::StatusCode code = grpc::StatusCode::OK;
  std::string message;
};

// Runs `spec` until it succeeds or fails for good. Retries UNAVAILABLE (the
// server is down or restarting) with backoff, and RESOURCE_EXHAUSTED that
// carries a grpc-retry-pushback-ms trailer (queue full) after at least that
// long;
// any other error, or running out of `policy`, makes the job lost. A reply is
// checked against a float64 reference (streamed results are poisoned with
// NaN first, so a block never written counts as wrong). After UNAVAILABLE
// the next attempt goes over a reopened connection.
JobResult RunJob(Connection* connection, const JobSpec& spec, const RetryPolicy& policy,
                 std::mt19937_64* rng);

// Ways a client leaves a streamed job midway.
enum class Abandon {
  kCancel,      // TryCancel after a few result blocks (or while queued)
  kDeadline,    // a deadline of tens to hundreds of milliseconds
  kDisconnect,  // a child process streams the job and exits mid-stream
};
inline constexpr Abandon kAbandonKinds[] = {Abandon::kCancel, Abandon::kDeadline,
                                            Abandon::kDisconnect};
const char* AbandonName(Abandon kind);

// The streamed job `seed` stands for, for abandoning: sides log-uniform in
// [max_n/8, max_n/2] (at least 16 lines), cut into at least 16 blocks.
JobSpec AbandonSpec(uint64_t seed, int64_t max_n, int64_t max_block_bytes);

// Starts AbandonSpec(seed, ...) and leaves it as `kind` says. Returns what
// the client saw: the final status code's name, or for kDisconnect
// "disconnected" (the child left mid-stream), "ended first" (the stream ended
// before it could) or "child failed".
std::string AbandonJob(Abandon kind, const std::string& address, v1::Dgmm::Stub* stub,
                       uint64_t seed, int64_t max_n, int64_t max_block_bytes);

// Body of the child process of kDisconnect (this binary with
// --abandon_child): streams AbandonSpec(seed) to `address` and _exits after
// 1 to 3 result blocks. Exit code 0: left mid-stream; 3: the stream ended
// first.
int AbandonChildMain(const std::string& address, uint64_t seed, int64_t max_n,
                     int64_t max_block_bytes);

}  // namespace dgmm::stress

#endif  // DGMM_TESTS_STRESS_LOAD_CLIENTS_H_
