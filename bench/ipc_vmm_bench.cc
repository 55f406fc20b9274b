// ipc_vmm_bench: dgmm's kernel on GPU memory shared by another process, by
// the way it was shared, with no server involved. One process
// (the owner) allocates A and C; a second process (this binary re-executed,
// --child) maps them and times the same kernel there:
//
//   - the owner's cudaMalloc memory (the reference of every ratio) and its
//     own cuMemCreate memory;
//   - cudaMalloc memory opened in the second process with
//     cudaIpcOpenMemHandle (CudaDevice::OpenIpcMemory, the legacy path);
//   - cuMemCreate memory exported as a POSIX descriptor, passed over a Unix
//     socket with SCM_RIGHTS and imported in the second process
//     (CudaDevice::ImportVmmMemory, the VMM path);
//   - a device-to-device copy of the same bytes (the ceiling);
//
// and, to find out why one path is slower: the second process on its own
// memory; the owner's buffer timed again while the other process has it open
// and after it closed it; a cudaMalloc whose size is rounded up to 2 MiB;
// cuMemCreate with CU_MEM_ALLOCATION_COMP_GENERIC (and A all zeros, which
// compressible memory would read faster); the kernel in place; read-only and
// write-only passes; a sweep over the bytes touched (TLB reach); and the
// pointer attributes of each mapping (base alignment, mapping size).
//
//   ipc_vmm_bench --n=10000,20000 --reps=300
//
// Every N: A, C and d random (never zeros, except where said), each timing
// the median of --reps launches timed with CUDA events after 10 warm-ups;
// C poisoned with NaN before the second process's last launch and then
// checked against a float64 reference of A·diag(d) in the owner.
#include <cuda.h>
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bench/bench_kernels.h"
#include "service/backends/cuda/cuda_device.h"
#include "service/backends/cuda/dgmm_kernel.h"
#include "service/backends/cuda/driver_api.h"
#include "service/backends/cuda/vmm_export.h"

ABSL_FLAG(std::string, n, "10000,20000", "square sizes N, float32");
ABSL_FLAG(int, reps, 300, "timed launches per measurement (after 10 warm-ups); medians");
ABSL_FLAG(int, child, -1, "internal: run as the second process on this socket");

namespace {

using dgmm::cuda::VmmAllocation;

#define CHECK_CUDA(x)                                                                         \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

constexpr uint64_t kSeedA = 1, kSeedC = 2, kSeedD = 3;
constexpr int64_t kTwoMiB = int64_t{2} << 20;
constexpr int kMaxFds = 4;

// ------------------------------------------------------------ timing

class Timer {
 public:
  explicit Timer(int reps) : reps_(reps) {
    CHECK_CUDA(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreate(&e0_));
    CHECK_CUDA(cudaEventCreate(&e1_));
    CHECK_CUDA(cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, 0));
  }
  ~Timer() {
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cudaStreamDestroy(s_);
  }
  int sms() const { return sms_; }

