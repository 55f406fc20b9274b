// Process memory on the GPU (docs/protocol.md "Process memory"):
// the real dgmm-server on the GPU, a raw local-socket session granted
// process memory, and MultiplyRegion jobs that name this process's own
// buffers. The server's pipeline reads each piece out of this process into
// its pinned staging (process_vm_readv), DMAs it, and writes each result
// piece back (process_vm_writev). Small tiles (--cuda_tile_bytes=1MiB) make
// every job many pieces. Checks both GPU backends, every dtype, layout and
// side, in place, against a float64 reference with C poisoned first; a
// result buffer that cannot be written fails that job INVALID_ARGUMENT after
// its DMAs, and the GPU stays in service with nothing reserved. Skips
// without a GPU.
#include <sys/mman.h>

#include <limits>
#include <random>
#include <string>

#include "gtest/gtest.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/local_peer.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

v1::RegionRef At(const void* p) {
  v1::RegionRef ref;
  ref.set_process_address(reinterpret_cast<uint64_t>(p));
  return ref;
}

TEST(ProcessMemoryGpuTest, PiecesGoBetweenThisProcessAndTheGpu) {
  std::string why;
  if (SharedDevice(CudaOptions{}, &why) == nullptr) GTEST_SKIP() << kNoGpuSkip << why;
  ServerProcess server({"--backend=auto", "--allow_regions", "--cuda_tile_bytes=1MiB"});
  auto stub = Connect(server.address());
  SocketPeer peer(Info(stub.get()).limits().local_socket());
  ASSERT_TRUE(peer.connected());
  std::string cookie(32, '\0');
  std::random_device random;
  for (char& c : cookie) c = static_cast<char>(random());
  v1::LocalHello hello;
  hello.set_process_memory(true);
  hello.set_cookie(cookie);
  hello.set_cookie_address(reinterpret_cast<uint64_t>(cookie.data()));
  std::optional<v1::LocalResponse> reply = peer.Hello(hello);
  ASSERT_TRUE(reply.has_value() && reply->code() == 0);
  ASSERT_TRUE(reply->hello().process_memory()) << reply->hello().process_memory_refused();

  const auto multiply = [&](const v1::JobHeader& header, const void* a, void* c,
                            v1::JobStats* stats = nullptr) {
    v1::MultiplyRegionRequest request;
    *request.mutable_header() = header;
    *request.mutable_matrix() = At(a);
    *request.mutable_result() = At(c);
    grpc::ClientContext ctx;
    ctx.AddMetadata("dgmm-session", peer.session());
    v1::MultiplyRegionResponse response;
    grpc::Status st = stub->MultiplyRegion(&ctx, request, &response);
    if (stats != nullptr) *stats = response.stats();
    return st;
  };
  uint64_t seed = 500;
  for (auto backend : {v1::BACKEND_CUDA_KERNEL, v1::BACKEND_CUBLAS}) {
    for (auto dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
      for (auto layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
        for (auto side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
          SCOPED_TRACE(v1::Backend_Name(backend) + " " + v1::DType_Name(dtype) + " " +
                       v1::Layout_Name(layout) + " " + v1::Side_Name(side));
          RandomJob job = MakeJob(1501, 1203, dtype, layout, side, seed++);  // 7-14 MB
          job.header.set_backend(backend);
          std::string c(job.matrix.size(), '\xff');  // NaN in both dtypes
          v1::JobStats stats;
          grpc::Status st = multiply(job.header, job.matrix.data(), c.data(), &stats);
          ASSERT_TRUE(st.ok()) << st.error_code() << ": " << st.error_message();
          EXPECT_EQ(stats.backend(), backend);
          EXPECT_GE(stats.device_index(), 0);
          EXPECT_LE(MaxRelError(job, c), dtype == v1::DTYPE_FLOAT32 ? 1.2e-7 : 2.3e-16);
          std::string inplace = job.matrix;
          st = multiply(job.header, inplace.data(), inplace.data());
          ASSERT_TRUE(st.ok()) << st.error_message();
          EXPECT_LE(MaxRelError(job, inplace), dtype == v1::DTYPE_FLOAT32 ? 1.2e-7 : 2.3e-16);
        }
      }
    }
  }
  // A result the process cannot write: the job fails after its first piece's
  // DMA; the GPU serves on and nothing stays reserved.
  RandomJob job = MakeJob(2000, 1000, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 9);
  void* ro = mmap(nullptr, job.matrix.size(), PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  grpc::Status st = multiply(job.header, job.matrix.data(), ro);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("cannot be written"), std::string::npos) << st.error_message();
  munmap(ro, job.matrix.size());
  std::string c(job.matrix.size(), '\xff');
  st = multiply(job.header, job.matrix.data(), c.data());
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_LE(MaxRelError(job, c), 1.2e-7);
  EXPECT_TRUE(WaitUntil([&] { return Reserved(stub.get()) == 0; }, 5000));
}

}  // namespace
}  // namespace dgmm::testing
