// The gRPC face of dgmm: one reactor per RPC shape (callback API). Handlers
// validate, hand the job to the Engine and move bytes; no handler thread ever
// blocks on compute or on the admission queue.
#ifndef DGMM_SERVICE_HANDLERS_H_
#define DGMM_SERVICE_HANDLERS_H_

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "dgmm/v1/dgmm.grpc.pb.h"
#include "service/auth.h"
#include "service/engine.h"

namespace dgmm {

// What a MultiplyStream message may carry beyond max_block_bytes of payload:
// its first_line and the fields' tags and lengths (a few dozen bytes), and
// room for fields a newer client may add. The transport's message limit and
// the stream handler's check of each message both use it.
inline constexpr size_t kBlockFramingSlack = size_t{64} << 10;

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

// Multiply and MultiplyStream are served at the ByteBuffer level, so their
// payloads skip protobuf's copies (handlers.cc, proto/wire.h); GetServerInfo
// is typed.
class DgmmService final
    : public v1::Dgmm::WithRawCallbackMethod_Multiply<v1::Dgmm::WithRawCallbackMethod_MultiplyStream<
          v1::Dgmm::WithCallbackMethod_GetServerInfo<v1::Dgmm::Service>>> {
 public:
  // `engine` must outlive the service. With `auth`, every RPC of this
  // service needs the bearer token (UNAUTHENTICATED otherwise).
  explicit DgmmService(Engine* engine, std::optional<TokenAuth> auth = std::nullopt)
      : engine_(engine), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* Multiply(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  StreamReactorBase* MultiplyStream(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetServerInfo(grpc::CallbackServerContext* context,
                                          const v1::GetServerInfoRequest* request,
                                          v1::GetServerInfoResponse* response) override;

 private:
  absl::Status Authenticate(const grpc::CallbackServerContext* context) const;

  Engine* engine_;
  std::optional<TokenAuth> auth_;
  StreamWatchdog watchdog_;
};

// The MultiplyStream reactor with admission and compute left out: the same
// protocol checks, window and worker hand-off, each block sent back as it
// came. Only for the streaming benchmark's Echo service (echo_service.h).
// With `auth`, the call needs the bearer token like dgmm's own RPCs.
StreamReactorBase* NewEchoStreamReactor(Engine* engine, grpc::CallbackServerContext* context,
                     const std::optional<TokenAuth>& auth);

}  // namespace dgmm

#endif  // DGMM_SERVICE_HANDLERS_H_