  // Median ms of `op` over reps launches after 10 warm-ups; -1 when it fails.
  double Time(const std::function<cudaError_t(cudaStream_t)>& op) {
    std::vector<double> t;
    for (int i = 0; i < reps_ + 10; ++i) {
      if (cudaEventRecord(e0_, s_) != cudaSuccess || op(s_) != cudaSuccess ||
          cudaEventRecord(e1_, s_) != cudaSuccess || cudaEventSynchronize(e1_) != cudaSuccess) {
        std::fprintf(stderr, "timed op failed: %s\n", cudaGetErrorString(cudaGetLastError()));
        return -1;
      }
      float ms = 0;
      cudaEventElapsedTime(&ms, e0_, e1_);
      if (i >= 10) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    return t[t.size() / 2];
  }
  // dgmm's kernel: out = in · diag(d) over the first `lines` lines of n.
  double Kernel(const void* in, void* out, const float* d, int64_t lines, int64_t n) {
    const dgmm::cuda::DeviceTile<float> tile{.in = static_cast<const float*>(in),
                                             .out = static_cast<float*>(out),
                                             .diag = d,
                                             .lines = lines,
                                             .line_len = n,
                                             .per_line = false};
    return Time([&](cudaStream_t s) { return dgmm::cuda::LaunchDgmmKernel(tile, sms_, s); });
  }
  double Copy(void* dst, const void* src, int64_t bytes) {
    return Time([&](cudaStream_t s) {
      return cudaMemcpyAsync(dst, src, static_cast<size_t>(bytes), cudaMemcpyDeviceToDevice, s);
    });
  }
  double Read(const void* p, int64_t bytes) {
    return Time([&](cudaStream_t s) { return dgmm::bench::ReadOnce(p, bytes / 16, sms_, s); });
  }
  double Write(void* p, int64_t bytes) {
    return Time([&](cudaStream_t s) { return dgmm::bench::WriteOnce(p, bytes / 16, sms_, s); });
  }

 private:
  int reps_;
  int sms_ = 0;
  cudaStream_t s_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
};

// Lines of N whose bytes make up the sweep's sizes (whole lines, < N).
std::vector<std::pair<int64_t, int64_t>> SweepLines(int64_t n) {
  std::vector<std::pair<int64_t, int64_t>> out;  // {MB, lines}
  for (int64_t mb : {16, 32, 64, 128, 256, 512, 1024}) {
    const int64_t lines = (mb << 20) / (n * 4);
    if (lines > 0 && lines < n) out.push_back({mb, lines});
  }
  return out;
}

// What the driver says of the mapping behind `p`.
std::string Attributes(const void* p) {
  auto api = dgmm::cuda::Driver();
  if (!api.ok()) return std::string(api.status().message());
  const auto ptr = reinterpret_cast<CUdeviceptr>(p);
  auto u64 = [&](CUpointer_attribute a) -> std::string {
    uint64_t v = 0;
    if ((*api)->PointerGetAttribute(&v, a, ptr) != CUDA_SUCCESS) return "n/a";
    return absl::StrCat(v);
  };
  auto i32 = [&](CUpointer_attribute a) -> std::string {
    int v = 0;
    if ((*api)->PointerGetAttribute(&v, a, ptr) != CUDA_SUCCESS) return "n/a";
    return absl::StrCat(v);
  };
  uint64_t map_base = 0;
  std::string map_off = "n/a";
  if ((*api)->PointerGetAttribute(&map_base, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR, ptr) ==
      CUDA_SUCCESS) {
    map_off = absl::StrCat(ptr - map_base);
  }
  return absl::StrFormat(
      "base %% 2MiB = %d, base %% 64KiB = %d, range_size = %s, mapping_size = %s, "
      "offset in mapping = %s, legacy_ipc_capable = %s, allowed_handle_types = %s, "
      "access_flags = %s, rdma_capable = %s",
      ptr % kTwoMiB, ptr % 65536, u64(CU_POINTER_ATTRIBUTE_RANGE_SIZE),
      u64(CU_POINTER_ATTRIBUTE_MAPPING_SIZE), map_off,
      i32(CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE),
      u64(CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES), i32(CU_POINTER_ATTRIBUTE_ACCESS_FLAGS),
      i32(CU_POINTER_ATTRIBUTE_IS_GPU_DIRECT_RDMA_CAPABLE));
}

std::string FdTarget(int fd) {
  char buf[256] = {};
  const ssize_t n = readlink(absl::StrCat("/proc/self/fd/", fd).c_str(), buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "?";
}

// n ones on the device: the diagonal of the in-place timings, which then
// leave the (random) data as it was however many times they run.
float* Ones(int64_t n) {
  const std::vector<float> host(static_cast<size_t>(n), 1.0f);
  float* p = nullptr;
  CHECK_CUDA(cudaMalloc(&p, n * sizeof(float)));
  CHECK_CUDA(cudaMemcpy(p, host.data(), n * sizeof(float), cudaMemcpyHostToDevice));
  return p;
}

// ------------------------------------------------------------ messages

struct Request {
  int64_t n = 0;
  cudaIpcMemHandle_t ipc[4] = {};  // cudaMalloc A, C; rounded-up cudaMalloc A, C
  int64_t vmm_bytes[4] = {};       // cuMemCreate A, C; COMP_GENERIC A, C
  int32_t fds = 0;                 // descriptors attached, in vmm_bytes order
};

bool SendMsg(int sock, const void* data, size_t len, const int* fds = nullptr, int nfds = 0) {
  iovec iov{const_cast<void*>(data), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  if (nfds > 0) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
    std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  }
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

// Bytes received (0 at EOF, -1 on error); descriptors into `fds`.
ssize_t RecvMsg(int sock, void* data, size_t len, std::vector<int>* fds = nullptr) {
  iovec iov{data, len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(kMaxFds * sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); n > 0 && c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      if (fds != nullptr) {
        fds->push_back(fd);
      } else {
        close(fd);
      }
    }
  }
  return n;
}

// Rows of the report: "row<TAB>label<TAB>ms<TAB>bytes moved" and
// "info<TAB>text", one a line, so that both processes print alike.
struct Report {
  std::string text;
  void Row(const std::string& label, double ms, int64_t bytes_moved) {
    absl::StrAppend(&text, "row\t", label, "\t", absl::StrFormat("%.6f", ms), "\t", bytes_moved,
                    "\n");
  }
  void Info(const std::string& line) { absl::StrAppend(&text, "info\t", line, "\n"); }
};

// ------------------------------------------------------------ the second process

int RunChild(int sock) {
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(nullptr));
  dgmm::CudaOptions options;
  options.streams = 1;
  options.measure_backend_order = false;
  auto device = dgmm::cuda::CudaDevice::Open(0, options);
  if (!device.ok()) {
    std::fprintf(stderr, "child: %s\n", device.status().ToString().c_str());
    return 1;
  }
  for (;;) {
    Request req;
    std::vector<int> fds;
    const ssize_t got = RecvMsg(sock, &req, sizeof(req), &fds);
    if (got == 0) return 0;
    if (got != static_cast<ssize_t>(sizeof(req))) return 1;
    const int64_t n = req.n, bytes = n * n * 4;
    Timer timer(absl::GetFlag(FLAGS_reps));
    Report r;
    float* d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, n * sizeof(float)));
    CHECK_CUDA(dgmm::bench::FillRandom(d, n, kSeedD, nullptr));
    float* ones = Ones(n);

