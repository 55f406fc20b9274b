// Runs one diag(d)·A job (float64, column-major) on the server named by
// argv[1] through the installed dgmm::client and checks it exactly: the
// scaled elements are products of small integers. Prints "consumer ok".
#include <cstdio>
#include <vector>

#include "dgmm/client.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: consumer HOST:PORT\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<dgmm::Client>> client = dgmm::Client::Create(argv[1]);
  if (!client.ok()) return 2;
  const int64_t rows = 40, cols = 30;
  std::vector<double> a(rows * cols), d(rows), c(rows * cols, -1);
  for (size_t k = 0; k < a.size(); ++k) a[k] = static_cast<double>(k % 11);
  for (size_t i = 0; i < d.size(); ++i) d[i] = static_cast<double>(i) - 7;
  dgmm::Job job;
  job.matrix = {a.data(), rows, cols, dgmm::v1::DTYPE_FLOAT64, dgmm::v1::LAYOUT_COL_MAJOR};
  job.diagonal = d.data();
  job.diagonal_bytes = d.size() * sizeof(double);
  job.side = dgmm::v1::SIDE_LEFT;
  absl::StatusOr<dgmm::JobResult> done = (*client)->Multiply(job, c.data(), c.size() * 8);
  if (!done.ok()) {
    std::fprintf(stderr, "%s\n", done.status().ToString().c_str());
    return 1;
  }
  for (int64_t j = 0; j < cols; ++j) {
    for (int64_t i = 0; i < rows; ++i) {
      if (c[j * rows + i] != d[i] * a[j * rows + i]) {
        std::fprintf(stderr, "wrong C[%d][%d]\n", static_cast<int>(i), static_cast<int>(j));
        return 1;
      }
    }
  }
  std::printf("consumer ok\n");
  return 0;
}
