#include "service/rpc/echo_service.h"

#include "service/rpc/reactors.h"

namespace dgmm {

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* EchoService::Echo(
    grpc::CallbackServerContext* context) {
  return NewEchoReactor(context, &policy_, engine_);
}

}  // namespace dgmm
