// A job as lines (the rows of a row-major matrix, the columns of a
// column-major one), and the job of a range of them: what striping
// (client.cc) and same-host blocks (same_host.cc) both cut a job into.
// Internal to the client library.
#ifndef DGMM_CLIENT_CPP_SRC_JOB_LINES_H_
#define DGMM_CLIENT_CPP_SRC_JOB_LINES_H_

#include <cstddef>
#include <cstdint>

#include "dgmm/client.h"

namespace dgmm::internal {

struct JobLines {
  int64_t lines = 0;
  size_t elem = 0;
  // Bytes of one diagonal element, and of the whole diagonal that runs
  // along the lines (the one sliced; 0 when none is).
  size_t diag_elem = 0;
  size_t sliced_bytes = 0;
  // SIDE_BOTH: the sliced diagonal is the right one (column-major), else
  // the left one / the only one.
  bool slice_right = false;
  // Whether the diagonal has the length the side needs: only then may the
  // job be cut (otherwise it goes whole and the server's validator names
  // the problem).
  bool diagonal_fits = false;
  // The diagonal runs along the lines (one scale per line), so a range of
  // lines takes its slice of it; otherwise every range takes all of it.
  bool slice_diagonal = false;
};

inline JobLines LinesOfJob(const Job& job) {
  JobLines l;
  const bool col_major = job.matrix.layout == v1::LAYOUT_COL_MAJOR;
  l.lines = col_major ? job.matrix.cols : job.matrix.rows;
  l.elem = ElementSize(job.matrix.dtype);
  l.diag_elem =
      job.diagonal_dtype == v1::DTYPE_UNSPECIFIED ? l.elem : ElementSize(job.diagonal_dtype);
  const auto fits = [&](const void* d, size_t bytes, int64_t elems) {
    return d != nullptr && elems >= 0 && l.diag_elem > 0 &&
           bytes == static_cast<size_t>(elems) * l.diag_elem;
  };
  if (job.side == v1::SIDE_BOTH) {
    // Left (rows) runs along the lines of a row-major matrix, right (cols)
    // along those of a column-major one.
    l.diagonal_fits = fits(job.diagonal, job.diagonal_bytes, job.matrix.rows) &&
                      fits(job.right_diagonal, job.right_diagonal_bytes, job.matrix.cols);
    l.slice_diagonal = l.diagonal_fits;
    l.slice_right = col_major;
    l.sliced_bytes = l.slice_right ? job.right_diagonal_bytes : job.diagonal_bytes;
    return l;
  }
  const int64_t diag_elems = job.side == v1::SIDE_LEFT ? job.matrix.rows : job.matrix.cols;
  l.diagonal_fits =
      fits(job.diagonal, job.diagonal_bytes, diag_elems) && job.right_diagonal_bytes == 0;
  l.slice_diagonal = l.diagonal_fits && (col_major != (job.side == v1::SIDE_LEFT));
  l.sliced_bytes = l.slice_diagonal ? job.diagonal_bytes : 0;
  return l;
}

// The job of lines [first, first + count) of `whole`, whose lines are
// `line_bytes` long: its matrix starts at line `first`, and its diagonal is
// the slice of those lines where the diagonal runs along them.
inline Job JobOfLines(const Job& whole, const JobLines& l, size_t line_bytes, int64_t first,
                      int64_t count) {
  Job part = whole;
  part.matrix.data =
      static_cast<const char*>(whole.matrix.data) + static_cast<size_t>(first) * line_bytes;
  (whole.matrix.layout == v1::LAYOUT_COL_MAJOR ? part.matrix.cols : part.matrix.rows) = count;
  if (l.slice_diagonal) {
    const void*& d = l.slice_right ? part.right_diagonal : part.diagonal;
    size_t& bytes = l.slice_right ? part.right_diagonal_bytes : part.diagonal_bytes;
    d = static_cast<const char*>(d) + static_cast<size_t>(first) * l.diag_elem;
    bytes = static_cast<size_t>(count) * l.diag_elem;
  }
  return part;
}

}  // namespace dgmm::internal

#endif  // DGMM_CLIENT_CPP_SRC_JOB_LINES_H_
