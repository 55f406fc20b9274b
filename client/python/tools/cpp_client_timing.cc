// dgmm_cpp_client_timing: times dgmm::Client::Multiply on one N x N job, the
// C++ side of bench/python_client_bench.py (the same job, the same server,
// the same output-buffer reuse as the Python side).
//
//   dgmm_cpp_client_timing SERVER N REPEATS [WARMUP] [f32|f64]
//
// Prints one line: `{"n": N, "seconds": [t1, t2, ...], "first": t0, "mode":
// M, "first_phases": P0, "last_phases": P}` (each one Multiply after WARMUP
// untimed ones; `first` is the client's first job, connection and same-host
// set-up included; M the last job's TransferModeName; P0 and P the first and
// last job's JobResult::same_host phases in seconds, zeros on the socket,
// and "server": that job's stats.total_ns in seconds). DGMM_SAME_HOST=0 in the
// environment turns the same-host path off (ClientOptions.same_host),
// DGMM_SAME_HOST_BLOCKS=K sets ClientOptions.same_host_blocks,
// DGMM_PROCESS_MEMORY=0 ClientOptions.process_memory (the mode then says
// "shm", else "shm process" when the server used the caller's memory),
// DGMM_TIMING_HUGEPAGES=1 puts A and C in dgmm::AllocateHostMemory (what
// dgmm::HostVector allocates: transparent huge pages, madvised as NumPy does
// for its large arrays) instead of plain anonymous memory. Exits 1
// on an RPC error, 3 when the first result differs from a float64 reference.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "dgmm/client.h"
#include "dgmm/host_memory.h"

namespace {

// A and C in anonymous memory of their own (as std::vector's large
// allocations are), or from dgmm::AllocateHostMemory when asked.
template <typename T>
class Array {
 public:
  Array(size_t n, bool hugepages) : n_(n), hugepages_(hugepages) {
    void* p = hugepages ? dgmm::AllocateHostMemory(bytes())
                        : mmap(nullptr, bytes(), PROT_READ | PROT_WRITE,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || p == nullptr) std::abort();
    p_ = static_cast<T*>(p);
  }
  ~Array() {
    if (hugepages_) {
      dgmm::FreeHostMemory(p_, bytes());
    } else {
      munmap(p_, bytes());
    }
  }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  T* data() { return p_; }
  size_t size() const { return n_; }
  T& operator[](size_t i) { return p_[i]; }

