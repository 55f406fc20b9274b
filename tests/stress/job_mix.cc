#include "tests/stress/job_mix.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace dgmm::stress {
namespace {

// Log-uniform integer in [lo, hi].
int64_t LogUniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)),
                                           std::log(static_cast<double>(hi) + 1));
  return std::clamp<int64_t>(static_cast<int64_t>(std::exp(u(rng))), lo, hi);
}

uint64_t SplitMix(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

template <typename T>
void Fill(std::string* bytes, int64_t n, uint64_t* state) {
  bytes->resize(static_cast<std::size_t>(n) * sizeof(T));
  T* out = reinterpret_cast<T*>(bytes->data());
  for (int64_t i = 0; i < n; ++i) {
    const double u = static_cast<double>(SplitMix(state) >> 11) * 0x1.0p-53;
    out[i] = static_cast<T>(0.5 + 1.5 * u);
  }
}

template <typename T>
double MaxRelErrorOf(const testing::RandomJob& job, const std::string& result) {
  const v1::JobHeader& h = job.header;
  const T* a = reinterpret_cast<const T*>(job.matrix.data());
  const T* d = reinterpret_cast<const T*>(h.diagonal().data());
  const T* c = reinterpret_cast<const T*>(result.data());
  const bool row_major = h.layout() != v1::LAYOUT_COL_MAJOR;
  const bool left = h.side() == v1::SIDE_LEFT;
  const int64_t lines = row_major ? h.rows() : h.cols();
  const int64_t len = row_major ? h.cols() : h.rows();
  double worst = 0;
  for (int64_t l = 0; l < lines; ++l) {
    // Element (l, k) of the storage order is (i, j) = (l, k) row-major or (k, l) col-major.
    const bool diag_per_line = row_major == left;
    const double line_scale = diag_per_line ? static_cast<double>(d[l]) : 0.0;
    for (int64_t k = 0; k < len; ++k) {
      const int64_t at = l * len + k;
      const double scale = diag_per_line ? line_scale : static_cast<double>(d[k]);
      const double want = static_cast<double>(a[at]) * scale;
      const double got = static_cast<double>(c[at]);
      const double err = std::abs(got - want) / std::abs(want);
      if (!(err <= worst)) {
        if (std::isnan(err)) return std::numeric_limits<double>::infinity();
        worst = err;
      }
    }
  }
  return worst;
}

}  // namespace

std::vector<JobSpec> PlanJobs(const MixOptions& o) {
  std::mt19937_64 rng(o.seed);
  std::bernoulli_distribution coin(0.5);
  std::bernoulli_distribution stream_anyway(o.stream_fraction);
  const int64_t n = o.max_n;
  const std::vector<std::pair<int64_t, int64_t>> extremes = {
      {1, 1}, {n, n}, {n, n}, {1, n}, {n, 1}};
  std::vector<JobSpec> jobs(static_cast<std::size_t>(o.jobs));
  for (int i = 0; i < o.jobs; ++i) {
    JobSpec& s = jobs[static_cast<std::size_t>(i)];
    if (i < static_cast<int>(extremes.size())) {
      std::tie(s.rows, s.cols) = extremes[static_cast<std::size_t>(i)];
    } else {
      s.rows = LogUniform(rng, 1, n);
      s.cols = LogUniform(rng, 1, n);
    }
    s.dtype = i == 1   ? v1::DTYPE_FLOAT32
              : i == 2 ? v1::DTYPE_FLOAT64
                       : (coin(rng) ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT64);
    s.layout = coin(rng) ? v1::LAYOUT_ROW_MAJOR : v1::LAYOUT_COL_MAJOR;
    s.side = coin(rng) ? v1::SIDE_RIGHT : v1::SIDE_LEFT;
    s.streamed = s.MatrixBytes() > o.unary_limit_bytes || stream_anyway(rng);
    if (s.streamed) {
      const bool row_major = s.layout == v1::LAYOUT_ROW_MAJOR;
      const int64_t lines = row_major ? s.rows : s.cols;
      const int64_t line_bytes = (row_major ? s.cols : s.rows) * s.ElementBytes();
      const int64_t most = std::clamp<int64_t>(o.max_block_bytes / line_bytes, 1, lines);
      const int64_t least = std::min(most, (lines + o.max_blocks - 1) / o.max_blocks);
      // Half the streams use the largest blocks, the rest a log-uniform size
      // (down to one line) so that small jobs stream in several blocks too.
      s.block_lines = coin(rng) ? most : LogUniform(rng, least, most);
    }
    s.payload_seed = rng();
  }
  return jobs;
}