    // Open everything the owner shared.
    std::vector<std::function<void()>> closers;
    std::byte* ipc[4] = {};
    for (int i = 0; i < 4; ++i) {
      auto m = (*device)->OpenIpcMemory(
          absl::string_view(req.ipc[i].reserved, sizeof(req.ipc[i].reserved)));
      if (!m.ok()) {
        r.Info(absl::StrCat("OpenIpcMemory ", i, ": ", m.status().ToString()));
        continue;
      }
      ipc[i] = m->base;
      closers.push_back(std::move(m->close));
    }
    std::byte* vmm[4] = {};
    for (int i = 0; i < static_cast<int>(fds.size()) && i < 4; ++i) {
      if (i == 0)
        r.Info(absl::StrCat("second process: a received descriptor is ", FdTarget(fds[i])));
      auto m = (*device)->ImportVmmMemory(fds[i], req.vmm_bytes[i]);
      close(fds[i]);
      if (!m.ok()) {
        r.Info(absl::StrCat("ImportVmmMemory ", i, ": ", m.status().ToString()));
        continue;
      }
      vmm[i] = m->base;
      closers.push_back(std::move(m->close));
    }
    if (ipc[0] == nullptr || ipc[1] == nullptr) {
      std::fprintf(stderr, "child: the IPC handles did not open\n%s", r.text.c_str());
      return 1;
    }
    // Its own memory, random.
    void *oa = nullptr, *oc = nullptr;
    CHECK_CUDA(cudaMalloc(&oa, bytes));
    CHECK_CUDA(cudaMalloc(&oc, bytes));
    CHECK_CUDA(cudaMemcpy(oa, ipc[0], bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(dgmm::bench::FillRandom(static_cast<float*>(oc), n * n, kSeedC, nullptr));
    auto wa = VmmAllocation::Create(0, bytes);
    auto wc = VmmAllocation::Create(0, bytes);
    if (wa.ok() && wc.ok()) {
      CHECK_CUDA(cudaMemcpy((*wa)->data(), ipc[0], bytes, cudaMemcpyDeviceToDevice));
      CHECK_CUDA(cudaMemcpy((*wc)->data(), oc, bytes, cudaMemcpyDeviceToDevice));
    }
    CHECK_CUDA(cudaDeviceSynchronize());

    const int64_t moved = 2 * bytes;
    r.Row("second process: its own cudaMalloc", timer.Kernel(oa, oc, d, n, n), moved);
    if (wa.ok() && wc.ok()) {
      r.Row("second process: its own cuMemCreate",
            timer.Kernel((*wa)->data(), (*wc)->data(), d, n, n), moved);
    }
    r.Row("second process: owner's cudaMalloc via cudaIpcOpenMemHandle",
          timer.Kernel(ipc[0], ipc[1], d, n, n), moved);
    if (ipc[2] != nullptr && ipc[3] != nullptr) {
      r.Row("second process: owner's cudaMalloc rounded up to 2 MiB, via cudaIpcOpenMemHandle",
            timer.Kernel(ipc[2], ipc[3], d, n, n), moved);
    }
    if (vmm[0] != nullptr && vmm[1] != nullptr) {
      r.Row("second process: owner's cuMemCreate via POSIX fd (ImportVmmMemory)",
            timer.Kernel(vmm[0], vmm[1], d, n, n), moved);
    }
    if (vmm[2] != nullptr && vmm[3] != nullptr) {
      r.Row("second process: owner's cuMemCreate COMP_GENERIC via POSIX fd",
            timer.Kernel(vmm[2], vmm[3], d, n, n), moved);
    }
    r.Row("second process: D2D copy, cudaIpc-opened A -> C", timer.Copy(ipc[1], ipc[0], bytes),
          moved);
    if (vmm[0] != nullptr && vmm[1] != nullptr) {
      r.Row("second process: D2D copy, VMM-imported A -> C", timer.Copy(vmm[1], vmm[0], bytes),
            moved);
    }
    r.Row("second process: read only, cudaIpc-opened A", timer.Read(ipc[0], bytes), bytes);
    r.Row("second process: write only, cudaIpc-opened C", timer.Write(ipc[1], bytes), bytes);
    r.Row("second process: read only, its own cudaMalloc", timer.Read(oa, bytes), bytes);
    r.Row("second process: write only, its own cudaMalloc", timer.Write(oc, bytes), bytes);
    if (vmm[0] != nullptr && vmm[1] != nullptr) {
      r.Row("second process: read only, VMM-imported A", timer.Read(vmm[0], bytes), bytes);
      r.Row("second process: write only, VMM-imported C", timer.Write(vmm[1], bytes), bytes);
    }
    r.Row("second process: cudaIpc-opened, in place (C -> C, d = 1)",
          timer.Kernel(ipc[1], ipc[1], ones, n, n), moved);
    if (vmm[1] != nullptr) {
      r.Row("second process: VMM-imported, in place (C -> C, d = 1)",
            timer.Kernel(vmm[1], vmm[1], ones, n, n), moved);
    }
    for (auto [mb, lines] : SweepLines(n)) {
      const int64_t b = 2 * lines * n * 4;
      r.Row(absl::StrCat("sweep|", mb, "|ipc"), timer.Kernel(ipc[0], ipc[1], d, lines, n), b);
      if (vmm[0] != nullptr && vmm[1] != nullptr) {
        r.Row(absl::StrCat("sweep|", mb, "|vmm"), timer.Kernel(vmm[0], vmm[1], d, lines, n), b);
      }
      r.Row(absl::StrCat("sweep|", mb, "|own"), timer.Kernel(oa, oc, d, lines, n), b);
    }
    r.Info(absl::StrCat("second process, cudaIpc-opened A: ", Attributes(ipc[0])));
    if (ipc[2] != nullptr) {
      r.Info(absl::StrCat("second process, cudaIpc-opened rounded A: ", Attributes(ipc[2])));
    }
    if (vmm[0] != nullptr) {
      r.Info(absl::StrCat("second process, VMM-imported A: ", Attributes(vmm[0])));
    }
    r.Info(absl::StrCat("second process, its own cudaMalloc A: ", Attributes(oa)));
    if (wa.ok()) {
      r.Info(absl::StrCat("second process, its own cuMemCreate A: ", Attributes((*wa)->data())));
    }

    // The last launch on each shared pair leaves C = A·diag(d) for the
    // owner's check (the owner poisoned C with NaN before sending).
    for (int i = 0; i < 4; i += 2) {
      for (std::byte** p : {ipc, vmm}) {
        if (p[i] == nullptr || p[i + 1] == nullptr) continue;
        const dgmm::cuda::DeviceTile<float> tile{.in = reinterpret_cast<const float*>(p[i]),
                                                 .out = reinterpret_cast<float*>(p[i + 1]),
                                                 .diag = d,
                                                 .lines = n,
                                                 .line_len = n,
                                                 .per_line = false};
        CHECK_CUDA(dgmm::cuda::LaunchDgmmKernel(tile, timer.sms(), nullptr));
      }
    }
    CHECK_CUDA(cudaDeviceSynchronize());
    if (!SendMsg(sock, r.text.data(), r.text.size())) return 1;

    // Hold the mappings until the owner has timed its buffer again.
    char cmd = 0;
    if (RecvMsg(sock, &cmd, 1) != 1) return 1;
    for (auto& c : closers) c();
    if (wa.ok()) wa->reset();
    if (wc.ok()) wc->reset();
    cudaFree(oa);
    cudaFree(oc);
    cudaFree(d);
    cudaFree(ones);
    CHECK_CUDA(cudaDeviceSynchronize());
    if (!SendMsg(sock, &cmd, 1)) return 1;
  }
}

// ------------------------------------------------------------ the owner

// Largest relative error of C against A·diag(d) in float64, on the host.
double MaxRelErr(const std::vector<float>& a, const std::vector<float>& d,
                 const std::vector<float>& c, int64_t n) {
  const int threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()), 1, 16);
  std::vector<double> worst(threads, 0);
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t i = t; i < n; i += threads) {
        for (int64_t j = 0; j < n; ++j) {
          const double ref = static_cast<double>(a[i * n + j]) * d[j];
          const double got = c[i * n + j];
          const double e = std::isfinite(got) ? std::abs(got - ref) / std::abs(ref) : INFINITY;
          worst[t] = std::max(worst[t], e);
        }
      }
    });
  }
  for (auto& th : pool) th.join();
  return *std::max_element(worst.begin(), worst.end());
}

