// The C++ region API (dgmm/regions.h) and `dgmm-cli multiply --shm` against
// real dgmm-servers on loopback (CPU backend): one with --allow_regions, one
// without, and one in a mount namespace of its own whose local socket lives
// in a /dev/shm that is not this host's (a server whose local socket this
// process cannot reach, as a remote one's). Results are checked against a float64 reference
// computed here, in outputs poisoned with NaN first.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "dgmm/client.h"
#include "dgmm/host_memory.h"
#include "dgmm/npy.h"
#include "dgmm/regions.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/operands.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;

int CountSubstr(const std::string& s, const std::string& what) {
  int n = 0;
  for (size_t at = s.find(what); at != std::string::npos; at = s.find(what, at + 1)) ++n;
  return n;
}
using testing::CliBinary;
using ::testing::Not;
using testing::Operands;
using testing::RunCommand;
using testing::ServerProcess;

ServerProcess& RegionsServer() {
  static ServerProcess server({"--backend=cpu", "--threads=2", "--allow_regions"});
  return server;
}

ServerProcess& RegionsOffServer() {
  static ServerProcess server({"--backend=cpu", "--threads=1"});
  return server;
}

// A server with regions on whose local socket is in a /dev/shm of its own
// (unshare -m, a fresh tmpfs), so this process cannot reach it, as for a
// remote server; nullptr where this process may not make mount namespaces.
ServerProcess* ElsewhereServer() {
  static ServerProcess* server = []() -> ServerProcess* {
    std::string output;
    if (RunCommand("unshare -m sh -c 'mount -t tmpfs dgmm-test /dev/shm' 2>&1", &output) != 0) {
      return nullptr;
    }
    char tmpl[] = "/tmp/dgmm-elsewhere-XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) return nullptr;
    close(fd);
    std::ofstream(tmpl) << "#!/bin/sh\nexec unshare -m sh -c "
                           "'mount -t tmpfs dgmm-test /dev/shm && exec \"$0\" \"$@\"' "
                        << testing::ServerBinary() << " \"$@\"\n";
    chmod(tmpl, 0700);
    const std::string real = testing::ServerBinary();
    setenv("DGMM_SERVER_BIN", tmpl, 1);
    // Static, so that its destructor stops the server at exit.
    static ServerProcess started({"--backend=cpu", "--threads=1", "--allow_regions",
                                  "--local_socket=/dev/shm/dgmm-elsewhere.sock"});
    setenv("DGMM_SERVER_BIN", real.c_str(), 1);
    return &started;
  }();
  return server;
}

// Objects of this process in /dev/shm named as SharedMemoryRegion names its
// memfds: there must be none (a memfd has no name in /dev/shm).
int OwnShmObjects() {
  const std::string prefix = "dgmm-" + std::to_string(getpid()) + "-";
  int count = 0;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (std::string(entry->d_name).rfind(prefix, 0) == 0) ++count;
  }
  closedir(dir);
  return count;
}

int64_t RegisteredBytes(Client& client) {
  absl::StatusOr<v1::GetRegionStatusResponse> listed = GetRegionStatus(client);
  EXPECT_TRUE(listed.ok()) << listed.status();
  return listed.ok() ? listed->registered_bytes() : -1;
}

template <typename T>
RegionJob MakeRegionJob(const Operands<T>& ops, const SharedMemoryRegion& region, int64_t matrix_at,
                        int64_t result_at) {
  RegionJob job;
  job.rows = ops.rows;
  job.cols = ops.cols;
  job.dtype = sizeof(T) == 4 ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT64;
  job.layout = ops.layout;
  job.side = ops.side;
  job.matrix = region.Ref(matrix_at);
  job.result = region.Ref(result_at);
  job.diagonal = ops.d.data();
  job.diagonal_bytes = ops.d.size() * sizeof(T);
  return job;
}

template <typename T>
std::vector<T> ReadBack(const SharedMemoryRegion& region, int64_t at, size_t n) {
  std::vector<T> out(n);
  std::memcpy(out.data(), region.bytes() + at, n * sizeof(T));
  return out;
}

TEST(SharedMemoryRegionTest, RoundTripThenDestructorUnregisters) {
  Client client(RegionsServer().address());
  Operands<float> ops(200, 150, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT, 11);
  const size_t bytes = ops.a.size() * sizeof(float);
  std::string key;
  {
    absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
        SharedMemoryRegion::Create(client, 2 * bytes);
    ASSERT_TRUE(region.ok()) << region.status();
    SharedMemoryRegion& shm = **region;
    key = shm.key();
    EXPECT_EQ(shm.size(), 2 * bytes);
    EXPECT_EQ(shm.name(), key);
    EXPECT_EQ(shm.registration().name(), shm.name());
    EXPECT_EQ(shm.registration().byte_size(), static_cast<int64_t>(2 * bytes));
    EXPECT_EQ(shm.registration().kind(), v1::REGION_KIND_SYSTEM_SHM);
    EXPECT_TRUE(shm.registration().sealed());
    EXPECT_EQ(shm.registration().owner_uid(), static_cast<int64_t>(getuid()));
    EXPECT_THAT(shm.registration().key(), HasSubstr("memfd:" + key));
    EXPECT_EQ(OwnShmObjects(), 0);
    // Sealed: nobody, not even this process, can shrink it under the server.
    EXPECT_EQ(ftruncate(shm.fd(), 0), -1);
    EXPECT_EQ(errno, EPERM);
    std::memcpy(shm.bytes(), ops.a.data(), bytes);
    std::vector<float> poison = ops.NanOutput();
    std::memcpy(shm.bytes() + bytes, poison.data(), bytes);

    absl::StatusOr<JobResult> r = MultiplyRegion(client, MakeRegionJob(ops, shm, 0, bytes));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->attempts, 1);
    EXPECT_EQ(r->stats.bytes_out(), static_cast<int64_t>(bytes));
    EXPECT_LE(ops.MaxRelativeError(ReadBack<float>(shm, bytes, ops.a.size())),
              std::numeric_limits<float>::epsilon());

    absl::StatusOr<v1::GetRegionStatusResponse> listed = GetRegionStatus(client, shm.name());
    ASSERT_TRUE(listed.ok()) << listed.status();
    ASSERT_EQ(listed->regions_size(), 1);
    EXPECT_EQ(listed->regions(0).jobs_total(), 1);
    EXPECT_EQ(listed->registered_bytes(), static_cast<int64_t>(2 * bytes));
  }
  EXPECT_EQ(RegisteredBytes(client), 0);
  EXPECT_EQ(OwnShmObjects(), 0);
}

