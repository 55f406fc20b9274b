// dgmm.bench.v1.Echo (proto/dgmm/bench/v1/echo.proto): a benchmark-only
// service with MultiplyStream's exact shape that returns each block
// unchanged. It measures the transport floor a streamed job is judged
// against (bench/stream_bench.sh). Served only with --enable_bench_echo.
#ifndef DGMM_SERVICE_ECHO_SERVICE_H_
#define DGMM_SERVICE_ECHO_SERVICE_H_

#include <optional>

#include "dgmm/bench/v1/echo.grpc.pb.h"
#include "service/auth.h"
#include "service/engine.h"

namespace dgmm {

class EchoService final
    : public bench::v1::Echo::WithRawCallbackMethod_Echo<bench::v1::Echo::Service> {
 public:
  // Headers and blocks are held to the engine's limits, like
  // MultiplyStream's, and blocks hop through the engine's workers the way
  // computed blocks do. `engine` must outlive the service.
  // With `auth`, Echo needs the same bearer token as dgmm's RPCs.
  EchoService(Engine* engine, std::optional<TokenAuth> auth)
      : engine_(engine), auth_(std::move(auth)) {}

  // Header, accepted, then each block back as it came, then stats. The same
  // protocol checks as MultiplyStream (INVALID_ARGUMENT); no admission, no
  // compute (an echo stage in the same BlockPipeline). At most
  // kStreamWindowBlocks blocks are held at once.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Echo(
      grpc::CallbackServerContext* context) override;

 private:
  Engine* const engine_;
  const std::optional<TokenAuth> auth_;
  std::atomic<int64_t> calls_{0};
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_ECHO_SERVICE_H_