struct Row {
  std::string label;
  double ms;
  int64_t moved;
};

void ParseReport(const std::string& text, std::vector<Row>* rows, std::vector<std::string>* info) {
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    std::vector<std::string> f = absl::StrSplit(line, '\t');
    if (f[0] == "row" && f.size() == 4) {
      Row row{f[1], -1, 0};
      (void)absl::SimpleAtod(f[2], &row.ms);
      (void)absl::SimpleAtoi(f[3], &row.moved);
      rows->push_back(row);
    } else if (f.size() >= 2) {
      info->push_back(f[1]);
    }
  }
}

int RunOwner(int sock, int64_t n, int reps, std::string* summary) {
  const int64_t elems = n * n, bytes = elems * 4;
  const int64_t bytes_r = (bytes + kTwoMiB - 1) / kTwoMiB * kTwoMiB;
  Timer timer(reps);
  float *ma, *mc, *ra, *rc, *za, *d;
  CHECK_CUDA(cudaMalloc(&ma, bytes));
  CHECK_CUDA(cudaMalloc(&mc, bytes));
  CHECK_CUDA(cudaMalloc(&ra, bytes_r));
  CHECK_CUDA(cudaMalloc(&rc, bytes_r));
  CHECK_CUDA(cudaMalloc(&za, bytes));
  CHECK_CUDA(cudaMalloc(&d, n * sizeof(float)));
  CHECK_CUDA(dgmm::bench::FillRandom(ma, elems, kSeedA, nullptr));
  CHECK_CUDA(dgmm::bench::FillRandom(mc, elems, kSeedC, nullptr));
  CHECK_CUDA(dgmm::bench::FillRandom(d, n, kSeedD, nullptr));
  CHECK_CUDA(cudaMemset(za, 0, bytes));
  CHECK_CUDA(cudaMemcpy(ra, ma, bytes, cudaMemcpyDeviceToDevice));
  CHECK_CUDA(cudaMemcpy(rc, mc, bytes, cudaMemcpyDeviceToDevice));
  std::unique_ptr<VmmAllocation> v[4];
  std::vector<std::string> info;
  for (int i = 0; i < 4; ++i) {
    auto a = VmmAllocation::Create(0, bytes, /*compressible=*/i >= 2);
    if (!a.ok()) {
      info.push_back(absl::StrCat("cuMemCreate ", i, ": ", a.status().ToString()));
      continue;
    }
    v[i] = std::move(*a);
    CHECK_CUDA(cudaMemcpy(v[i]->data(), i % 2 == 0 ? ma : mc, bytes, cudaMemcpyDeviceToDevice));
  }
  if (v[0] == nullptr || v[1] == nullptr) {
    std::fprintf(stderr, "owner: cuMemCreate failed\n");
    for (auto& s : info) std::fprintf(stderr, "%s\n", s.c_str());
    return 1;
  }
  const bool comp_granted = v[2] != nullptr && v[2]->compressed();
  info.push_back(
      absl::StrCat("cuMemCreate granularity ", v[0]->granularity(), " bytes; ", "cuMemCreate size ",
                   v[0]->bytes(), " for ", bytes, " bytes; COMP_GENERIC asked, granted: ",
                   v[2] == nullptr ? "allocation failed" : (comp_granted ? "yes" : "no")));
  CHECK_CUDA(cudaDeviceSynchronize());

  std::vector<Row> rows;
  const int64_t moved = 2 * bytes;
  auto row = [&](const std::string& label, double ms, int64_t m) {
    rows.push_back({label, ms, m});
  };
  row("owner: cudaMalloc (reference)", timer.Kernel(ma, mc, d, n, n), moved);
  float* ones = Ones(n);
  row("owner: cudaMalloc, in place (C -> C, d = 1)", timer.Kernel(mc, mc, ones, n, n), moved);
  row("owner: cudaMalloc rounded up to 2 MiB", timer.Kernel(ra, rc, d, n, n), moved);
  row("owner: cuMemCreate", timer.Kernel(v[0]->data(), v[1]->data(), d, n, n), moved);
  if (v[2] != nullptr && v[3] != nullptr) {
    row(absl::StrCat("owner: cuMemCreate COMP_GENERIC (granted: ", comp_granted ? "yes" : "no",
                     ")"),
        timer.Kernel(v[2]->data(), v[3]->data(), d, n, n), moved);
  }
  row("owner: cudaMalloc, A all zeros", timer.Kernel(za, mc, d, n, n), moved);
  if (v[2] != nullptr && v[3] != nullptr) {
    CHECK_CUDA(cudaMemset(v[3]->data(), 0, bytes));
    row("owner: cuMemCreate COMP_GENERIC, A all zeros",
        timer.Kernel(v[3]->data(), v[2]->data(), d, n, n), moved);
    CHECK_CUDA(cudaMemcpy(v[2]->data(), ma, bytes, cudaMemcpyDeviceToDevice));
    CHECK_CUDA(cudaMemcpy(v[3]->data(), mc, bytes, cudaMemcpyDeviceToDevice));
  }
  row("owner: D2D copy A -> C, cudaMalloc (ceiling)", timer.Copy(mc, ma, bytes), moved);
  row("owner: D2D copy A -> C, cuMemCreate", timer.Copy(v[1]->data(), v[0]->data(), bytes), moved);
  row("owner: read only, cudaMalloc A", timer.Read(ma, bytes), bytes);
  row("owner: write only, cudaMalloc C", timer.Write(mc, bytes), bytes);
  row("owner: read only, cuMemCreate A", timer.Read(v[0]->data(), bytes), bytes);
  row("owner: write only, cuMemCreate C", timer.Write(v[1]->data(), bytes), bytes);
  for (auto [mb, lines] : SweepLines(n)) {
    const int64_t b = 2 * lines * n * 4;
    row(absl::StrCat("sweep|", mb, "|owner"), timer.Kernel(ma, mc, d, lines, n), b);
    row(absl::StrCat("sweep|", mb, "|ownervmm"),
        timer.Kernel(v[0]->data(), v[1]->data(), d, lines, n), b);
  }
  info.push_back(absl::StrCat("owner, cudaMalloc A: ", Attributes(ma)));
  info.push_back(absl::StrCat("owner, cudaMalloc rounded A: ", Attributes(ra)));
  info.push_back(absl::StrCat("owner, cuMemCreate A: ", Attributes(v[0]->data())));

  // Share: C poisoned with NaN, so the check sees what the second process wrote.
  for (void* c : {static_cast<void*>(mc), static_cast<void*>(rc), static_cast<void*>(v[1]->data()),
                  v[3] != nullptr ? static_cast<void*>(v[3]->data()) : nullptr}) {
    if (c != nullptr) CHECK_CUDA(cudaMemset(c, 0xff, bytes));
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  Request req;
  req.n = n;
  CHECK_CUDA(cudaIpcGetMemHandle(&req.ipc[0], ma));
  CHECK_CUDA(cudaIpcGetMemHandle(&req.ipc[1], mc));
  CHECK_CUDA(cudaIpcGetMemHandle(&req.ipc[2], ra));
  CHECK_CUDA(cudaIpcGetMemHandle(&req.ipc[3], rc));
  int fds[4];
  for (int i = 0; i < 4 && v[i] != nullptr; ++i) {
    auto fd = v[i]->ExportFd();
    if (!fd.ok()) {
      info.push_back(absl::StrCat("export ", i, ": ", fd.status().ToString()));
      break;
    }
    fds[i] = *fd;
    req.vmm_bytes[i] = v[i]->bytes();
    req.fds = i + 1;
  }
  if (req.fds > 0)
    info.push_back(absl::StrCat("owner: an exported descriptor is ", FdTarget(fds[0])));
  if (!SendMsg(sock, &req, sizeof(req), fds, req.fds)) return 1;
  for (int i = 0; i < req.fds; ++i) close(fds[i]);
  std::string text(1 << 20, '\0');
  const ssize_t got = RecvMsg(sock, text.data(), text.size());
  if (got <= 0) {
    std::fprintf(stderr, "owner: the second process did not answer\n");
    return 1;
  }
  text.resize(static_cast<size_t>(got));
  ParseReport(text, &rows, &info);
  row("owner: cudaMalloc, while the second process has it open", timer.Kernel(ma, mc, d, n, n),
      moved);
  char cmd = 'c';
  if (!SendMsg(sock, &cmd, 1) || RecvMsg(sock, &cmd, 1) != 1) return 1;
  row("owner: cudaMalloc, after the second process closed it", timer.Kernel(ma, mc, d, n, n),
      moved);

  // Check what the second process left in the C's that only it wrote to
  // (the owner's own timings wrote mc).
  std::vector<float> ha(elems), hd(n), hc(elems);
  CHECK_CUDA(cudaMemcpy(ha.data(), ma, bytes, cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hd.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<std::pair<std::string, const void*>> checks = {
      {"cudaMalloc via cudaIpc", rc}, {"cuMemCreate via POSIX fd", v[1]->data()}};
  if (v[3] != nullptr && req.fds == 4) checks.push_back({"cuMemCreate COMP_GENERIC", v[3]->data()});
  double worst = 0;
  std::string check_line = "check of C = A·diag(d) written by the second process (max rel err):";
  for (auto& [what, p] : checks) {
    CHECK_CUDA(cudaMemcpy(hc.data(), p, bytes, cudaMemcpyDeviceToHost));
    const double e = MaxRelErr(ha, hd, hc, n);
    worst = std::max(worst, e);
    absl::StrAppend(&check_line, " ", what, " ", absl::StrFormat("%.1e", e), ";");
  }
  info.push_back(check_line);

  // The tables.
  double ref = -1;
  for (const Row& r : rows) {
    if (r.label == "owner: cudaMalloc (reference)") ref = r.ms;
  }
  std::printf("\n## N = %lld float32 (%.0f MB per matrix), %d reps per median\n\n",
              static_cast<long long>(n), bytes / 1e6, reps);
  std::printf("| memory | median ms | ratio to owner's cudaMalloc | GB/s |\n|---|---|---|---|\n");
  std::map<int64_t, std::map<std::string, double>> sweep;
  for (const Row& r : rows) {
    if (r.label.rfind("sweep|", 0) == 0) {
      std::vector<std::string> f = absl::StrSplit(r.label, '|');
      int64_t mb = 0;
      (void)absl::SimpleAtoi(f[1], &mb);
      sweep[mb][f[2]] = r.ms;
      continue;
    }
    std::printf("| %s | %.4f | %s | %.0f |\n", r.label.c_str(), r.ms,
                r.moved == moved ? absl::StrFormat("%.2f", r.ms / ref).c_str() : "-",
                r.moved / (r.ms * 1e-3) / 1e9);
    static const char* const kSummary[] = {
        "owner: cudaMalloc (reference)",
        "owner: cuMemCreate",
        "second process: its own cudaMalloc",
        "second process: owner's cudaMalloc via cudaIpcOpenMemHandle",
        "second process: owner's cuMemCreate via POSIX fd (ImportVmmMemory)",
        "owner: D2D copy A -> C, cudaMalloc (ceiling)"};
    if (std::find(std::begin(kSummary), std::end(kSummary), r.label) != std::end(kSummary)) {
      absl::StrAppend(summary,
                      absl::StrFormat("| %lld | %s | %.4f | %.2f |\n", static_cast<long long>(n),
                                      r.label, r.ms, r.ms / ref));
    }
  }
  std::printf(
      "\nSweep: the kernel over the first lines of A and C (MB of A touched), ms "
      "(ratio to the owner's cudaMalloc at the same size)\n\n"
      "| MB of A | owner cudaMalloc | owner cuMemCreate | 2nd process own cudaMalloc | "
      "2nd process cudaIpc-opened | 2nd process VMM-imported |\n|---|---|---|---|---|---|\n");
  for (auto& [mb, m] : sweep) {
    const double o = m.count("owner") ? m["owner"] : -1;
    auto cell = [&](const char* k) {
      if (!m.count(k)) return std::string("-");
      return absl::StrFormat("%.4f (%.2f)", m[k], m[k] / o);
    };
    std::printf("| %lld | %.4f | %s | %s | %s | %s |\n", static_cast<long long>(mb), o,
                cell("ownervmm").c_str(), cell("own").c_str(), cell("ipc").c_str(),
                cell("vmm").c_str());
  }
  std::printf("\n");
  for (const std::string& s : info) std::printf("- %s\n", s.c_str());
  std::fflush(stdout);

  for (void* p : {static_cast<void*>(ma), static_cast<void*>(mc), static_cast<void*>(ra),
                  static_cast<void*>(rc), static_cast<void*>(za), static_cast<void*>(d),
                  static_cast<void*>(ones)}) {
    cudaFree(p);
  }
  for (auto& a : v) a.reset();
  return worst <= 1e-6 ? 0 : 3;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_child) >= 0) return RunChild(absl::GetFlag(FLAGS_child));
  const int reps = absl::GetFlag(FLAGS_reps);
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaFree(nullptr));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  int driver = 0, runtime = 0;
  cudaDriverGetVersion(&driver);
  cudaRuntimeGetVersion(&runtime);
  std::printf("# %s, %d SMs, L2 %d MB, CUDA driver %d, runtime %d\n", prop.name,
              prop.multiProcessorCount, prop.l2CacheSize >> 20, driver, runtime);
  if (auto api = dgmm::cuda::Driver(); api.ok()) {
    int comp = 0, vmm = 0, fd = 0;
    (*api)->DeviceGetAttribute(&comp, CU_DEVICE_ATTRIBUTE_GENERIC_COMPRESSION_SUPPORTED, 0);
    (*api)->DeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, 0);
    (*api)->DeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                               0);
    std::printf("# VMM supported %d, POSIX fd handles %d, generic compression supported %d\n", vmm,
                fd, comp);
  }

  int sv[2];
  if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return 1;
  const std::string child_flag = absl::StrCat("--child=", sv[1]);
  const std::string reps_flag = absl::StrCat("--reps=", reps);
  std::fflush(stdout);
  const pid_t pid = fork();
  if (pid == 0) {
    fcntl(sv[1], F_SETFD, 0);
    char* const args[] = {argv[0], const_cast<char*>(child_flag.c_str()),
                          const_cast<char*>(reps_flag.c_str()), nullptr};
    execv("/proc/self/exe", args);
    _exit(127);
  }
  close(sv[1]);
  std::string summary =
      "| N | memory | median ms | ratio to owner's cudaMalloc |\n|---|---|---|---|\n";
  int rc = 0;
  for (absl::string_view part : absl::StrSplit(absl::GetFlag(FLAGS_n), ',')) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(part, &n) || n <= 0 || n % 4 != 0) {
      std::fprintf(stderr, "--n: sizes must be positive multiples of 4\n");
      return 2;
    }
    const int r = RunOwner(sv[0], n, reps, &summary);
    if (r == 1) {
      rc = 1;
      break;
    }
    rc = std::max(rc, r);
  }
  close(sv[0]);
  int status = 0;
  waitpid(pid, &status, 0);
  std::printf("\n## Summary\n\n%s\nsecond process exit status %d; bench exit %d\n", summary.c_str(),
              WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), rc);
  return rc;
}
