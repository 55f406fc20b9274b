#include "service/backends/cuda/tile_split.h"

#include <algorithm>

namespace dgmm::cuda {

TileSplitter::TileSplitter(const Problem& p, int64_t first_line, int64_t lines,
                           int64_t max_piece_bytes, int64_t ramp_bytes)
    : first_line_(first_line),
      lines_(p.line_len() > 0 ? std::max<int64_t>(lines, 0) : 0),
      line_len_(p.line_len()),
      elem_(static_cast<int64_t>(p.elem_size())),
      lines_per_piece_(p.line_bytes() > 0 ? max_piece_bytes / p.line_bytes() : 0),
      max_piece_bytes_(max_piece_bytes),
      ramp_bytes_(std::max<int64_t>(ramp_bytes, 0)),
      next_limit_(ramp_bytes_) {
  part_len_ = std::max<int64_t>(1, max_piece_bytes / elem_);
  const int64_t vector_elems = 16 / elem_;
  if (part_len_ >= vector_elems) part_len_ -= part_len_ % vector_elems;
}

bool TileSplitter::Next(Piece* piece) {
  if (line_ >= lines_) return false;
  const int64_t line_bytes = line_len_ * elem_;
  if (lines_per_piece_ > 0) {
    int64_t n = std::min(lines_per_piece_, lines_ - line_);
    if (ramp_bytes_ > 0 && ramp_bytes_ < max_piece_bytes_) {
      const int64_t left = (lines_ - line_) * line_bytes;
      const int64_t limit = std::min(next_limit_, std::max(ramp_bytes_, left / 2));
      n = std::min(n, std::max<int64_t>(1, limit / line_bytes));
      next_limit_ = std::min(max_piece_bytes_, next_limit_ * 2);
    }
    *piece = Piece{.byte_offset = line_ * line_bytes,
                   .bytes = n * line_bytes,
                   .first_line = first_line_ + line_,
                   .lines = n,
                   .line_len = line_len_,
                   .pos = 0};
    line_ += n;
    return true;
  }
  const int64_t n = std::min(part_len_, line_len_ - pos_);
  *piece = Piece{.byte_offset = line_ * line_bytes + pos_ * elem_,
                 .bytes = n * elem_,
                 .first_line = first_line_ + line_,
                 .lines = 1,
                 .line_len = n,
                 .pos = pos_};
  pos_ += n;
  if (pos_ == line_len_) {
    pos_ = 0;
    ++line_;
  }
  return true;
}

int64_t PieceLimitBytes(const Problem& p, int64_t fit_bytes) {
  const int64_t elem = static_cast<int64_t>(p.elem_size());
  const int64_t out_elem = static_cast<int64_t>(p.out_elem_size());
  if (out_elem == elem) return fit_bytes;
  return std::max<int64_t>(fit_bytes / out_elem, 1) * elem;
}

std::vector<Piece> SplitTile(const Problem& p, int64_t first_line, int64_t lines,
                             int64_t max_piece_bytes, int64_t ramp_bytes) {
  std::vector<Piece> pieces;
  TileSplitter splitter(p, first_line, lines, max_piece_bytes, ramp_bytes);
  Piece piece;
  while (splitter.Next(&piece)) pieces.push_back(piece);
  return pieces;
}

}  // namespace dgmm::cuda
