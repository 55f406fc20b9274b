// The path of a streamed job's blocks through the server, apart from how
// they travel. A block arrives from a source (today a MultiplyStream message;
// a shared-memory region or a device buffer can be another), is copied once
// into a block buffer, worked on in place by a stage (compute for a job, echo
// for the benchmark; a job whose C is of a wider dtype than A's is computed
// into a second buffer of C's size, and A's goes back at once), and leaves
// through the transport as a buffer that the transport gives back when it
// has sent it.
//
// The pipeline has no gRPC type in its interface. Its inputs are the events
// of the transport: a message arrived, the client half-closed, a write
// finished, the call failed. Its outputs go through PipelineIo: start a read,
// start a write, finish.
//
//   transport           BlockPipeline                      stage (worker)
//   ---------           -------------                      --------------
//   OnMessage ------> window of held blocks (<= 4) ------> Receive + Process
//   StartRead <------ read while the window has room       (one at a time,
//   StartWrite <----- finished blocks, in order <---------  in order)
//   OnWriteDone ----> window--, next write, next read
//   Finish <--------- once input is done, every block written and the
//                     stage ended (or at the first error)
//
// Memory: at most kStreamWindowBlocks blocks are between read and written,
// each held once by the transport (the message as it came, or the result as
// it leaves) and once in a block buffer: HostFootprint is what that takes,
// and the engine reserves exactly that for a streamed job.
//
// Ending: a failure (cancel, timeout, a bad block, a failed write) is
// recorded and reads and computes stop, but the stage is ended only once the
// block it is working on has returned, and the call finishes only once the
// write in flight is done. So the stage's End never races its Process.
//
// Thread safety: every method may be called from any thread. PipelineIo is
// called with the pipeline's lock held: the transport must not call back into
// the pipeline from inside those calls (gRPC's callback API runs reactions on
// its own threads, never inside StartRead/StartWrite/Finish).
#ifndef DGMM_SERVICE_PIPELINE_BLOCK_PIPELINE_H_
#define DGMM_SERVICE_PIPELINE_BLOCK_PIPELINE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "service/core/device.h"
#include "service/core/footprint.h"
#include "service/core/host_buffers.h"
#include "service/core/problem.h"
#include "service/core/validator.h"

namespace dgmm {

// A block message as it arrived, not yet decoded.
class BlockMessage {
 public:
  virtual ~BlockMessage() = default;
  // Bytes of the message as it came.
  virtual size_t size() const = 0;
  // Decodes it: `place` is told the block's first line and payload size and
  // returns where the payload goes (or an error, which the decode returns).
  // Returns the block's first line and size. INVALID_ARGUMENT for anything
  // but a block.
  struct Decoded {
    int64_t first_line = 0;
    size_t size = 0;
  };
  using Place = std::function<absl::StatusOr<void*>(int64_t first_line, size_t size)>;
  virtual absl::StatusOr<Decoded> Decode(const Place& place) = 0;
};

// A finished block on its way out.
struct OutBlock {
  int64_t first_line = 0;
  size_t bytes = 0;
  HostBuffer buffer;  // holds the result; the transport keeps it until sent
};

// What the pipeline asks of the transport. One read and one write at most
// are outstanding; Finish is called once, after the last write is done.
class PipelineIo {
 public:
  virtual ~PipelineIo() = default;
  virtual void StartRead() = 0;
  virtual void StartWrite(OutBlock block) = 0;
  // OK: every block was received, worked on and written, and the stage has
  // ended; the transport sends its closing message (the job's stats).
  virtual void Finish(const absl::Status& status) = 0;
};

// The work on a block, done in place.
class BlockStage {
 public:
  virtual ~BlockStage() = default;
  // Works on `lines` lines at `data`, starting at `first_line`. Called for
  // one block at a time, in order, on a worker thread.
  virtual absl::Status Process(std::byte* data, int64_t first_line, int64_t lines,
                               const CancelFn& cancelled) = 0;
  // The same from `in` into `out`, another buffer: a job whose C has a wider
  // dtype than A's (a promoted result) cannot be computed in place. Stages
  // that never see such a job keep the default, which refuses.
  virtual absl::Status ProcessInto(const std::byte* in, std::byte* out, int64_t first_line,
                                   int64_t lines, const CancelFn& cancelled) {
    return absl::UnimplementedError("this stage computes in place only");
  }
  // Called exactly once, with the outcome, after the last Process returned.
  virtual void End(const absl::Status& outcome, int64_t bytes_in, int64_t bytes_out) = 0;
};

class BlockPipeline : public std::enable_shared_from_this<BlockPipeline> {
 public:
  using Post = std::function<void(std::function<void()>)>;
  struct Options {
    int64_t max_block_bytes = int64_t{4} << 20;
    // Extra bytes a message may have beyond its payload (field tags, room
    // for fields a newer client adds); a larger message is refused as it
    // arrives.
    size_t framing_slack = size_t{64} << 10;
    int window_blocks = kStreamWindowBlocks;
  };

