// How fast this host's CPUs copy memory that does not fit in cache, with 1 to
// 16 threads at once: the budget a wire job spends (issue 26). A striped job
// copies every byte three times on its way in (the client's socket send, the
// server's socket receive, the server's copy out of gRPC's slices) and three
// times on its way out, each a read and a write of DRAM at these sizes,
// where iperf3's loopback ceiling copies a small buffer that stays in cache.
//
// Each thread copies its own --mib MiB source into its own destination,
// --reps times, all threads started together; GB/s is bytes copied (counted
// once) over the wall time of the slowest thread. "warm" destinations were
// written before; "fresh" ones are new mappings each repetition, so the
// copy also takes the page faults and the kernel's zeroing, as a receive
// into newly allocated memory does. Every destination is checked against
// its source after the last repetition.
//
//   copy_bandwidth_bench [--threads=1,2,4,8,16] [--mib=256] [--reps=5]

#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

ABSL_FLAG(std::string, threads, "1,2,4,8,16", "comma-separated thread counts");
ABSL_FLAG(int, mib, 256, "MiB each thread copies per repetition (well over any cache)");
ABSL_FLAG(int, reps, 5, "repetitions per thread count and mode");

namespace {

using Clock = std::chrono::steady_clock;

void* Map(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  return p;
}

// GB/s of `threads` threads each copying `bytes` `reps` times; false in *ok
// when a destination differs from its source at the end.
double Run(int threads, size_t bytes, int reps, bool fresh, bool* ok) {
  std::vector<unsigned char*> src(threads), dst(threads);
  for (int t = 0; t < threads; ++t) {
    src[t] = static_cast<unsigned char*>(Map(bytes));
    for (size_t i = 0; i < bytes; i += 4096) src[t][i] = static_cast<unsigned char>(i / 4096 + t);
    std::memset(src[t], t + 1, 64);
    dst[t] = static_cast<unsigned char*>(Map(bytes));
    std::memset(dst[t], 0xA5, bytes);  // faulted in and poisoned
  }
  std::vector<double> seconds(threads);
  std::vector<std::thread> workers;
  const Clock::time_point go = Clock::now() + std::chrono::milliseconds(50);
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      std::this_thread::sleep_until(go);
      Clock::time_point start = Clock::now();
      for (int r = 0; r < reps; ++r) {
        if (fresh) {
          munmap(dst[t], bytes);
          dst[t] = static_cast<unsigned char*>(Map(bytes));
        }
        std::memcpy(dst[t], src[t], bytes);
      }
      seconds[t] = std::chrono::duration<double>(Clock::now() - start).count();
    });
  }
  for (std::thread& w : workers) w.join();
  *ok = true;
  for (int t = 0; t < threads; ++t) {
    if (std::memcmp(dst[t], src[t], bytes) != 0) *ok = false;
    munmap(src[t], bytes);
    munmap(dst[t], bytes);
  }
  const double wall = *std::max_element(seconds.begin(), seconds.end());
  return static_cast<double>(bytes) * reps * threads / wall / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const size_t bytes = static_cast<size_t>(absl::GetFlag(FLAGS_mib)) << 20;
  const int reps = absl::GetFlag(FLAGS_reps);
  std::printf("# memcpy of %d MiB per thread, %d repetitions; GB/s = bytes copied / wall\n",
              absl::GetFlag(FLAGS_mib), reps);
  std::printf("| threads | warm dst GB/s | fresh dst GB/s (faults + zeroing) | checked |\n");
  std::printf("|---|---|---|---|\n");
  bool all_ok = true;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int threads = 0;
    if (!absl::SimpleAtoi(s, &threads) || threads < 1) {
      std::fprintf(stderr, "bad --threads entry '%s'\n", std::string(s).c_str());
      return 2;
    }
    bool ok_warm = false, ok_fresh = false;
    const double warm = Run(threads, bytes, reps, false, &ok_warm);
    const double fresh = Run(threads, bytes, reps, true, &ok_fresh);
    all_ok = all_ok && ok_warm && ok_fresh;
    std::printf("| %d | %.1f | %.1f | %s |\n", threads, warm, fresh,
                ok_warm && ok_fresh ? "equal" : "DIFFERENT");
    std::fflush(stdout);
  }
  return all_ok ? 0 : 1;
}
