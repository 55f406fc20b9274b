// The gRPC face of dgmm: one reactor per RPC shape (callback API). Handlers
// validate, hand the job to the Engine and move bytes; no handler thread ever
// blocks on compute or on the admission queue.
#ifndef DGMM_SERVICE_HANDLERS_H_
#define DGMM_SERVICE_HANDLERS_H_

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "dgmm/v1/dgmm.grpc.pb.h"
#include "absl/time/time.h"
#include "grpcpp/generic/async_generic_service.h"
#include "service/auth.h"
#include "service/engine.h"
#include "service/receive_gate.h"
#include "service/regions/region_registry.h"

namespace dgmm {

// What a MultiplyStream message may carry beyond max_block_bytes of payload:
// its first_line and the fields' tags and lengths (a few dozen bytes), and
// room for fields a newer client may add. The transport's message limit and
// the stream handler's check of each message both use it.
inline constexpr size_t kBlockFramingSlack = size_t{64} << 10;

// When a MultiplyStream that went quiet is ended (DEADLINE_EXCEEDED), giving
// its reservation back.
struct StreamTimeouts {
  // No header within this time of the stream's start.
  absl::Duration header = absl::Seconds(30);
  // Admitted, and no block within this time of the acceptance.
  absl::Duration first_block = absl::Seconds(10);
  // Admitted, and neither a block received nor a result taken for this long.
  absl::Duration idle = absl::Seconds(120);
};

// Ends streams that went quiet, so that they give back their connection slot
// and their reservation: no header within --stream_header_timeout_s, or, once
// admitted, no block received and no result taken within
// --stream_idle_timeout_s. One thread; looks at every live stream a few
// times a second.
class StreamWatchdog {
 public:
  class Watched {
   public:
    virtual ~Watched() = default;
    // Ends the stream if it has been quiet too long at `now`.
    virtual void CheckIdle(absl::Time now) = 0;
  };
  StreamWatchdog();
  ~StreamWatchdog();
  // Watches `stream` until it is destroyed.
  void Watch(std::weak_ptr<Watched> stream);

 private:
  void Loop();
  std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::vector<std::weak_ptr<Watched>> streams_;
  std::thread thread_;
};

using StreamReactorBase = grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>;

inline constexpr char kMultiplyMethod[] = "/dgmm.v1.Dgmm/Multiply";

// Every RPC is served at the ByteBuffer level: MultiplyStream so that its
// payloads skip protobuf's copies (handlers.cc, proto/wire.h), GetServerInfo
// so that a request that does not parse gets INVALID_ARGUMENT. Multiply is
// left to DgmmGenericService, which takes it as a stream of one message: a
// unary method's message is read whole by gRPC before its handler runs,
// a stream's only when the handler asks (see ReceiveGate).
class DgmmService final
    : public v1::Dgmm::WithGenericMethod_Multiply<v1::Dgmm::WithRawCallbackMethod_MultiplyStream<
          v1::Dgmm::WithRawCallbackMethod_GetServerInfo<
              v1::Dgmm::WithRawCallbackMethod_RegisterRegion<
                  v1::Dgmm::WithRawCallbackMethod_UnregisterRegion<
                      v1::Dgmm::WithRawCallbackMethod_GetRegionStatus<
                          v1::Dgmm::WithRawCallbackMethod_MultiplyRegion<
                              v1::Dgmm::Service>>>>>>> {
 public:
  // `engine` must outlive the service. With `auth`, every RPC of this
  // service needs the bearer token (UNAUTHENTICATED otherwise). Multiply
  // requests not yet admitted hold at most `unary_receive_bytes` (at least
  // one request of --max_unary_message_bytes is let in), and at most
  // `unary_max_waiting` calls wait for that room.
  // `regions` (may be null: regions off) must outlive the service too.
  DgmmService(Engine* engine, std::optional<TokenAuth> auth, StreamTimeouts timeouts,
              int64_t unary_receive_bytes, int unary_max_waiting,
              RegionRegistry* regions = nullptr)
      : engine_(engine),
        auth_(std::move(auth)),
        timeouts_(timeouts),
        regions_(regions),
        gate_(unary_receive_bytes, unary_max_waiting) {}

  // A Multiply call (from DgmmGenericService).
  StreamReactorBase* NewMultiply(grpc::CallbackServerContext* context);
  StreamReactorBase* MultiplyStream(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  // Regions (service/region_service.h).
  grpc::ServerUnaryReactor* RegisterRegion(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* UnregisterRegion(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetRegionStatus(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* MultiplyRegion(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;

  // Calls of this service that gRPC is not yet done with.
  int64_t calls_in_progress() const { return calls_.load(); }

 private:
  // Which bearer token the call carries (TokenAuth::Match), or
  // UNAUTHENTICATED; 0 when no token is configured.
  absl::StatusOr<int> Authenticate(const grpc::CallbackServerContext* context) const;

  Engine* engine_;
  std::optional<TokenAuth> auth_;
  const StreamTimeouts timeouts_;
  RegionRegistry* const regions_;
  std::atomic<int64_t> calls_{0};
  ReceiveGate gate_;
  StreamWatchdog watchdog_;
};

// Takes the calls of methods no service registered: Multiply (for
// DgmmService) and unknown methods (UNIMPLEMENTED).
class DgmmGenericService final : public grpc::CallbackGenericService {
 public:
  explicit DgmmGenericService(DgmmService* service) : service_(service) {}
  StreamReactorBase* CreateReactor(grpc::GenericCallbackServerContext* context) override;

 private:
  DgmmService* service_;
  std::atomic<int64_t> unknown_calls_{0};
};

// The MultiplyStream reactor with admission and compute left out: the same
// protocol checks, window and worker hand-off, each block sent back as it
// came. Only for the streaming benchmark's Echo service (echo_service.h).
// With `auth`, the call needs the bearer token like dgmm's own RPCs.
// `calls` counts the call while gRPC holds it.
StreamReactorBase* NewEchoStreamReactor(Engine* engine, grpc::CallbackServerContext* context,
                                        const std::optional<TokenAuth>& auth,
                                        std::atomic<int64_t>* calls);

}  // namespace dgmm

#endif  // DGMM_SERVICE_HANDLERS_H_