 private:
  size_t bytes() const { return std::max<size_t>(n_ * sizeof(T), 1); }
  T* p_ = nullptr;
  size_t n_;
  bool hugepages_;
};

template <typename T>
int Run(const std::string& server, int64_t n, int repeats, int warmup, dgmm::v1::DType dtype) {
  std::mt19937_64 rng(std::random_device{}());
  std::uniform_real_distribution<double> dist(-4.0, 4.0);
  const char* huge = std::getenv("DGMM_TIMING_HUGEPAGES");
  const bool hugepages = huge != nullptr && std::string(huge) == "1";
  Array<T> a(static_cast<size_t>(n * n), hugepages), c(a.size(), hugepages);
  std::vector<T> d(static_cast<size_t>(n));
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<T>(dist(rng));
  for (T& x : d) x = static_cast<T>(dist(rng));
  for (size_t i = 0; i < c.size(); ++i) c[i] = static_cast<T>(NAN);
  dgmm::ClientOptions options;
  const char* same_host = std::getenv("DGMM_SAME_HOST");
  options.same_host = same_host == nullptr || std::string(same_host) != "0";
  if (const char* pm = std::getenv("DGMM_PROCESS_MEMORY"); pm != nullptr) {
    options.process_memory = std::string(pm) != "0";
  }
  if (const char* blocks = std::getenv("DGMM_SAME_HOST_BLOCKS"); blocks != nullptr) {
    options.same_host_blocks = std::atoi(blocks);
  }
  dgmm::Client client(server, options);
  double first = 0;
  std::string mode;
  dgmm::JobResult::SameHostPhases first_phases, last_phases;
  double first_server = 0, last_server = 0;
  dgmm::Job job;
  job.matrix = {a.data(), n, n, dtype, dgmm::v1::LAYOUT_ROW_MAJOR};
  job.diagonal = d.data();
  job.diagonal_bytes = d.size() * sizeof(T);
  job.side = dgmm::v1::SIDE_RIGHT;
  std::vector<double> seconds;
  for (int i = 0; i < warmup + repeats; ++i) {
    const auto start = std::chrono::steady_clock::now();
    absl::StatusOr<dgmm::JobResult> r = client.Multiply(job, c.data(), c.size() * sizeof(T));
    const auto end = std::chrono::steady_clock::now();
    if (!r.ok()) {
      std::fprintf(stderr, "dgmm_cpp_client_timing: %s\n", r.status().ToString().c_str());
      return 1;
    }
    if (i == 0) {
      const double tol = sizeof(T) == 4 ? 1e-6 : 1e-15;
      for (int64_t row = 0; row < n; ++row) {
        for (int64_t col = 0; col < n; ++col) {
          const size_t k = static_cast<size_t>(row * n + col);
          const double want = static_cast<double>(a[k]) * static_cast<double>(d[col]);
          if (!(std::fabs(static_cast<double>(c[k]) - want) <= tol * std::fabs(want))) {
            std::fprintf(stderr, "dgmm_cpp_client_timing: wrong result at (%lld, %lld)\n",
                         static_cast<long long>(row), static_cast<long long>(col));
            return 3;
          }
        }
      }
    }
    if (i == 0) {
      first = std::chrono::duration<double>(end - start).count();
      first_phases = r->same_host;
      first_server = static_cast<double>(r->stats.total_ns()) * 1e-9;
    }
    last_phases = r->same_host;
    last_server = static_cast<double>(r->stats.total_ns()) * 1e-9;
    mode = std::string(dgmm::TransferModeName(r->mode)) + (r->process_memory ? " process" : "");
    if (i >= warmup) seconds.push_back(std::chrono::duration<double>(end - start).count());
  }
  std::printf("{\"n\": %lld, \"seconds\": [", static_cast<long long>(n));
  for (size_t i = 0; i < seconds.size(); ++i) std::printf(i ? ", %.9f" : "%.9f", seconds[i]);
  const auto phases = [](const dgmm::JobResult::SameHostPhases& p, double server) {
    char text[200];
    std::snprintf(text, sizeof text,
                  "{\"setup\": %.6f, \"copy_in\": %.6f, \"job\": %.6f, "
                  "\"copy_out\": %.6f, "
                  "\"server\": %.6f}",
                  p.setup, p.copy_in, p.job, p.copy_out, server);
    return std::string(text);
  };
  std::printf(
      "], \"first\": %.9f, \"mode\": \"%s\", \"first_phases\": %s, "
      "\"last_phases\": %s}\n",
      first, mode.c_str(), phases(first_phases, first_server).c_str(),
      phases(last_phases, last_server).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  dgmm::ConfigureGrpcForQuickExit();
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s SERVER N REPEATS [WARMUP] [f32|f64]\n", argv[0]);
    return 2;
  }
  const std::string server = argv[1];
  const int64_t n = std::atoll(argv[2]);
  const int repeats = std::atoi(argv[3]);
  const int warmup = argc > 4 ? std::atoi(argv[4]) : 1;
  const std::string dtype = argc > 5 ? argv[5] : "f32";
  if (n < 1 || repeats < 1 || warmup < 1 || (dtype != "f32" && dtype != "f64")) {
    std::fprintf(stderr, "%s: N >= 1, REPEATS >= 1, WARMUP >= 1, f32 or f64\n", argv[0]);
    return 2;
  }
  return dtype == "f32" ? Run<float>(server, n, repeats, warmup, dgmm::v1::DTYPE_FLOAT32)
                        : Run<double>(server, n, repeats, warmup, dgmm::v1::DTYPE_FLOAT64);
}
