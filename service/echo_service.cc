#include "service/echo_service.h"

#include "service/handlers.h"

namespace dgmm {

grpc::ServerBidiReactor<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>*
EchoService::Echo(grpc::CallbackServerContext* context) {
  return NewEchoStreamReactor(engine_, context, auth_);
}

}  // namespace dgmm
