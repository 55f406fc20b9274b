// ipc_bench: a client process whose matrix is already in GPU memory (as
// CuPy's or PyTorch's would be) runs dgmm jobs on it through CUDA IPC
// regions, and the same process times dgmm's kernel alone on the same
// buffers. Target: the IPC job, as the client sees it (one
// MultiplyRegion call, wall time), within the kernel's time + 0.2 ms.
//
//   ipc_bench --server 127.0.0.1:50051 --n 4000,10000,20000 --reps 50
//
// The server (a separate process, started with --allow_regions) opens the
// handles once at registration. Every N: A random (not zeros), C poisoned
// with NaN before the checked job, the result compared with a float64
// reference of A·diag(d) on the host.
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "dgmm/client.h"
#include "dgmm/regions.h"
#include "service/backends/cuda/dgmm_kernel.h"
#include "service/backends/cuda/vmm_export.h"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "dgmm-server address (--allow_regions)");
ABSL_FLAG(std::string, n, "4000,10000,20000", "square sizes N, float32");
ABSL_FLAG(std::string, backend, "auto", "backend hint of the jobs: auto, cuda-kernel or cublas");
ABSL_FLAG(std::string, import_child, "",
          "internal: N,<hex handle of A>,<hex handle of C>: open both in this (second) process "
          "and time dgmm's kernel on them, as the server would run it");
ABSL_FLAG(std::string, kind, "ipc",
          "how the client shares its GPU memory: ipc (cudaMalloc + cudaIpcGetMemHandle) or vmm "
          "(cuMemCreate, its POSIX descriptor passed through the server's local socket)");
ABSL_FLAG(int, reps, 50, "timed jobs per N (after 5 warm-ups); medians are reported");

