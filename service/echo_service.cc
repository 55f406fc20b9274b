#include "service/echo_service.h"

#include "service/handlers.h"

namespace dgmm {

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* EchoService::Echo(grpc::CallbackServerContext* context) {
  return NewEchoStreamReactor(engine_, context, auth_, &calls_);
}

}  // namespace dgmm