// A region lives as long as the Client's session: a second Client (another
// session of the same uid) sees it while the first lives, not after.
TEST(SharedMemoryRegionTest, ARegionEndsWithItsClientsSession) {
  auto first = std::make_unique<Client>(RegionsServer().address());
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
      SharedMemoryRegion::Create(*first, 1 << 16, "session-bound");
  ASSERT_TRUE(region.ok()) << region.status();
  Client second(RegionsServer().address());
  ASSERT_TRUE(GetRegionStatus(second, "session-bound").ok());
  // The first client goes without unregistering (the region object
  // outlives it here; its destructor's Unregister then fails quietly).
  absl::StatusOr<std::shared_ptr<LocalSession>> session = first->RegionSession();
  ASSERT_TRUE(session.ok());
  session->reset();
  first.reset();
  for (int i = 0; i < 250 && GetRegionStatus(second, "session-bound").ok(); ++i) {
    usleep(20000);
  }
  EXPECT_EQ(GetRegionStatus(second, "session-bound").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(RegisteredBytes(second), 0);
  region->release();  // its Client is gone: leak the mapping rather than use it
}

TEST(SharedMemoryRegionTest, InPlaceWithTheDiagonalInTheRegion) {
  Client client(RegionsServer().address());
  Operands<double> ops(123, 77, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 12);
  const size_t bytes = ops.a.size() * sizeof(double);
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
      SharedMemoryRegion::Create(client, bytes + ops.d.size() * sizeof(double), "named.region");
  ASSERT_TRUE(region.ok()) << region.status();
  SharedMemoryRegion& shm = **region;
  EXPECT_EQ(shm.name(), "named.region");
  std::memcpy(shm.bytes(), ops.a.data(), bytes);
  std::memcpy(shm.bytes() + bytes, ops.d.data(), ops.d.size() * sizeof(double));
  RegionJob job = MakeRegionJob(ops, shm, 0, 0);
  job.diagonal = nullptr;
  job.diagonal_bytes = 0;
  job.diagonal_ref = shm.Ref(static_cast<int64_t>(bytes));
  absl::StatusOr<JobResult> r = MultiplyRegion(client, job);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LE(ops.MaxRelativeError(ReadBack<double>(shm, 0, ops.a.size())),
            std::numeric_limits<double>::epsilon());
  // Unregister() answers once; afterwards the name is gone.
  EXPECT_TRUE(shm.Unregister().ok());
  EXPECT_TRUE(shm.Unregister().ok());
  absl::StatusOr<JobResult> gone = MultiplyRegion(client, job);
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound) << gone.status();
  EXPECT_EQ(RegisteredBytes(client), 0);
}

