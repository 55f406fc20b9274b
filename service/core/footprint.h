// What a job holds while admitted, and the words for a job that can never
// hold it. The one place footprints and the too-large message are made:
// admission reserves HostFootprint plus the device's Device::Footprint, and a
// job over a budget's capacity is refused with TooLargeError.
#ifndef DGMM_SERVICE_CORE_FOOTPRINT_H_
#define DGMM_SERVICE_CORE_FOOTPRINT_H_

#include <cstdint>

#include "absl/status/status.h"
#include "service/core/device.h"
#include "service/core/problem.h"

namespace dgmm {

// Blocks of a streamed job the server holds at once (read, computing, or
// being written back): the BlockPipeline's window.
inline constexpr int kStreamWindowBlocks = 4;

// Host bytes a job holds while admitted, whatever device it runs on: its
// payload on the host side. kWhole: the request matrix as received and the
// buffer it is computed in (the reply is sent from it), plus the diagonal.
// kStreamed: the window, each block held twice (once by the transport, once
// in a block buffer) at the larger of its sizes in A and in C
// (StreamBlockBytes), plus the diagonal. Region modes: the diagonal alone
// (matrix and result are in client memory).
int64_t HostFootprint(const Problem& p, JobMode mode, int64_t max_block_bytes);

// The most bytes one result block of a streamed job of `p` takes: a block
// of A of max_block_bytes, in C's element size (max_block_bytes itself when
// C has A's dtype; twice that for a float32 A with a float64 C).
int64_t StreamBlockBytes(const Problem& p, int64_t max_block_bytes);

// Where a job's footprint did not fit.
struct TooLargeFacts {
  bool host_short = false;   // the host budget (else the device's)
  const Device* device = nullptr;  // the device whose budget is short
  int64_t need = 0;          // bytes the job needs of that budget
  int64_t capacity = 0;      // that budget's capacity
  int64_t max_dim = 0;       // --max_dim
  int64_t max_block_bytes = 0;
};

// RESOURCE_EXHAUSTED tagged too_large: the bytes needed, the budget's
// capacity and flag, the largest square N of the job's dtype that fits in
// its mode, and, for a whole-matrix job that would fit streamed, what
// streaming needs.
absl::Status TooLargeError(const Problem& p, JobMode mode, const TooLargeFacts& facts);

// "unary", "streamed", "host-region" or "cuda-ipc-region".
const char* ModeName(JobMode mode);

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_FOOTPRINT_H_
