// How a job's host tile is cut into pieces that fit one staging buffer.
// Pure host code with no CUDA dependency, so it is tested on machines
// without a GPU too.
#ifndef DGMM_SERVICE_BACKENDS_CUDA_TILE_SPLIT_H_
#define DGMM_SERVICE_BACKENDS_CUDA_TILE_SPLIT_H_

#include <cstdint>
#include <vector>

#include "service/core/problem.h"

namespace dgmm::cuda {

// A contiguous run of a tile's elements that is processed as one unit:
// either whole lines, or (when one line is longer than the piece limit) a
// part of a single line. Either way it is itself a tile in normalized form:
// `lines` lines of `line_len` elements, the first being line `first_line` of
// the problem, starting at element `pos` within that line (0 for whole lines).
struct Piece {
  int64_t byte_offset = 0;  // from the start of the host tile
  int64_t bytes = 0;
  int64_t first_line = 0;
  int64_t lines = 0;
  int64_t line_len = 0;
  int64_t pos = 0;
};

// Cuts lines [first_line, first_line + lines) of `p` into pieces of at most
// `max_piece_bytes` (at least one element is always taken), in order, one at
// a time. Whole lines are grouped as many as fit; a line longer than the
// limit is cut into parts whose length is a multiple of 16 bytes where the
// limit allows, so that vector accesses stay aligned.
//
// With `ramp_bytes` > 0 (whole lines only), the pieces ramp: the first is at
// most ramp_bytes, each next one up to twice the one before, until
// max_piece_bytes; and near the end each takes at most half of what is left
// (never under ramp_bytes), so the last ones are small again. A pipeline
// then waits one small piece to start (the first copy in) and one to end
// (the last copy out) instead of a whole one each, with full pieces between.
class TileSplitter {
 public:
  TileSplitter(const Problem& p, int64_t first_line, int64_t lines, int64_t max_piece_bytes,
               int64_t ramp_bytes = 0);

  // Writes the next piece and returns true, or returns false when done.
  bool Next(Piece* piece);

 private:
  int64_t first_line_;
  int64_t lines_;
  int64_t line_len_;
  int64_t elem_;
  int64_t lines_per_piece_;  // 0 when lines are cut into parts
  int64_t part_len_;         // elements per part of a line
  int64_t line_ = 0;         // next line, relative to first_line_
  int64_t pos_ = 0;          // next position within that line
  int64_t max_piece_bytes_;
  int64_t ramp_bytes_;  // 0: no ramp
  int64_t next_limit_;  // the ramp's limit for the next piece
};

// The piece limit, in A's bytes, for pieces whose input (A's dtype) and
// output (C's, never narrower) must each fit `fit_bytes` (a staging buffer
// and a device slot): the whole elements of C that fit, at least one, in
// A's bytes. `fit_bytes` itself when C has A's dtype.
int64_t PieceLimitBytes(const Problem& p, int64_t fit_bytes);

// All pieces at once (for tests and small tiles).
std::vector<Piece> SplitTile(const Problem& p, int64_t first_line, int64_t lines,
                             int64_t max_piece_bytes, int64_t ramp_bytes = 0);

}  // namespace dgmm::cuda

#endif  // DGMM_SERVICE_BACKENDS_CUDA_TILE_SPLIT_H_