TEST(SharedMemoryRegionTest, ErrorsCarryTheServersCodeAndLeaveNothingBehind) {
  Client client(RegionsServer().address());
  EXPECT_EQ(SharedMemoryRegion::Create(client, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SharedMemoryRegion::Create(client, 64, "bad/name").status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> a =
      SharedMemoryRegion::Create(client, 64, "dup");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(SharedMemoryRegion::Create(client, 64, "dup").status().code(),
            absl::StatusCode::kAlreadyExists);
  a->reset();
  Client off(RegionsOffServer().address());
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> refused = SharedMemoryRegion::Create(off, 64);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_EQ(OwnShmObjects(), 0) << "a failed Create left its object in /dev/shm";
  // CUDA IPC on a CPU server.
  absl::StatusOr<v1::RegionStatus> ipc =
      RegisterCudaIpcRegion(client, "ipc", std::string(64, '\x5a'), 0, 0, 1 << 20);
  EXPECT_EQ(ipc.status().code(), absl::StatusCode::kFailedPrecondition) << ipc.status();
  EXPECT_EQ(UnregisterRegion(client, "").value_or(-1), 0);
  EXPECT_EQ(GetRegionStatus(client, "nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(RegisteredBytes(client), 0);
}

TEST(SharedMemoryRegionTest, DestructorWithTheServerGoneReturns) {
  ServerProcess server({"--backend=cpu", "--threads=1", "--allow_regions"});
  Client client(server.address());
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
      SharedMemoryRegion::Create(client, 1 << 16);
  ASSERT_TRUE(region.ok()) << region.status();
  server.Signal(SIGKILL, /*wait=*/true);
  const auto start = std::chrono::steady_clock::now();
  region->reset();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(6));
  EXPECT_EQ(OwnShmObjects(), 0);
}

TEST(SharedMemoryRegionTest, ServerWhoseSocketIsOutOfReachIsFailedPrecondition) {
  ServerProcess* elsewhere = ElsewhereServer();
  if (elsewhere == nullptr) GTEST_SKIP() << "no mount namespaces here (unshare -m failed)";
  Client client(elsewhere->address());
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
      SharedMemoryRegion::Create(client, 4096);
  EXPECT_EQ(region.status().code(), absl::StatusCode::kFailedPrecondition) << region.status();
  EXPECT_THAT(region.status().message(), HasSubstr("cannot reach the server's local socket"));
  // The socket's path given by hand, as a client in another container
  // would: a wrong one fails the same way.
  ClientOptions options;
  options.local_socket = "/nonexistent/dgmm.sock";
  Client by_hand(RegionsServer().address(), options);
  EXPECT_EQ(SharedMemoryRegion::Create(by_hand, 4096).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// ---------------------------------------------------------- same host (25)

// Client::Multiply's same-host path against `server`: C in a NaN-poisoned
// buffer, compared with a float64 reference.
template <typename T>
JobResult SameHostJob(Client& client, const Operands<T>& ops, double* error) {
  std::vector<T> out = ops.NanOutput();
  absl::StatusOr<JobResult> r = client.Multiply(ops.MakeJob(), out.data(), out.size() * sizeof(T));
  EXPECT_TRUE(r.ok()) << r.status();
  *error = ops.MaxRelativeError(out);
  return r.ok() ? *r : JobResult();
}

// Buffers from dgmm::HostVector (large ones on transparent huge pages) take
// the process-memory path like any other, with the same results.
TEST(SameHostTest, HostVectorBuffersGoThroughProcessMemory) {
  Client client(RegionsServer().address());
  for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
    // 5.7 MB: over kHugePageAllocationBytes, so mapped on its own.
    Operands<float> ops(1100, 1300, v1::LAYOUT_ROW_MAJOR, side, 77 + side);
    HostVector<float> a(ops.a.begin(), ops.a.end());
    HostVector<float> c(a.size(), std::numeric_limits<float>::quiet_NaN());
    ASSERT_EQ(reinterpret_cast<uintptr_t>(a.data()) % (2 << 20), 0u);
    Job job = ops.MakeJob();
    job.matrix.data = a.data();
    absl::StatusOr<JobResult> r = client.Multiply(job, c.data(), c.size() * sizeof(float));
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->mode, TransferMode::kRegion) << r->socket_reason;
    EXPECT_TRUE(r->process_memory);
    EXPECT_LE(ops.MaxRelativeError(std::vector<float>(c.begin(), c.end())),
              std::numeric_limits<float>::epsilon());
  }
}

// A caller that starts the connections (Connect) and then works for longer
// than an attempt may take, with no gRPC call of its own meanwhile (dgmm-cli
// making a large random A): the job still takes the same-host path, with no
// transport reason to fall back. gRPC 1.51 advances a connection only while a
// thread waits on it and abandons an attempt after min_reconnect_backoff, so
// without a waiter the channel is in TRANSIENT_FAILURE when the job comes
// ("tcp handshaker shutdown"). One stripe (the probe is the client's own
// channel) and two (the probe is another one).
TEST(SameHostTest, ConnectThenWorkKeepsTheSameHostPath) {
  for (int stripes : {1, 2}) {
    SCOPED_TRACE(stripes);
    ClientOptions options;
    options.stripes = stripes;
    options.min_reconnect_backoff = absl::Milliseconds(200);
    Client client(RegionsServer().address(), options);
    client.Connect(stripes);
    std::this_thread::sleep_for(std::chrono::milliseconds(800));  // busy elsewhere
    for (int job_number = 0; job_number < 2; ++job_number) {
      Operands<float> ops(700, 600, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 91 + job_number);
      std::vector<float> c(ops.a.size(), std::numeric_limits<float>::quiet_NaN());
      absl::StatusOr<JobResult> r =
          client.Multiply(ops.MakeJob(), c.data(), c.size() * sizeof(float));
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->mode, TransferMode::kRegion) << r->socket_reason;
      EXPECT_TRUE(r->process_memory);
      EXPECT_EQ(r->socket_reason, "");
      EXPECT_LE(ops.MaxRelativeError(c), std::numeric_limits<float>::epsilon());
    }
  }
}

// By default the server reads and writes the caller's own buffers (process
// memory: no staging region, no copy); with ClientOptions.process_memory
// off, a staging region carries the job (copies in and out).
TEST(SameHostTest, EveryDtypeLayoutAndSideThroughMemory) {
  uint64_t seed = 40;
  for (bool process_memory : {true, false}) {
    ClientOptions options;
    options.process_memory = process_memory;
    Client client(RegionsServer().address(), options);
    for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
      for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
        SCOPED_TRACE(absl::StrCat(v1::Layout_Name(layout), " ", v1::Side_Name(side),
                                  process_memory ? " process memory" : " staging"));
        double error = 0;
        JobResult f = SameHostJob(client, Operands<float>(611, 487, layout, side, seed++), &error);
        EXPECT_EQ(f.mode, TransferMode::kRegion) << f.socket_reason;
        EXPECT_EQ(f.process_memory, process_memory);
        EXPECT_LE(error, std::numeric_limits<float>::epsilon());
        JobResult d = SameHostJob(client, Operands<double>(389, 401, layout, side, seed++), &error);
        EXPECT_EQ(d.mode, TransferMode::kRegion) << d.socket_reason;
        EXPECT_EQ(d.process_memory, process_memory);
        EXPECT_LE(error, std::numeric_limits<double>::epsilon());
        EXPECT_EQ(d.socket_reason, "");
        if (process_memory) {
          EXPECT_EQ(d.same_host.copy_in, 0);
          EXPECT_EQ(d.same_host.copy_out, 0);
        } else {
          EXPECT_GT(d.same_host.copy_in, 0);
          EXPECT_GT(d.same_host.copy_out, 0);
        }
        // In place.
        Operands<float> ops(509, 521, layout, side, seed++);
        std::vector<float> c = ops.a;
        Job job = ops.MakeJob();
        job.matrix.data = c.data();
        absl::StatusOr<JobResult> r = client.Multiply(job, c.data(), c.size() * sizeof(float));
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->process_memory, process_memory);
        EXPECT_LE(ops.MaxRelativeError(c), std::numeric_limits<float>::epsilon());
      }
    }
  }
  // Nothing of them stays registered on the server once they are gone.
  Client observer(RegionsServer().address());
  for (int i = 0; i < 250 && RegisteredBytes(observer) != 0; ++i) usleep(20000);
  EXPECT_EQ(RegisteredBytes(observer), 0);
}