  // `pool` gives the block buffers (the job's device's), `post` runs work
  // on a job worker. `stage` and `io` must outlive the pipeline's calls to
  // them (io until DetachIo).
  BlockPipeline(const Problem& problem, Options options, HostBufferPool* pool, Post post,
                std::shared_ptr<BlockStage> stage, PipelineIo* io);

  // Starts reading blocks.
  void Start();
  // Events of the transport.
  void OnMessage(std::unique_ptr<BlockMessage> message);
  void OnHalfClose();
  // OK, or why the write failed (the call was cancelled or its deadline
  // passed), which ends the pipeline.
  void OnWriteDone(const absl::Status& status);
  // Ends the pipeline with `status` (cancel, timeout): counted once; takes
  // effect as described above.
  void Fail(const absl::Status& status);
  // The transport is gone (gRPC's OnDone): no further calls to io.
  void DetachIo();

  // For the idle timeouts: when a block last arrived or a result last left,
  // and whether any block has arrived.
  absl::Time last_progress() const;
  int64_t blocks_received() const;
  bool ended() const;
  // When the pipeline failed, if it did. A failure waits for the write in
  // flight before it finishes the call; a client that stopped reading never
  // completes that write, and the transport must then cancel the call.
  std::optional<absl::Time> failed_at() const;
  // Most blocks held at once so far (between read and written), and what
  // they held in bytes at most (payload, each block counted twice: see
  // HostFootprint).
  int peak_window() const;
  int64_t peak_held_bytes() const;

 private:
  struct Pending {
    std::unique_ptr<BlockMessage> message;
    int64_t message_bytes = 0;
    int64_t first_line = 0;
    int64_t lines = 0;
    size_t bytes = 0;
    HostBuffer buffer;
  };
  // Whether C's elements are wider than A's: each block is computed from
  // its buffer into one of C's size (BlockStage::ProcessInto).
  bool wider() const { return problem_.out_elem_size() != problem_.elem_size(); }
  void PumpLocked();
  void StartComputeLocked();
  void FailLocked(const absl::Status& status);
  void FinishLocked(const absl::Status& status);
  void Compute(std::shared_ptr<Pending> block);
  absl::Status Receive(Pending* block);

  const Problem problem_;
  const Options options_;
  HostBufferPool* const pool_;
  const Post post_;
  const std::shared_ptr<BlockStage> stage_;
  StreamAssembler assembler_;  // used by the one block being received

  mutable std::mutex mu_;
  PipelineIo* io_ ABSL_GUARDED_BY(mu_);  // null once detached
  std::deque<std::shared_ptr<Pending>> compute_queue_ ABSL_GUARDED_BY(mu_);
  std::deque<OutBlock> write_queue_ ABSL_GUARDED_BY(mu_);
  std::deque<int64_t> written_held_ ABSL_GUARDED_BY(mu_);  // bytes of each block queued or being written
  bool started_ ABSL_GUARDED_BY(mu_) = false;
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool computing_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool input_done_ ABSL_GUARDED_BY(mu_) = false;
  bool stage_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<absl::Status> error_ ABSL_GUARDED_BY(mu_);  // the first failure
  absl::Time failed_at_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<std::atomic<bool>> cancelled_ = std::make_shared<std::atomic<bool>>(false);
  int window_ ABSL_GUARDED_BY(mu_) = 0;  // blocks read and not yet written back
  int peak_window_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;  // payload of the blocks in the window, counted twice
  int64_t peak_held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t blocks_received_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_in_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t bytes_out_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time last_progress_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dgmm

#endif  // DGMM_SERVICE_PIPELINE_BLOCK_PIPELINE_H_
