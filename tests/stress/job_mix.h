// The load test's job mix: every job's shape, dtype, layout, side and mode
// drawn up front from one seed (so a run can be repeated exactly), payloads
// generated from a per-job seed, and results checked against float64.
#ifndef DGMM_TESTS_STRESS_JOB_MIX_H_
#define DGMM_TESTS_STRESS_JOB_MIX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "dgmm/v1/dgmm.pb.h"
#include "tests/integration/rpc_util.h"

namespace dgmm::stress {

struct JobSpec {
  int64_t rows = 1;
  int64_t cols = 1;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  v1::Layout layout = v1::LAYOUT_ROW_MAJOR;
  v1::Side side = v1::SIDE_RIGHT;
  // MultiplyStream in blocks of `block_lines` lines; else Multiply.
  bool streamed = false;
  int64_t block_lines = 0;
  // Seed of the payload values.
  uint64_t payload_seed = 0;

  int64_t ElementBytes() const { return dtype == v1::DTYPE_FLOAT64 ? 8 : 4; }
  int64_t MatrixBytes() const { return rows * cols * ElementBytes(); }
};

struct MixOptions {
  int jobs = 10000;
  // Largest rows or cols; dims are log-uniform in [1, max_n].
  int64_t max_n = 4096;
  uint64_t seed = 1;
  // Jobs whose matrix is larger than this are always streamed.
  int64_t unary_limit_bytes = 32 << 20;
  // Share of the jobs under the unary limit that are streamed anyway.
  double stream_fraction = 0.25;
  // Server limit on one block's payload (GetServerInfo).
  int64_t max_block_bytes = 4 << 20;
  // A streamed job is cut into at most this many blocks.
  int max_blocks = 256;
};

// Draws `options.jobs` jobs. Rows and cols are independently log-uniform in
// [1, max_n] (so most jobs are small and a few percent have a side over
// max_n/2); the first jobs are the extremes 1x1, max_n x max_n (both dtypes),
// 1 x max_n and max_n x 1. Dtype, layout and side are uniform.
std::vector<JobSpec> PlanJobs(const MixOptions& options);

// The matrix and diagonal of `spec`: values in [0.5, 2), never zero.
testing::RandomJob MakePayload(const JobSpec& spec);

// Largest relative error of `result` against a float64 reference computed
// here from the definition; a wrong size or a NaN (the poison of a result
// never written) counts as infinite.
double MaxRelError(const testing::RandomJob& job, const std::string& result);

// Error above which a result counts as wrong: a few units in the last place
// of the dtype (the server does one rounded multiply per element).
double Tolerance(v1::DType dtype);

// Markdown table of the planned mix by size class: jobs, payload bytes,
// streamed share.
std::string DescribeMix(const std::vector<JobSpec>& jobs);

}  // namespace dgmm::stress

#endif  // DGMM_TESTS_STRESS_JOB_MIX_H_
