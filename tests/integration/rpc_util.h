// Helpers for integration tests that talk to the real dgmm-server with the
// generated stubs directly (so that malformed requests can be sent too).
#ifndef DGMM_TESTS_INTEGRATION_RPC_UTIL_H_
#define DGMM_TESTS_INTEGRATION_RPC_UTIL_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "dgmm/v1/dgmm.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace dgmm::testing {

// A random job: matrix and diagonal payloads with values in [0.5, 2), never
// zero, in the header's dtype and layout.
// Element `index` of a float32 or float64 payload, as a double.
double LoadElement(const std::string& bytes, int64_t index, v1::DType t);

struct RandomJob {
  v1::JobHeader header;
  std::string matrix;
};
RandomJob MakeJob(int64_t rows, int64_t cols, v1::DType dtype, v1::Layout layout, v1::Side side,
                  uint64_t seed);

// Max relative error of `result` against a float64 reference computed here
// from the definition; NaN (never written) counts as infinite error.
double MaxRelError(const RandomJob& job, const std::string& result);

std::unique_ptr<v1::Dgmm::Stub> Connect(const std::string& address);

// Sends `job` over MultiplyStream in blocks of `block_lines` lines, reads
// every reply, and returns the final status. Fills *result (poisoned with
// NaN first) and *stats when given.
grpc::Status StreamJob(v1::Dgmm::Stub* stub, const RandomJob& job, int64_t block_lines,
                       std::string* result, v1::JobStats* stats,
                       grpc::ClientContext* context = nullptr);

// Writes `job`'s header and then its lines in blocks of `block_lines`, then
// half-closes; stops at the first failed write. Blocks are copied straight
// from job.matrix into the messages.
void WriteJob(
    grpc::ClientReaderWriter<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>* stream,
    const RandomJob& job, int64_t block_lines);

// `job` as one MultiplyRequest message (Multiply and MultiplySmall).
v1::MultiplyRequest RequestOf(const RandomJob& job);

grpc::Status UnaryJob(v1::Dgmm::Stub* stub, const RandomJob& job, v1::MultiplyResponse* response,
                      grpc::ClientContext* context = nullptr);
// The same job sent with MultiplySmall.
grpc::Status SmallJob(v1::Dgmm::Stub* stub, const RandomJob& job, v1::MultiplyResponse* response,
                      grpc::ClientContext* context = nullptr);

v1::GetServerInfoResponse Info(v1::Dgmm::Stub* stub);

// A streamed job that has been admitted and then holds its reservation until
// Finish or Cancel: a deterministic way to keep budget busy.
class HeldStream {
 public:
  // Sends the header of a rows x cols float32 job and waits for acceptance.
  HeldStream(v1::Dgmm::Stub* stub, int64_t rows, int64_t cols);
  // Sends the rows, reads everything back, returns the final status.
  grpc::Status Finish();
  void Cancel() { ctx_.TryCancel(); }
  bool accepted() const { return accepted_; }

 private:
  RandomJob job_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>>
      stream_;
  bool accepted_ = false;
};
// Sum of reserved bytes over every device.
int64_t Reserved(v1::Dgmm::Stub* stub);
// Jobs waiting for admission, over every device.
int64_t Queued(v1::Dgmm::Stub* stub);
// Jobs refused or ended for `reason` (GetServerInfo's rejected_jobs), over
// every device.
int64_t Rejected(v1::Dgmm::Stub* stub, const std::string& reason);

// Polls `pred` every 10 ms until it holds or `ms` have passed; its last value.
bool WaitUntil(const std::function<bool()>& pred, int ms = 10000);

}  // namespace dgmm::testing

#endif  // DGMM_TESTS_INTEGRATION_RPC_UTIL_H_