testing::RandomJob MakePayload(const JobSpec& s) {
  testing::RandomJob job;
  v1::JobHeader& h = job.header;
  h.set_rows(s.rows);
  h.set_cols(s.cols);
  h.set_dtype(s.dtype);
  h.set_layout(s.layout);
  h.set_side(s.side);
  uint64_t state = s.payload_seed;
  const int64_t diag_len = s.side == v1::SIDE_LEFT ? s.rows : s.cols;
  std::string diag;
  if (s.dtype == v1::DTYPE_FLOAT64) {
    Fill<double>(&diag, diag_len, &state);
    Fill<double>(&job.matrix, s.rows * s.cols, &state);
  } else {
    Fill<float>(&diag, diag_len, &state);
    Fill<float>(&job.matrix, s.rows * s.cols, &state);
  }
  h.set_diagonal(std::move(diag));
  return job;
}

double MaxRelError(const testing::RandomJob& job, const std::string& result) {
  if (result.size() != job.matrix.size()) return std::numeric_limits<double>::infinity();
  return job.header.dtype() == v1::DTYPE_FLOAT64 ? MaxRelErrorOf<double>(job, result)
                                                 : MaxRelErrorOf<float>(job, result);
}

double Tolerance(v1::DType dtype) {
  return dtype == v1::DTYPE_FLOAT64 ? 4 * std::numeric_limits<double>::epsilon()
                                    : 4 * std::numeric_limits<float>::epsilon();
}

std::string DescribeMix(const std::vector<JobSpec>& jobs) {
  struct Bucket {
    const char* name;
    int64_t below;
    int64_t jobs = 0, bytes = 0, streamed = 0, f64 = 0, left = 0, col_major = 0;
  };
  std::vector<Bucket> buckets = {{"< 4 KiB", 4 << 10},
                                 {"4 KiB – 256 KiB", 256 << 10},
                                 {"256 KiB – 4 MiB", 4 << 20},
                                 {"4 MiB – 32 MiB", 32 << 20},
                                 {">= 32 MiB", std::numeric_limits<int64_t>::max()}};
  Bucket total{"all", 0};
  for (const JobSpec& s : jobs) {
    for (Bucket* b : {&*std::find_if(buckets.begin(), buckets.end(),
                                     [&](const Bucket& b) { return s.MatrixBytes() < b.below; }),
                      &total}) {
      ++b->jobs;
      b->bytes += s.MatrixBytes();
      b->streamed += s.streamed;
      b->f64 += s.dtype == v1::DTYPE_FLOAT64;
      b->left += s.side == v1::SIDE_LEFT;
      b->col_major += s.layout == v1::LAYOUT_COL_MAJOR;
    }
  }
  buckets.push_back(total);
  std::string out =
      "| matrix size | jobs | matrix bytes (sent; as many come back) | streamed | float64 | "
      "side left | col-major |\n|---|---:|---:|---:|---:|---:|---:|\n";
  for (const Bucket& b : buckets) {
    absl::StrAppendFormat(&out, "| %s | %d | %.1f MiB | %d | %d | %d | %d |\n", b.name, b.jobs,
                          static_cast<double>(b.bytes) / (1 << 20), b.streamed, b.f64, b.left,
                          b.col_major);
  }
  return out;
}

}  // namespace dgmm::stress