// A C buffer the server cannot write (read-only memory): the job's own
// INVALID_ARGUMENT, not a socket retry, and the server serves on.
TEST(SameHostTest, AResultBufferThatCannotBeWrittenIsInvalidArgument) {
  Client client(RegionsServer().address());
  Operands<float> ops(600, 500, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 71);
  const size_t bytes = ops.a.size() * sizeof(float);
  void* ro = mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(ro, MAP_FAILED);
  absl::StatusOr<JobResult> r = client.Multiply(ops.MakeJob(), ro, bytes);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("cannot be written"));
  munmap(ro, bytes);
  double error = 0;
  JobResult ok = SameHostJob(client, ops, &error);
  EXPECT_TRUE(ok.process_memory) << ok.socket_reason;
  EXPECT_LE(error, std::numeric_limits<float>::epsilon());
}

// A job in blocks (ClientOptions.same_host_blocks; by default from 64 MiB
// on): A copied in, the block jobs and C copied out overlap. Every block's
// lines are right, uneven splits and the diagonal's slices included, into
// another buffer and in place (out == A: C is copied out only after every
// block ran).
TEST(SameHostTest, BlocksOfLinesOverlapAndGiveTheSameResults) {
  uint64_t seed = 90;
  for (int blocks : {3, 8}) {
    ClientOptions options;
    options.same_host_blocks = blocks;
    options.process_memory = false;  // blocks are the staging region's
    Client client(RegionsServer().address(), options);
    for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
      for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
        SCOPED_TRACE(
            absl::StrCat(blocks, " blocks, ", v1::Layout_Name(layout), " ", v1::Side_Name(side)));
        double error = 0;
        JobResult f = SameHostJob(client, Operands<float>(613, 487, layout, side, seed++), &error);
        EXPECT_EQ(f.mode, TransferMode::kRegion) << f.socket_reason;
        EXPECT_EQ(f.part_stats.size(), static_cast<size_t>(blocks));
        EXPECT_LE(error, std::numeric_limits<float>::epsilon());
        EXPECT_GT(f.same_host.copy_in, 0);
        EXPECT_GT(f.same_host.copy_out, 0);
        JobResult d = SameHostJob(client, Operands<double>(389, 403, layout, side, seed++), &error);
        EXPECT_EQ(d.mode, TransferMode::kRegion) << d.socket_reason;
        EXPECT_EQ(d.part_stats.size(), static_cast<size_t>(blocks));
        EXPECT_LE(error, std::numeric_limits<double>::epsilon());
        // In place.
        Operands<float> ops(509, 521, layout, side, seed++);
        std::vector<float> c = ops.a;
        Job job = ops.MakeJob();
        job.matrix.data = c.data();
        absl::StatusOr<JobResult> r = client.Multiply(job, c.data(), c.size() * sizeof(float));
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->mode, TransferMode::kRegion) << r->socket_reason;
        EXPECT_EQ(r->part_stats.size(), static_cast<size_t>(blocks));
        EXPECT_LE(ops.MaxRelativeError(c), std::numeric_limits<float>::epsilon());
      }
    }
    // Progress: sent grows block by block, and the last call says all of C
    // is in the caller's buffer.
    {
      Operands<float> ops(600, 500, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, seed++);
      std::vector<float> out = ops.NanOutput();
      std::vector<std::array<int64_t, 3>> calls;
      absl::StatusOr<JobResult> r =
          client.Multiply(ops.MakeJob(), out.data(), out.size() * sizeof(float),
                          [&](int64_t sent, int64_t received, int64_t total) {
                            calls.push_back({sent, received, total});
                          });
      ASSERT_TRUE(r.ok()) << r.status();
      EXPECT_EQ(r->mode, TransferMode::kRegion);
      const int64_t total = static_cast<int64_t>(out.size() * sizeof(float));
      ASSERT_EQ(calls.size(), static_cast<size_t>(blocks));
      for (size_t i = 1; i < calls.size(); ++i) EXPECT_GT(calls[i][0], calls[i - 1][0]);
      EXPECT_EQ(calls.back(), (std::array<int64_t, 3>{total, total, total}));
      EXPECT_LE(ops.MaxRelativeError(out), std::numeric_limits<float>::epsilon());
    }
    // A diagonal of the wrong length is not split: the server names the
    // whole job's error.
    Operands<float> bad(600, 500, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, seed++);
    Job job = bad.MakeJob();
    job.diagonal_bytes -= sizeof(float);
    std::vector<float> out = bad.NanOutput();
    absl::StatusOr<JobResult> r = client.Multiply(job, out.data(), out.size() * sizeof(float));
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  }
  ClientOptions negative;
  negative.same_host_blocks = -1;
  EXPECT_EQ(CheckClientOptions(negative).code(), absl::StatusCode::kInvalidArgument);
}

TEST(SameHostTest, NotCoLocatedGoesOverTheSocketWithTheSameResults) {
  Operands<float> ops(700, 500, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 77);
  double error = 0;
  Client off(RegionsOffServer().address());
  JobResult r = SameHostJob(off, ops, &error);
  EXPECT_NE(r.mode, TransferMode::kRegion);
  EXPECT_THAT(r.socket_reason, HasSubstr("does not take regions"));
  EXPECT_LE(error, std::numeric_limits<float>::epsilon());
  ClientOptions no;
  no.same_host = false;
  Client socket_only(RegionsServer().address(), no);
  r = SameHostJob(socket_only, ops, &error);
  EXPECT_NE(r.mode, TransferMode::kRegion);
  EXPECT_EQ(r.socket_reason, "");
  EXPECT_LE(error, std::numeric_limits<float>::epsilon());
  // Forced modes are the socket's.
  Client client(RegionsServer().address());
  std::vector<float> out = ops.NanOutput();
  absl::StatusOr<JobResult> forced =
      client.MultiplyStream(ops.MakeJob(), out.data(), out.size() * sizeof(float));
  ASSERT_TRUE(forced.ok()) << forced.status();
  EXPECT_EQ(forced->mode, TransferMode::kStream);
  if (ServerProcess* elsewhere = ElsewhereServer(); elsewhere != nullptr) {
    Client far(elsewhere->address());
    r = SameHostJob(far, ops, &error);
    EXPECT_NE(r.mode, TransferMode::kRegion);
    EXPECT_THAT(r.socket_reason, HasSubstr("cannot reach the server's local socket"));
    EXPECT_LE(error, std::numeric_limits<float>::epsilon());
  }
}

