// dgmm.bench.v1.Echo (proto/dgmm/bench/v1/echo.proto): a benchmark-only
// service with MultiplyStream's exact shape that returns each block
// unchanged. It measures the transport floor a streamed job is judged
// against (bench/stream_bench.sh). Served only with --enable_bench_echo.
#ifndef DGMM_SERVICE_ECHO_SERVICE_H_
#define DGMM_SERVICE_ECHO_SERVICE_H_

#include "dgmm/bench/v1/echo.grpc.pb.h"
#include "service/validator.h"

namespace dgmm {

class EchoService final : public bench::v1::Echo::CallbackService {
 public:
  // Headers and blocks are held to the same limits as MultiplyStream's.
  explicit EchoService(const RequestLimits& limits) : limits_(limits) {}

  // Header, accepted, then each block back as it came, then stats. The same
  // protocol checks as MultiplyStream (INVALID_ARGUMENT); no admission, no
  // compute. At most kStreamWindowBlocks blocks are held at once.
  grpc::ServerBidiReactor<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>* Echo(
      grpc::CallbackServerContext* context) override;

 private:
  const RequestLimits limits_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_ECHO_SERVICE_H_
