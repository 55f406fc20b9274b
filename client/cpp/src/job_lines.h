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
  const int64_t diag_elems = job.side == v1::SIDE_LEFT ? job.matrix.rows : job.matrix.cols;
  l.diagonal_fits = job.diagonal != nullptr && diag_elems >= 0 &&
                    job.diagonal_bytes == static_cast<size_t>(diag_elems) * l.elem;
  l.slice_diagonal = l.diagonal_fits && (col_major != (job.side == v1::SIDE_LEFT));
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
    part.diagonal = static_cast<const char*>(whole.diagonal) + static_cast<size_t>(first) * l.elem;
    part.diagonal_bytes = static_cast<size_t>(count) * l.elem;
  }
  return part;
}

}  // namespace dgmm::internal

#endif  // DGMM_CLIENT_CPP_SRC_JOB_LINES_H_