// The client's staging regions, as any session of its uid sees them.
std::vector<int64_t> StagingSizes(Client& observer) {
  std::vector<int64_t> sizes;
  absl::StatusOr<v1::GetRegionStatusResponse> listed = GetRegionStatus(observer);
  EXPECT_TRUE(listed.ok()) << listed.status();
  if (!listed.ok()) return sizes;
  const std::string prefix = "dgmm-staging-" + std::to_string(getpid()) + "-";
  for (const v1::RegionStatus& r : listed->regions()) {
    if (r.name().rfind(prefix, 0) == 0) sizes.push_back(r.byte_size());
  }
  std::sort(sizes.begin(), sizes.end());
  return sizes;
}

TEST(SameHostTest, StagingGrowsWithTheJobsAndIsReused) {
  Client observer(RegionsServer().address());
  ASSERT_TRUE(StagingSizes(observer).empty());
  {
    ClientOptions staging;
    staging.process_memory = false;
    Client client(RegionsServer().address(), staging);
    double error = 0;
    // 1.2 MB, then 2.9 MB, then 1.2 MB again, then 8.2 MB.
    for (int64_t n : {550, 850, 550, 1430}) {
      JobResult r = SameHostJob(
          client, Operands<float>(n, n, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 500 + n), &error);
      EXPECT_EQ(r.mode, TransferMode::kRegion) << r.socket_reason;
      EXPECT_LE(error, std::numeric_limits<float>::epsilon()) << n;
    }
    // 2 MiB for the first, 4 MiB for the second (the 2 MiB one was reused
    // by the third), 8 MiB... for the last: powers of two, kept for reuse.
    EXPECT_EQ(StagingSizes(observer), (std::vector<int64_t>{2 << 20, 4 << 20, 8 << 20}));
    absl::StatusOr<v1::GetRegionStatusResponse> listed = GetRegionStatus(observer);
    ASSERT_TRUE(listed.ok());
    for (const v1::RegionStatus& r : listed->regions()) {
      if (r.byte_size() == (2 << 20)) {
        EXPECT_EQ(r.jobs_total(), 2) << "reused";
      }
      EXPECT_TRUE(r.sealed());
    }
  }
  // The client is gone: its session and its staging regions with it.
  for (int i = 0; i < 250 && !StagingSizes(observer).empty(); ++i) usleep(20000);
  EXPECT_TRUE(StagingSizes(observer).empty());
}

// Data already in a SharedMemoryRegion of the client: Client::Multiply runs
// the job there, with no staging region and no copy, into another region or
// in place.
TEST(SameHostTest, DataInTheClientsRegionRunsWithoutACopy) {
  Client observer(RegionsServer().address());
  Client client(RegionsServer().address());
  Operands<float> ops(600, 520, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 808);
  const size_t bytes = ops.a.size() * sizeof(float);
  auto region = SharedMemoryRegion::Create(client, 2 * bytes, "zero-copy");
  ASSERT_TRUE(region.ok()) << region.status();
  char* base = (*region)->bytes();
  std::memcpy(base, ops.a.data(), bytes);
  std::vector<float> poison = ops.NanOutput();
  std::memcpy(base + bytes, poison.data(), bytes);
  Job job = ops.MakeJob();
  job.matrix.data = base;
  absl::StatusOr<JobResult> r = client.Multiply(job, base + bytes, bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mode, TransferMode::kRegion);
  EXPECT_LE(
      ops.MaxRelativeError(ReadBack<float>(**region, static_cast<int64_t>(bytes), ops.a.size())),
      std::numeric_limits<float>::epsilon());
  // In place.
  r = client.Multiply(job, base, bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->mode, TransferMode::kRegion);
  EXPECT_LE(ops.MaxRelativeError(ReadBack<float>(**region, 0, ops.a.size())),
            std::numeric_limits<float>::epsilon());
  // The region did both jobs; no staging region was made.
  absl::StatusOr<v1::GetRegionStatusResponse> listed = GetRegionStatus(observer, "zero-copy");
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->regions(0).jobs_total(), 2);
  EXPECT_TRUE(StagingSizes(observer).empty());
  // Output outside the region: the staging path (a copy), still right.
  std::vector<float> out = ops.NanOutput();
  std::memcpy(base, ops.a.data(), bytes);
  r = client.Multiply(job, out.data(), bytes);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_LE(ops.MaxRelativeError(out), std::numeric_limits<float>::epsilon());
}

TEST(SameHostTest, TwoClientsAtOnceAndTwoProcesses) {
  Client a(RegionsServer().address()), b(RegionsServer().address());
  std::atomic<int> wrong{0};
  const auto run = [&](Client* c, uint64_t seed) {
    for (int i = 0; i < 4; ++i) {
      double error = 0;
      JobResult r = SameHostJob(
          *c, Operands<float>(600, 600, v1::LAYOUT_COL_MAJOR, v1::SIDE_RIGHT, seed + i), &error);
      if (r.mode != TransferMode::kRegion || error > std::numeric_limits<float>::epsilon()) {
        std::fprintf(stderr, "client %p seed %llu: mode %s (%s), error %g\n", static_cast<void*>(c),
                     static_cast<unsigned long long>(seed + i), TransferModeName(r.mode),
                     r.socket_reason.c_str(), error);
        wrong.fetch_add(1);
      }
    }
  };
  std::thread ta(run, &a, 1000), tb(run, &b, 2000), tc(run, &a, 3000);  // a from two threads
  ta.join();
  tb.join();
  tc.join();
  EXPECT_EQ(wrong.load(), 0);
  std::string output;
  const std::string cli =
      CliBinary() + " multiply --random=600 --check --server=" + RegionsServer().address();
  EXPECT_EQ(RunCommand("(" + cli + " & " + cli + " & wait) 2>&1", &output), 0) << output;
  EXPECT_EQ(CountSubstr(output, "mode:       shm"), 2) << output;
  EXPECT_EQ(CountSubstr(output, "): OK"), 2) << output;
}