namespace {

#define CHECK_CUDA(x)                                                                \
  do {                                                                             \
    cudaError_t e_ = (x);                                                          \
    if (e_ != cudaSuccess) {                                                       \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median of `reps` timings (events) of dgmm's kernel on `tile`, after 5
// untimed launches; with `idle`, each launch follows 1 ms of idle GPU.
double KernelMs(const dgmm::cuda::DeviceTile<float>& tile, int multiprocessors, int reps,
                bool idle) {
  cudaStream_t s;
  CHECK_CUDA(cudaStreamCreate(&s));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  std::vector<double> times;
  for (int i = 0; i < reps + 5; ++i) {
    if (idle) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK_CUDA(cudaEventRecord(e0, s));
    CHECK_CUDA(dgmm::cuda::LaunchDgmmKernel(tile, multiprocessors, s));
    CHECK_CUDA(cudaEventRecord(e1, s));
    CHECK_CUDA(cudaEventSynchronize(e1));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
    if (i >= 5) times.push_back(ms);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaStreamDestroy(s);
  return Median(times);
}

std::string Hex(const cudaIpcMemHandle_t& h) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : std::string(h.reserved, sizeof(h.reserved))) {
    out += digits[c >> 4];
    out += digits[c & 15];
  }
  return out;
}

cudaIpcMemHandle_t Unhex(absl::string_view hex) {
  cudaIpcMemHandle_t h{};
  for (size_t i = 0; i < sizeof(h.reserved) && 2 * i + 1 < hex.size(); ++i) {
    auto v = [](char c) { return c <= '9' ? c - '0' : c - 'a' + 10; };
    h.reserved[i] = static_cast<char>(v(hex[2 * i]) * 16 + v(hex[2 * i + 1]));
  }
  return h;
}

// The child: the kernel on memory imported from another process.
int ImportChild(const std::string& spec, int reps) {
  std::vector<std::string> parts = absl::StrSplit(spec, ',');
  int64_t n = 0;
  if (parts.size() != 3 || !absl::SimpleAtoi(parts[0], &n)) return 2;
  void *a = nullptr, *c = nullptr;
  CHECK_CUDA(cudaIpcOpenMemHandle(&a, Unhex(parts[1]), cudaIpcMemLazyEnablePeerAccess));
  CHECK_CUDA(cudaIpcOpenMemHandle(&c, Unhex(parts[2]), cudaIpcMemLazyEnablePeerAccess));
  float* d = nullptr;
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(float)));
  CHECK_CUDA(cudaMemset(d, 0, n * sizeof(float)));
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  dgmm::cuda::DeviceTile<float> tile{.in = static_cast<float*>(a), .out = static_cast<float*>(c),
                                     .diag = d, .lines = n, .line_len = n, .per_line = false};
  std::printf("%.6f\n", KernelMs(tile, sms, reps, /*idle=*/false));
  cudaIpcCloseMemHandle(a);
  cudaIpcCloseMemHandle(c);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_import_child).empty()) {
    return ImportChild(absl::GetFlag(FLAGS_import_child), absl::GetFlag(FLAGS_reps));
  }
  const std::string self = argv[0];
  dgmm::ConfigureGrpcForQuickExit();
  auto client = dgmm::Client::Create(absl::GetFlag(FLAGS_server));
  if (!client.ok()) {
    std::fprintf(stderr, "client: %s\n", client.status().ToString().c_str());
    return 1;
  }
  const int reps = absl::GetFlag(FLAGS_reps);
  int multiprocessors = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, 0));
  // The floor of any call: a GetServerInfo round trip on the same client.
  std::vector<double> rpc_ms;
  for (int i = 0; i < reps + 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    auto info = (*client)->GetServerInfo();
    const auto t1 = std::chrono::steady_clock::now();
    if (!info.ok()) {
      std::fprintf(stderr, "GetServerInfo: %s\n", info.status().ToString().c_str());
      return 1;
    }
    if (i >= 5) rpc_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  std::printf("GetServerInfo round trip (the floor of any call on this client): median %.3f ms\n\n",
              Median(rpc_ms));
  std::printf("| N | MB | kernel alone, back to back (ms) | kernel alone, after 1 ms idle (ms) | "
              "kernel in a second process on the imported memory (ms) | IPC job, client wall (ms) | job - kernel (ms) | server total (ms) | server compute "
              "(ms) | max rel err | target job <= kernel + 0.2 ms |\n"
              "|---|---|---|---|---|---|---|---|---|---|---|\n");
  bool all_met = true;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_n), ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n <= 0) return 2;
    const size_t elems = static_cast<size_t>(n * n);
    const size_t bytes = elems * sizeof(float);
    std::mt19937 rng(static_cast<unsigned>(n));
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    std::vector<float> a(elems), d(static_cast<size_t>(n)), c(elems);
    for (float& x : a) x = u(rng);
    for (float& x : d) x = u(rng);
    const bool vmm = absl::GetFlag(FLAGS_kind) == "vmm";
    float *da = nullptr, *dc = nullptr, *dd = nullptr;
    CHECK_CUDA(cudaMalloc(&dd, d.size() * sizeof(float)));
    std::unique_ptr<dgmm::cuda::VmmAllocation> va, vc;
    if (vmm) {
      auto a_alloc = dgmm::cuda::VmmAllocation::Create(0, static_cast<int64_t>(bytes));
      auto c_alloc = dgmm::cuda::VmmAllocation::Create(0, static_cast<int64_t>(bytes));
      if (!a_alloc.ok() || !c_alloc.ok()) {
        std::fprintf(stderr, "cuMemCreate: %s %s\n", a_alloc.status().ToString().c_str(),
                     c_alloc.status().ToString().c_str());
        return 1;
      }
      va = std::move(*a_alloc);
      vc = std::move(*c_alloc);
      da = reinterpret_cast<float*>(va->data());
      dc = reinterpret_cast<float*>(vc->data());
    } else {
      CHECK_CUDA(cudaMalloc(&da, bytes));
      CHECK_CUDA(cudaMalloc(&dc, bytes));
    }
    CHECK_CUDA(cudaMemcpy(da, a.data(), bytes, cudaMemcpyHostToDevice));
    CHECK_CUDA(cudaMemcpy(dd, d.data(), d.size() * sizeof(float), cudaMemcpyHostToDevice));

    cudaIpcMemHandle_t ha{}, hc{};
    if (!vmm) {
      CHECK_CUDA(cudaIpcGetMemHandle(&ha, da));
      CHECK_CUDA(cudaIpcGetMemHandle(&hc, dc));
    }
    // The kernel alone, on this process's buffers, timed with events.
    dgmm::cuda::DeviceTile<float> tile{.in = da, .out = dc, .diag = dd, .lines = n,
                                       .line_len = n, .per_line = false};
    const double kernel = KernelMs(tile, multiprocessors, reps, /*idle=*/false);
    // As the server launches it: one kernel after the GPU sat idle.
    const double idle_kernel = KernelMs(tile, multiprocessors, 20, /*idle=*/true);

    // Register both allocations once.
    // The same kernel in a second process on the imported memory (the
    // server's situation without the server).
    double child_ms = -1;
    if (!vmm) {  // (bench/ipc_vmm_bench times the VMM import without a server)
      const std::string cmd = self + " --reps=" + std::to_string(reps) + " --import_child=" +
                              std::to_string(n) + "," + Hex(ha) + "," + Hex(hc);
      if (FILE* p = popen(cmd.c_str(), "r")) {
        if (std::fscanf(p, "%lf", &child_ms) != 1) child_ms = -1;
        pclose(p);
      }
    }
    const std::string na = "ipc-a-" + std::to_string(n), nc = "ipc-c-" + std::to_string(n);
    const auto register_one = [&](const std::string& name, const cudaIpcMemHandle_t& h,
                                  const dgmm::cuda::VmmAllocation* alloc)
        -> absl::StatusOr<dgmm::v1::RegionStatus> {
      if (alloc == nullptr) {
        return dgmm::RegisterCudaIpcRegion(**client, name,
                                           absl::string_view(h.reserved, sizeof(h)), 0, 0,
                                           static_cast<int64_t>(bytes));
      }
      absl::StatusOr<int> fd = alloc->ExportFd();
      if (!fd.ok()) return fd.status();
      auto r = dgmm::RegisterCudaVmmRegion(**client, name, *fd, 0, alloc->bytes(), 0,
                                           static_cast<int64_t>(bytes));
      close(*fd);
      return r;
    };
    auto ra = register_one(na, ha, va.get());
    auto rc = register_one(nc, hc, vc.get());
    if (!ra.ok() || !rc.ok()) {
      std::fprintf(stderr, "register: %s %s\n", ra.status().ToString().c_str(),
                   rc.status().ToString().c_str());
      return 1;
    }
    dgmm::RegionJob job;
    job.rows = job.cols = n;
    job.matrix = dgmm::MakeRegionRef(na);
    job.result = dgmm::MakeRegionRef(nc);
    job.diagonal = d.data();
    job.diagonal_bytes = d.size() * sizeof(float);
    const std::string backend = absl::GetFlag(FLAGS_backend);
    job.backend = backend == "cuda-kernel" ? dgmm::v1::BACKEND_CUDA_KERNEL
                  : backend == "cublas"    ? dgmm::v1::BACKEND_CUBLAS
                                           : dgmm::v1::BACKEND_AUTO;

    // One checked job: C poisoned first.
    CHECK_CUDA(cudaMemset(dc, 0xff, bytes));  // NaN pattern
    auto first = dgmm::MultiplyRegion(**client, job);
    if (!first.ok()) {
      std::fprintf(stderr, "job: %s\n", first.status().ToString().c_str());
      return 1;
    }
    CHECK_CUDA(cudaMemcpy(c.data(), dc, bytes, cudaMemcpyDeviceToHost));
    double max_rel = 0;
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        const double ref = static_cast<double>(a[i * n + j]) * static_cast<double>(d[j]);
        const double got = c[i * n + j];
        const double rel = std::isfinite(got) ? std::abs(got - ref) / std::max(1e-30, std::abs(ref))
                                              : INFINITY;
        max_rel = std::max(max_rel, std::abs(ref) < 1e-30 ? std::abs(got) : rel);
      }
    }
    std::printf("(N=%lld: %s memory, region kind %s; the server ran backend %s)\n",
                static_cast<long long>(n), vmm ? "cuMemCreate" : "cudaMalloc",
                dgmm::v1::RegionKind_Name(ra->kind()).c_str(),
                dgmm::v1::Backend_Name(first->stats.backend()).c_str());
    std::vector<double> job_ms, server_ms, compute_ms;
    for (int i = 0; i < reps + 5; ++i) {
      const auto t0 = std::chrono::steady_clock::now();
      auto r = dgmm::MultiplyRegion(**client, job);
      const auto t1 = std::chrono::steady_clock::now();
      if (!r.ok()) {
        std::fprintf(stderr, "job: %s\n", r.status().ToString().c_str());
        return 1;
      }
      if (i < 5) continue;
      job_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      server_ms.push_back(r->stats.total_ns() * 1e-6);
      compute_ms.push_back(r->stats.compute_ns() * 1e-6);
    }
    const double k = kernel, j = Median(job_ms);
    const bool met = j <= k + 0.2 && max_rel < 1e-6;
    all_met = all_met && met;
    std::printf("| %lld | %.0f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1e | %s (%.3f vs %.3f) |\n",
                static_cast<long long>(n), bytes / 1e6, k, idle_kernel, child_ms, j, j - k,
                Median(server_ms),
                Median(compute_ms), max_rel, met ? "MET" : "MISSED", j, k + 0.2);
    std::fflush(stdout);
    dgmm::UnregisterRegion(**client, na).IgnoreError();
    dgmm::UnregisterRegion(**client, nc).IgnoreError();
    if (!vmm) {
      cudaFree(da);
      cudaFree(dc);
    }
    va.reset();
    vc.reset();
    cudaFree(dd);
  }
  return all_met ? 0 : 3;
}
