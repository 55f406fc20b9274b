// Where a unary reactor's OnDone and OnCancel run (docs/architecture.md,
// "Where OnDone runs"). gRPC 1.51 hands them to its executor thread, one
// more thread wake-up for every call, unless the reactor's
// InternalInlineable() lets them run on the thread where the call completed;
// gRPC's own DefaultReactor, which answers the health Check, does. On the
// H200 that hop was the one thread switch a 1x1 MultiplySmall job took
// beyond an empty RPC (bench/results/small_jobs/). InternalInlineable() is
// marked "not API, for internal reactors" in gRPC's headers: this relies on
// gRPC 1.51's behaviour (Debian 12's), and tests/unit/call_context_test.cc
// pins what dgmm's side of it promises.
//
// dgmm's unary reactors (InlineUnaryReactor) allow it except on a thread
// inside a gRPC operation that dgmm code started (GrpcOpScope: every Io call
// of every reactor, and the health status updates): such code may hold
// locks that OnDone takes again (UnaryJob replies under its lock, the
// watchdog cancels under the job's live lock). With 1.51's epoll1 poller
// the server's completions run on its own callback threads, one callback
// after another, and gRPC queues a Finish called inside the method handler
// until the handler returns, so no reaction runs inside our calls and the
// scope is a guard: it keeps that true on a gRPC that completes a callback
// where the operation was started.
#ifndef DGMM_SERVICE_RPC_INLINE_REACTIONS_H_
#define DGMM_SERVICE_RPC_INLINE_REACTIONS_H_

#include "grpcpp/support/server_callback.h"

namespace dgmm {

class GrpcOpScope {
 public:
  GrpcOpScope() { ++depth_; }
  ~GrpcOpScope() { --depth_; }
  GrpcOpScope(const GrpcOpScope&) = delete;
  GrpcOpScope& operator=(const GrpcOpScope&) = delete;
  static bool inside() { return depth_ > 0; }

 private:
  static inline thread_local int depth_ = 0;
};

class InlineUnaryReactor : public grpc::ServerUnaryReactor {
 public:
  bool InternalInlineable() override { return !GrpcOpScope::inside(); }
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_RPC_INLINE_REACTIONS_H_