TEST(SameHostTest, AClientKilledMidJobLeavesNothingOnTheServer) {
  ServerProcess server({"--backend=cpu", "--threads=1", "--allow_regions"});
  Client observer(server.address());
  // A large job (a few hundred ms on this CPU server); the process is
  // killed while it runs (or just before or after: either way nothing of
  // it may stay).
  const std::string cmd = CliBinary() +
                          " multiply --random=5000 --dtype=f64 --server=" + server.address() +
                          " > /dev/null 2>&1 & sleep 0.4; kill -9 $!; wait";
  std::string output;
  RunCommand(cmd, &output);
  int64_t registered = -1, reserved = -1;
  for (int i = 0; i < 250; ++i) {
    absl::StatusOr<v1::GetRegionStatusResponse> listed = GetRegionStatus(observer);
    absl::StatusOr<v1::GetServerInfoResponse> info = observer.GetServerInfo();
    ASSERT_TRUE(listed.ok() && info.ok());
    registered = listed->registered_bytes();
    reserved = 0;
    for (const v1::DeviceInfo& d : info->devices()) reserved += d.reserved_bytes();
    if (registered == 0 && reserved == 0) break;
    usleep(20000);
  }
  EXPECT_EQ(registered, 0);
  EXPECT_EQ(reserved, 0);
  // And the server serves.
  double error = 0;
  JobResult r = SameHostJob(
      observer, Operands<float>(600, 600, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 9), &error);
  EXPECT_EQ(r.mode, TransferMode::kRegion) << r.socket_reason;
  EXPECT_LE(error, std::numeric_limits<float>::epsilon());
}

// dgmm-cli against `server`: output (stdout and stderr) and exit code.
struct CliRun {
  int exit_code;
  std::string output;
};
CliRun Cli(const std::string& args, const ServerProcess& server) {
  CliRun run;
  run.exit_code =
      RunCommand(CliBinary() + " " + args + " --server=" + server.address() + " 2>&1", &run.output);
  return run;
}

TEST(CliShmTest, OnUsesSharedMemoryAndChecks) {
  for (const char* shape : {"--random=300 --cols=200",
                            "--random=257 --cols=190 --dtype=f64 "
                            "--layout=col --side=left"}) {
    SCOPED_TRACE(shape);
    CliRun run = Cli(std::string("multiply --shm=on --check ") + shape, RegionsServer());
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("mode:       shm"));
    EXPECT_THAT(run.output, HasSubstr("max relative error"));
    EXPECT_THAT(run.output, HasSubstr("): OK"));
    EXPECT_THAT(run.output, Not(HasSubstr("streaming instead")));
  }
  Client client(RegionsServer().address());
  EXPECT_EQ(RegisteredBytes(client), 0) << "dgmm-cli left its region registered";
}

// The same-host path is dgmm-cli's default: matrices of 1 MiB
// and more go through a staging region of the client, and the report says
// which path the job took and why.
TEST(CliShmTest, AutoIsTheDefaultAndUsesMemoryWhenItCan) {
  for (const char* flags : {"", "--shm=auto "}) {
    SCOPED_TRACE(flags);
    CliRun run = Cli(std::string("multiply ") + flags + "--random=600 --check", RegionsServer());
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("mode:       shm"));
    EXPECT_THAT(run.output, HasSubstr("path:       same host"));
    EXPECT_THAT(run.output, HasSubstr("): OK"));
  }
  for (const char* shape : {"--random=700 --cols=500 --dtype=f64 --layout=col --side=left",
                            "--random=520 --cols=700 --layout=col",
                            "--random=800 --cols=450 --dtype=f64 --side=right"}) {
    SCOPED_TRACE(shape);
    CliRun run = Cli(std::string("multiply --check ") + shape, RegionsServer());
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("mode:       shm"));
    EXPECT_THAT(run.output, HasSubstr("): OK"));
  }
  // Small matrices, and forced modes, go over the socket, and say why.
  CliRun small = Cli("multiply --random=100 --check", RegionsServer());
  EXPECT_EQ(small.exit_code, 0) << small.output;
  EXPECT_THAT(small.output, HasSubstr("path:       socket (the matrix is under 1 MiB)"));
  CliRun forced = Cli("multiply --random=600 --mode=stream --check", RegionsServer());
  EXPECT_EQ(forced.exit_code, 0) << forced.output;
  EXPECT_THAT(forced.output, HasSubstr("mode:       stream"));
  EXPECT_THAT(forced.output, HasSubstr("path:       socket (--mode forces the socket)"));
}

// The same-host path needs no flag on either side: a server started with
// its defaults serves regions, and dgmm-cli with its defaults takes the
// process-memory path to it.
TEST(CliShmTest, AServerWithItsDefaultsIsReachedTheSameHostWay) {
  ServerProcess server({"--backend=cpu", "--threads=2"}, 0, ServerProcess::Regions::kServerDefault);
  Client client(server.address());
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_TRUE(info->limits().regions_enabled());
  EXPECT_FALSE(info->limits().local_socket().empty());
  CliRun run = Cli("multiply --random=600 --cols=500 --dtype=f64 --side=left --check", server);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("mode:       shm"));
  EXPECT_THAT(run.output, HasSubstr("path:       same host, process memory"));
  EXPECT_THAT(run.output, HasSubstr("): OK"));
}

