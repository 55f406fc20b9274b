// dgmm.bench.v1.Echo (proto/dgmm/bench/v1/echo.proto): a benchmark-only
// service with MultiplyStream's exact shape that returns each block
// unchanged. It measures the transport floor a streamed job is judged
// against (bench/stream_bench.sh). Served only with --enable_bench_echo.
#ifndef DGMM_SERVICE_RPC_ECHO_SERVICE_H_
#define DGMM_SERVICE_RPC_ECHO_SERVICE_H_

#include <optional>

#include "dgmm/bench/v1/echo.grpc.pb.h"
#include "service/rpc/auth.h"
#include "service/rpc/call_context.h"
#include "service/engine/engine.h"

namespace dgmm {

class EchoService final
    : public bench::v1::Echo::WithRawCallbackMethod_Echo<bench::v1::Echo::Service> {
 public:
  // Headers and blocks are held to the engine's limits, like
  // MultiplyStream's, and blocks hop through the engine's workers the way
  // computed blocks do. `engine` must outlive the service.
  // With `auth`, Echo needs the same bearer token as dgmm's RPCs.
  EchoService(Engine* engine, std::optional<TokenAuth> auth) : engine_(engine) {
    policy_.auth = std::move(auth);
  }

  // Header, accepted, then each block back as it came, then stats. The same
  // protocol checks as MultiplyStream (INVALID_ARGUMENT); no admission, no
  // compute (an EchoStage in the same BlockPipeline, rpc/stream_reactor.cc). At most
  // kStreamWindowBlocks blocks are held at once.
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Echo(
      grpc::CallbackServerContext* context) override;

 private:
  Engine* const engine_;
  CallPolicy policy_;
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_ECHO_SERVICE_H_
