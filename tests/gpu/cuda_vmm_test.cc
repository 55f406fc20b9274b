// CudaDevice::ImportVmmMemory on a real GPU: an allocation made with
// cuMemCreate in another process (this binary, re-executed as the exporter)
// and passed as a POSIX descriptor over a Unix socket is mapped, read, run
// through dgmm's kernel in place and read back by its owner; descriptors that
// are not CUDA allocations, and sizes that do not match the allocation, are
// refused with a status. Every test skips cleanly on a machine without a GPU.
#include <cuda_runtime.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/backends/cuda/cuda_device.h"
#include "service/backends/cuda/driver_api.h"
#include "service/backends/cuda/vmm_export.h"
#include "tests/gpu/gpu_test_util.h"

namespace dgmm::testing {
namespace {

constexpr char kExporterFlag[] = "--vmm_exporter=";
constexpr uint64_t kMatrixSeed = 11;
constexpr int64_t kCols = 1024;

// ------------------------------------------------- messages over the socket

// Exporter → test, with the allocation's descriptor attached.
struct Hello {
  int64_t bytes = 0;  // cuMemCreate's size
  int64_t granularity = 0;
  char error[256] = {};  // empty when the allocation was made
};
// Test → exporter: the diagonal the test applied in place; the reply is the
// largest relative error the owner reads back.
struct Verify {
  std::array<float, kCols> diag{};
};
struct Verdict {
  double max_rel_err = -1;
};
struct Bye {
  int32_t unused = 0;
};

bool SendMsg(int sock, const void* data, size_t len, int fd = -1) {
  iovec iov{const_cast<void*>(data), len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  if (fd >= 0) {
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return sendmsg(sock, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(len);
}

// Receives one message of exactly `len` bytes; `fd` (if given) gets the
// descriptor attached, or -1.
bool RecvMsg(int sock, void* data, size_t len, int* fd = nullptr) {
  iovec iov{data, len};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  const ssize_t n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  if (fd != nullptr) {
    *fd = -1;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        std::memcpy(fd, CMSG_DATA(c), sizeof(int));
      }
    }
  }
  return n == static_cast<ssize_t>(len);
}

Problem MatrixOf(int64_t bytes) {
  return Problem{.rows = bytes / static_cast<int64_t>(sizeof(float)) / kCols,
                 .cols = kCols,
                 .dtype = DType::kFloat32,
                 .layout = Layout::kRowMajor,
                 .side = Side::kRight};
}

// ------------------------------------------------------------ the exporter

// The other process: makes a 4 MiB allocation, fills it with a random
// matrix, passes its descriptor, then checks what the test wrote into it.
int RunExporter(int sock) {
  Hello hello;
  auto fail = [&](const std::string& why) {
    std::snprintf(hello.error, sizeof(hello.error), "%s", why.c_str());
    SendMsg(sock, &hello, sizeof(hello));
    return 1;
  };
  if (cudaSetDevice(0) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
    return fail("the exporter cannot open GPU 0");
  }
  auto alloc = cuda::VmmAllocation::Create(0, int64_t{4} << 20);
  if (!alloc.ok()) return fail(std::string(alloc.status().message()));
  const Problem p = MatrixOf((*alloc)->bytes());
  const std::vector<std::byte> a = RandomElements(p.dtype, p.rows * p.cols, kMatrixSeed);
  if (cudaMemcpy((*alloc)->data(), a.data(), a.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
    return fail("cudaMemcpy into the allocation failed");
  }
  auto fd = (*alloc)->ExportFd();
  if (!fd.ok()) return fail(std::string(fd.status().message()));
  hello.bytes = (*alloc)->bytes();
  hello.granularity = (*alloc)->granularity();
  if (!SendMsg(sock, &hello, sizeof(hello), *fd)) return 1;
  close(*fd);

  Verify verify;
  while (RecvMsg(sock, &verify, sizeof(verify))) {
    std::vector<std::byte> got(a.size());
    Verdict verdict;
    if (cudaMemcpy(got.data(), (*alloc)->data(), got.size(), cudaMemcpyDeviceToHost) ==
        cudaSuccess) {
      verdict.max_rel_err = MaxRelativeError(
          p, a.data(), reinterpret_cast<const std::byte*>(verify.diag.data()), got.data());
    }
    if (!SendMsg(sock, &verdict, sizeof(verdict))) return 1;
  }
  return 0;  // the test closed the socket: unmap and release on the way out
}

// ------------------------------------------------------------------- tests

#define GET_DEVICE_OR_SKIP(var)                                    \
  std::string why_##var;                                           \
  CudaOptions options_##var;                                       \
  options_##var.measure_backend_order = false;                     \
  cuda::CudaDevice* var = SharedDevice(options_##var, &why_##var); \
  if (var == nullptr) GTEST_SKIP() << kNoGpuSkip << why_##var

// This binary re-executed as the exporter, its end of a socket pair in `sock`.
class Exporter {
 public:
  Exporter() {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) return;
    const std::string flag = absl::StrCat(kExporterFlag, sv[1]);
    pid_ = fork();
    if (pid_ == 0) {
      fcntl(sv[1], F_SETFD, 0);
      char* const argv[] = {const_cast<char*>("cuda_vmm_test"), const_cast<char*>(flag.c_str()),
                            nullptr};
      execv("/proc/self/exe", argv);
      _exit(127);
    }
    close(sv[1]);
    sock_ = sv[0];
    if (pid_ > 0 && RecvMsg(sock_, &hello_, sizeof(hello_), &fd_)) ok_ = hello_.error[0] == 0;
  }
  ~Exporter() {
    if (fd_ >= 0) close(fd_);
    if (sock_ >= 0) close(sock_);
    if (pid_ > 0) waitpid(pid_, nullptr, 0);
  }

  // Empty when the exporter made its allocation and passed its descriptor.
  std::string error() const {
    if (ok_ && fd_ >= 0) return "";
    return absl::StrCat("the exporter failed: ", hello_.error[0] != 0 ? hello_.error : "no reply");
  }
  int fd() const { return fd_; }
  const Hello& hello() const { return hello_; }
  // Asks the owner for the largest relative error of A·diag(d) in its memory.
  double OwnerError(const std::vector<float>& diag) {
    Verify v;
    std::copy(diag.begin(), diag.end(), v.diag.begin());
    Verdict verdict;
    if (!SendMsg(sock_, &v, sizeof(v)) || !RecvMsg(sock_, &verdict, sizeof(verdict))) return -1;
    return verdict.max_rel_err;
  }
  // Ends the exporter; its exit status.
  int Finish() {
    close(sock_);
    sock_ = -1;
    int status = 0;
    if (waitpid(pid_, &status, 0) != pid_) return -1;
    pid_ = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }

 private:
  pid_t pid_ = -1;
  int sock_ = -1;
  int fd_ = -1;
  bool ok_ = false;
  Hello hello_;
};

TEST(CudaVmmTest, ImportsAnotherProcesssAllocationForReadingAndWriting) {
  GET_DEVICE_OR_SKIP(device);
  Exporter exporter;
  ASSERT_EQ(exporter.error(), "");
  auto m = device->ImportVmmMemory(exporter.fd(), exporter.hello().bytes);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->bytes, exporter.hello().bytes);
  ASSERT_NE(m->base, nullptr);
  cudaPointerAttributes attr{};
  ASSERT_EQ(cudaPointerGetAttributes(&attr, m->base), cudaSuccess);
  EXPECT_EQ(attr.type, cudaMemoryTypeDevice);
  EXPECT_EQ(attr.device, device->index());

  // Read what the owner wrote.
  const Problem p = MatrixOf(m->bytes);
  const std::vector<std::byte> a = RandomElements(p.dtype, p.rows * p.cols, kMatrixSeed);
  std::vector<std::byte> seen(a.size());
  ASSERT_EQ(cudaMemcpy(seen.data(), m->base, seen.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_EQ(std::memcmp(seen.data(), a.data(), a.size()), 0);

  // Write: dgmm's kernel in place, as the server runs a CUDA region job.
  const std::vector<std::byte> d_bytes = RandomElements(p.dtype, p.cols, 5);
  std::vector<float> d(static_cast<size_t>(p.cols));
  std::memcpy(d.data(), d_bytes.data(), d_bytes.size());
  auto job = device->Begin(p, BackendKind::kCudaKernel, d_bytes.data(), JobMode::kDeviceRegion,
                           p.matrix_bytes());
  ASSERT_TRUE(job.ok()) << job.status();
  StageTimes times;
  ASSERT_TRUE((*job)
                  ->Process(Tile{.in = m->base, .out = m->base, .first_line = 0, .lines = p.rows},
                            nullptr, &times)
                  .ok());
  job->reset();
  ASSERT_EQ(cudaMemcpy(seen.data(), m->base, seen.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_LE(MaxRelativeError(p, a.data(), d_bytes.data(), seen.data()), Tolerance(p.dtype));

  // The owner reads the result in its own mapping.
  const double owner_err = exporter.OwnerError(d);
  EXPECT_GE(owner_err, 0);
  EXPECT_LE(owner_err, Tolerance(p.dtype));

  m->close();
  EXPECT_EQ(exporter.Finish(), 0);
}

TEST(CudaVmmTest, RefusesSizesThatDoNotMatchTheAllocation) {
  GET_DEVICE_OR_SKIP(device);
  Exporter exporter;
  ASSERT_EQ(exporter.error(), "");
  const int64_t bytes = exporter.hello().bytes, g = exporter.hello().granularity;
  for (int64_t wrong :
       {int64_t{0}, int64_t{-1}, bytes - 4096, bytes + 4096, bytes + g, 2 * bytes}) {
    auto m = device->ImportVmmMemory(exporter.fd(), wrong);
    std::printf("allocation_bytes %lld of %lld: %s\n", static_cast<long long>(wrong),
                static_cast<long long>(bytes), m.status().ToString().c_str());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument)
        << "allocation_bytes " << wrong << " of " << bytes << ": " << m.status();
    if (m.ok()) m->close();
  }
  // A smaller multiple of the granularity maps the allocation's start, or
  // is refused as the others are (whichever the driver does), never worse.
  auto part = device->ImportVmmMemory(exporter.fd(), g);
  if (part.ok()) {
    EXPECT_EQ(part->bytes, g);
    part->close();
  } else {
    EXPECT_EQ(part.status().code(), absl::StatusCode::kInvalidArgument) << part.status();
  }
  std::printf("allocation_bytes %lld of %lld: %s\n", static_cast<long long>(g),
              static_cast<long long>(bytes), part.ok() ? "maps the start" : "refused");
  // The refusals left nothing behind: the whole allocation still imports.
  auto m = device->ImportVmmMemory(exporter.fd(), bytes);
  ASSERT_TRUE(m.ok()) << m.status();
  m->close();
  EXPECT_EQ(exporter.Finish(), 0);
}

TEST(CudaVmmTest, RefusesDescriptorsThatAreNotCudaAllocations) {
  GET_DEVICE_OR_SKIP(device);
  auto driver = cuda::Driver();
  ASSERT_TRUE(driver.ok()) << driver.status();
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device->index();
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t g = 0;
  ASSERT_EQ((*driver)->MemGetAllocationGranularity(&g, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            CUDA_SUCCESS);
  const auto bytes = static_cast<int64_t>(g);

  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  const int memfd = memfd_create("not-cuda", MFD_CLOEXEC);
  ASSERT_GE(memfd, 0);
  ASSERT_EQ(ftruncate(memfd, bytes), 0);
  const int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
  ASSERT_GE(devnull, 0);
  int socks[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, socks), 0);
  const int closed = dup(devnull);
  close(closed);

  const std::vector<std::pair<std::string, int>> fds = {
      {"a pipe", pipe_fds[0]},         {"a memfd", memfd},
      {"/dev/null", devnull},          {"a socket", socks[0]},
      {"a closed descriptor", closed}, {"-1", -1}};
  for (const auto& [what, fd] : fds) {
    auto m = device->ImportVmmMemory(fd, bytes);
    std::printf("%s: %s\n", what.c_str(), m.status().ToString().c_str());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kInvalidArgument) << what << ": " << m.status();
    if (m.ok()) m->close();
  }
  EXPECT_TRUE(device->in_service());
  for (int fd : {pipe_fds[0], pipe_fds[1], memfd, devnull, socks[0], socks[1]}) close(fd);
}

}  // namespace
}  // namespace dgmm::testing

int main(int argc, char** argv) {
  const std::string flag = dgmm::testing::kExporterFlag;
  for (int i = 1; i < argc; ++i) {
    int sock = -1;
    if (std::string(argv[i]).rfind(flag, 0) == 0 &&
        absl::SimpleAtoi(std::string(argv[i]).substr(flag.size()), &sock)) {
      return dgmm::testing::RunExporter(sock);
    }
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