// Regions are on by default and best effort with --local_socket=auto: a
// server that finds no place for its local socket (here /run read-only and
// /tmp/dgmm-<uid> not this user's, in a mount namespace of its own) serves
// on without regions and says why; clients use the socket. A path given
// with --local_socket that cannot be used stops the start.
TEST(CliShmTest, NoPlaceForTheLocalSocketTurnsRegionsOffNotTheServer) {
  std::string output;
  if (RunCommand("unshare -m sh -c 'mount -t tmpfs -o ro dgmm-test /run' 2>&1", &output) != 0) {
    GTEST_SKIP() << "no mount namespaces here (unshare -m failed): " << output;
  }
  const std::string own_tmp = "/tmp/dgmm-" + std::to_string(getuid());
  mkdir(own_tmp.c_str(), 0755);  // the mount point (the real one is left as it is)
  char tmpl[] = "/tmp/dgmm-noplace-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(tmpl) << "#!/bin/sh\nunset XDG_RUNTIME_DIR\nexec unshare -m sh -c "
                         "'mount -t tmpfs -o ro dgmm-test /run && "
                         "mount -t tmpfs -o uid=65534 dgmm-test "
                      << own_tmp << " && exec \"$0\" \"$@\"' " << testing::ServerBinary()
                      << " \"$@\"\n";
  chmod(tmpl, 0700);
  const std::string real = testing::ServerBinary();
  setenv("DGMM_SERVER_BIN", tmpl, 1);
  {
    ServerProcess server({"--backend=cpu", "--threads=1"}, 0,
                         ServerProcess::Regions::kServerDefault);
    Client client(server.address());
    absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_FALSE(info->limits().regions_enabled());
    EXPECT_THAT(server.Log(), HasSubstr("warning: regions off, every client uses the gRPC socket"));
    CliRun run = Cli("multiply --random=600 --check", server);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr("mode:       unary"));
    EXPECT_THAT(run.output, HasSubstr("): OK"));
  }
  // The same with a path of the operator's: not started.
  const int rc = RunCommand(std::string(tmpl) +
                                " --listen=127.0.0.1:0 --backend=cpu "
                                "--local_socket=/run/dgmm-test.sock 2>&1",
                            &output);
  EXPECT_NE(rc, 0) << output;
  EXPECT_THAT(output, HasSubstr("/run/dgmm-test.sock"));
  setenv("DGMM_SERVER_BIN", real.c_str(), 1);
  unlink(tmpl);
}

TEST(CliShmTest, AutoFallsBackToTheSocketAndSaysWhy) {
  CliRun run = Cli("multiply --random=600 --check", RegionsOffServer());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("path:       socket: the same-host path was not usable: "
                                    "FAILED_PRECONDITION: this server does not take regions"));
  EXPECT_THAT(run.output, HasSubstr("mode:       unary"));
  EXPECT_THAT(run.output, HasSubstr("): OK"));

  // A staging region over the server's region budget.
  ServerProcess small(
      {"--backend=cpu", "--threads=1", "--allow_regions", "--region_memory_budget=65536"});
  // (Process memory needs no region: that path is turned off here.)
  run = Cli("multiply --random=600 --check --process_memory=false", small);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("path:       socket: the same-host path was not usable: "
                                    "RESOURCE_EXHAUSTED: registering 2097152 bytes would exceed "
                                    "the region budget"));
  // With it, the budget does not matter.
  run = Cli("multiply --random=600 --check", small);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("path:       same host, process memory"));
  EXPECT_THAT(run.output, HasSubstr("): OK"));
  EXPECT_THAT(run.output, HasSubstr("): OK"));

  ServerProcess* elsewhere = ElsewhereServer();
  if (elsewhere == nullptr) GTEST_SKIP() << "no mount namespaces here (unshare -m failed)";
  run = Cli("multiply --random=600 --check", *elsewhere);
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("path:       socket: the same-host path was not usable: "
                                    "FAILED_PRECONDITION: cannot reach the server's local socket"));
  EXPECT_THAT(run.output, HasSubstr("mode:       unary"));
}

TEST(CliShmTest, OnFailsWhenItCannot) {
  CliRun run = Cli("multiply --shm=on --random=64", RegionsOffServer());
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_THAT(run.output, HasSubstr("error: FAILED_PRECONDITION: --shm: "));
  EXPECT_THAT(run.output, Not(HasSubstr("mode:")));
  run = Cli("multiply --shm=maybe --random=64", RegionsServer());
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_THAT(run.output, HasSubstr("--shm=maybe is not valid"));
}

// .npy files on the same-host path: by default both files mapped and the
// server copying between them (process memory); with
// --process_memory=false, A read into a region and C written from it; and
// the socket. The file C equals the float64 reference for every dtype,
// layout and side on each path.
template <typename T>
void CheckFiles(const Operands<T>& ops, const std::string& dir, const std::string& flags) {
  NpyHeader a;
  a.dtype = sizeof(T) == 4 ? v1::DTYPE_FLOAT32 : v1::DTYPE_FLOAT64;
  a.fortran_order = ops.layout == v1::LAYOUT_COL_MAJOR;
  a.shape = {ops.rows, ops.cols};
  NpyHeader d = a;
  d.fortran_order = false;
  d.shape = {static_cast<int64_t>(ops.d.size())};
  ASSERT_TRUE(WriteNpy(dir + "/A.npy", a, ops.a.data(), ops.a.size() * sizeof(T)).ok());
  ASSERT_TRUE(WriteNpy(dir + "/d.npy", d, ops.d.data(), ops.d.size() * sizeof(T)).ok());
  const std::vector<std::array<const char*, 3>> paths = {
      {"", "path:       same host, process memory (the server read A from", "phases:     map "},
      {"--process_memory=false ", "path:       same host (A read from", "phases:     region "},
      {"--shm=off ", "path:       socket (--shm=off)", "mode:       "}};
  for (const auto& [path, says, phases] : paths) {
    SCOPED_TRACE(path);
    std::vector<T> poison = ops.NanOutput();
    ASSERT_TRUE(WriteNpy(dir + "/C.npy", a, poison.data(), poison.size() * sizeof(T)).ok());
    CliRun run = Cli(absl::StrCat("multiply ", path, flags, " --matrix=", dir,
                                  "/A.npy --diag=", dir, "/d.npy --out=", dir, "/C.npy"),
                     RegionsServer());
    ASSERT_EQ(run.exit_code, 0) << run.output;
    EXPECT_THAT(run.output, HasSubstr(says));
    EXPECT_THAT(run.output, HasSubstr(phases));
    absl::StatusOr<NpyArray> c = ReadNpy(dir + "/C.npy");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->header().fortran_order, a.fortran_order);
    std::vector<T> got(ops.a.size());
    std::memcpy(got.data(), c->data(), got.size() * sizeof(T));
    EXPECT_LE(ops.MaxRelativeError(got), std::numeric_limits<T>::epsilon());
  }
}

TEST(CliShmTest, NpyFilesGoStraightThroughARegion) {
  char tmpl[] = "/tmp/dgmm-cli-npy-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  uint64_t seed = 70;
  for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
    for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
      SCOPED_TRACE(absl::StrCat(v1::Layout_Name(layout), " ", v1::Side_Name(side)));
      const char* side_flag = side == v1::SIDE_LEFT ? "--side=left" : "--side=right";
      CheckFiles(Operands<float>(640, 450, layout, side, seed++), dir, side_flag);
      CheckFiles(Operands<double>(420, 330, layout, side, seed++), dir,
                 absl::StrCat(side_flag, " --check"));
    }
  }
  for (const char* f : {"A.npy", "d.npy", "C.npy"}) unlink((dir + "/" + f).c_str());
  EXPECT_EQ(rmdir(dir.c_str()), 0) << "a file is left in " << dir << " (a temporary C?)";
}

// The output .npy with process memory: made anew under a temporary name and
// renamed (no file yet, or one of another array), or, when it already holds
// an array of the same shape, dtype and order, overwritten in place (same
// inode); a job that fails removes an output it was overwriting.
TEST(CliShmTest, NpyOutputIsMadeAnewOrOverwrittenInPlace) {
  char tmpl[] = "/tmp/dgmm-cli-out-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  Operands<float> ops(700, 600, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 123);
  NpyHeader a;
  a.dtype = v1::DTYPE_FLOAT32;
  a.shape = {ops.rows, ops.cols};
  NpyHeader d;
  d.dtype = v1::DTYPE_FLOAT32;
  d.shape = {ops.cols};
  ASSERT_TRUE(WriteNpy(dir + "/A.npy", a, ops.a.data(), ops.a.size() * sizeof(float)).ok());
  ASSERT_TRUE(WriteNpy(dir + "/d.npy", d, ops.d.data(), ops.d.size() * sizeof(float)).ok());
  const std::string c_path = dir + "/C.npy";
  const std::string args =
      absl::StrCat("multiply --matrix=", dir, "/A.npy --diag=", dir, "/d.npy --out=", c_path);
  const auto inode = [&]() -> ino_t {
    struct stat st;
    return stat(c_path.c_str(), &st) == 0 ? st.st_ino : 0;
  };
  const auto check_c = [&] {
    absl::StatusOr<NpyArray> c = ReadNpy(c_path);
    ASSERT_TRUE(c.ok()) << c.status();
    std::vector<float> got(ops.a.size());
    std::memcpy(got.data(), c->data(), got.size() * sizeof(float));
    EXPECT_LE(ops.MaxRelativeError(got), std::numeric_limits<float>::epsilon());
  };
  // No output yet: made anew (C written from this process's memory).
  CliRun run = Cli(args, RegionsServer());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("process memory"));
  EXPECT_THAT(run.output, HasSubstr("written to a new " + c_path));
  EXPECT_THAT(run.output, HasSubstr(", write C "));
  check_c();
  // The same array there (poisoned): overwritten in place.
  std::vector<float> poison = ops.NanOutput();
  ASSERT_TRUE(WriteNpy(c_path, a, poison.data(), poison.size() * sizeof(float)).ok());
  const ino_t before = inode();
  run = Cli(args, RegionsServer());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_EQ(inode(), before) << "not overwritten in place";
  EXPECT_THAT(run.output, HasSubstr("wrote C into " + c_path));
  EXPECT_THAT(run.output, HasSubstr(", close "));
  check_c();
  // Another array there: replaced by a new file.
  NpyHeader other = a;
  other.shape = {ops.rows, ops.cols - 1};
  std::vector<float> small(static_cast<size_t>(ops.rows * (ops.cols - 1)), 1.0f);
  ASSERT_TRUE(WriteNpy(c_path, other, small.data(), small.size() * sizeof(float)).ok());
  const ino_t replaced = inode();
  run = Cli(args, RegionsServer());
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(inode(), replaced);
  check_c();
  // A job that fails (a diagonal one element short) removes the output it
  // was overwriting rather than leave it half-written.
  d.shape = {ops.cols - 1};
  ASSERT_TRUE(WriteNpy(dir + "/d.npy", d, ops.d.data(), (ops.d.size() - 1) * sizeof(float)).ok());
  run = Cli(args, RegionsServer());
  EXPECT_NE(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_EQ(inode(), 0u) << "the output was left behind";
  for (const char* f : {"A.npy", "d.npy", "C.npy"}) unlink((dir + "/" + f).c_str());
  EXPECT_EQ(rmdir(dir.c_str()), 0) << "a file is left in " << dir;
}

TEST(CliShmTest, OffUsesTheSocket) {
  CliRun run = Cli("multiply --shm=off --random=600 --check", RegionsServer());
  EXPECT_EQ(run.exit_code, 0) << run.output;
  EXPECT_THAT(run.output, HasSubstr("mode:       unary"));
  EXPECT_THAT(run.output, HasSubstr("path:       socket (--shm=off)"));
}

}  // namespace
}  // namespace dgmm
