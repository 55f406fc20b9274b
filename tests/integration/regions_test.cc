// Regions (issues 14 and 24) on the CPU backend: a real dgmm-server with
// --allow_regions on loopback, real POSIX shared-memory objects made here
// and passed by descriptor through the server's local socket (a raw client
// of it, tests/support/local_peer.h, independent of the C++ client library),
// the generated stubs. Checks
// round trips for every dtype x layout x side against a float64 reference
// (results poisoned with NaN first), in place, a diagonal in a region, every
// bad input of the status table in dgmm.proto with its code, unregistering
// while a job runs, a client shrinking its object (the job fails
// FAILED_PRECONDITION, the server lives), a client process that exits
// without unregistering, and that registered and reserved bytes are back to 0
// after every test.
//
// The binary has its own main: run as
//   dgmm_regions_test --register-and-exit ADDRESS TOKEN KEY NAME BYTES
// it registers the object KEY as region NAME through a session of its own
// and _exits without unregistering (the child of
// ClientThatExitsWithoutUnregistering).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/local_peer.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

constexpr char kToken1[] = "regions-test-token-one";
constexpr char kToken2[] = "regions-test-token-two";
constexpr int64_t kBudget = int64_t{24} << 20;  // --region_memory_budget
constexpr int kMaxRegions = 6;                   // --max_regions_per_client

int64_t Align64(int64_t n) { return (n + 63) / 64 * 64; }

std::string TokenFile() {
  static const std::string path = [] {
    char tmpl[] = "/tmp/dgmm-regions-test-XXXXXX";
    const int fd = mkstemp(tmpl);
    if (fd < 0) std::abort();
    close(fd);
    std::ofstream(tmpl) << kToken1 << "\n" << kToken2 << "\n";
    return std::string(tmpl);
  }();
  return path;
}

// One server for the file: CPU backend, regions on, two tokens, a small
// region budget and regions-per-client limit so that both can be reached
// (by one uid: the whole budget is its share here).
ServerProcess& Server() {
  static ServerProcess server({"--backend=cpu", "--threads=2", "--allow_regions",
                               "--region_memory_budget=" + std::to_string(kBudget),
                               "--max_region_share_percent=100",
                               "--max_regions_per_client=" + std::to_string(kMaxRegions),
                               "--auth_token_file=" + TokenFile()});
  return server;
}

v1::Dgmm::Stub* Stub() {
  static std::unique_ptr<v1::Dgmm::Stub> stub = Connect(Server().address());
  return stub.get();
}

// A session on `stub`'s server's local socket (its path from GetServerInfo).
std::unique_ptr<SocketPeer> OpenSession(v1::Dgmm::Stub* stub) {
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", std::string("Bearer ") + kToken1);  // where tokens are set
  v1::GetServerInfoResponse info;
  EXPECT_TRUE(stub->GetServerInfo(&ctx, {}, &info).ok());
  auto peer = std::make_unique<SocketPeer>(info.limits().local_socket());
  EXPECT_TRUE(peer->connected());
  auto hello = peer->Hello();
  EXPECT_TRUE(hello.has_value() && hello->code() == 0);
  return peer;
}

// This process's session with the file's server.
SocketPeer& Session() {
  static std::unique_ptr<SocketPeer> session = OpenSession(Stub());
  return *session;
}

// A context with a 30 s deadline, `token`'s metadata (none when empty) and
// the session's (none when null).
std::unique_ptr<grpc::ClientContext> Ctx(const std::string& token = kToken1,
                                         SocketPeer* session = &Session()) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  if (!token.empty()) ctx->AddMetadata("authorization", "Bearer " + token);
  if (session != nullptr) ctx->AddMetadata("dgmm-session", session->session());
  return ctx;
}

// A POSIX shared-memory object of this process, mapped; unmapped and
// unlinked when destroyed.
class ShmObject {
 public:
  explicit ShmObject(int64_t bytes) : size_(bytes) {
    static std::atomic<int> counter{0};
    key_ = "/dgmm-regions-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
    fd_ = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd_ < 0 || ftruncate(fd_, bytes) != 0) {
      std::perror("shm_open/ftruncate");
      std::abort();
    }
    data_ = static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0));
    if (data_ == MAP_FAILED) std::abort();
  }
  ~ShmObject() {
    munmap(data_, size_);
    close(fd_);
    Unlink();
  }
  ShmObject(const ShmObject&) = delete;
  ShmObject& operator=(const ShmObject&) = delete;

  const std::string& key() const { return key_; }
  int fd() const { return fd_; }
  char* data() { return data_; }
  int64_t size() const { return size_; }
  // Shrinks the object to 0 bytes: every page of it now faults (SIGBUS) in
  // any process that touches it. Do not touch data() afterwards.
  void Shrink() { ASSERT_EQ(ftruncate(fd_, 0), 0); }
  void Unlink() {
    if (!unlinked_) shm_unlink(key_.c_str());
    unlinked_ = true;
  }

 private:
  std::string key_;
  int fd_ = -1;
  char* data_ = nullptr;
  int64_t size_;
  bool unlinked_ = false;
};

// Registers `bytes` at `offset` of the memory behind descriptor `fd`: the
// descriptor is passed through `session` for a ticket, which the request names.
v1::RegisterRegionRequest FdRequest(const std::string& name, int fd, int64_t offset,
                                    int64_t bytes, SocketPeer* session = &Session()) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  std::string why;
  request.mutable_local_fd()->set_ticket(session->Ticket(fd, &why));
  EXPECT_FALSE(request.local_fd().ticket().empty()) << why;
  request.mutable_local_fd()->set_offset(offset);
  request.mutable_local_fd()->set_byte_size(bytes);
  return request;
}

v1::RegisterRegionRequest ShmRequest(const std::string& name, const ShmObject& shm,
                                     int64_t offset, int64_t bytes,
                                     SocketPeer* session = &Session()) {
  return FdRequest(name, shm.fd(), offset, bytes, session);
}

grpc::Status Register(const v1::RegisterRegionRequest& request,
                      const std::string& token = kToken1, v1::RegionStatus* region = nullptr) {
  v1::RegisterRegionResponse response;
  grpc::Status status = Stub()->RegisterRegion(Ctx(token).get(), request, &response);
  if (region != nullptr) *region = response.region();
  return status;
}

grpc::Status RegisterShm(const std::string& name, const ShmObject& shm,
                         const std::string& token = kToken1) {
  return Register(ShmRequest(name, shm, 0, shm.size()), token);
}

grpc::Status Unregister(const std::string& name, const std::string& token = kToken1,
                        int* count = nullptr) {
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  v1::UnregisterRegionResponse response;
  grpc::Status status = Stub()->UnregisterRegion(Ctx(token).get(), request, &response);
  if (count != nullptr) *count = response.unregistered();
  return status;
}

grpc::Status RegionStatus(const std::string& name, v1::GetRegionStatusResponse* response,
                          const std::string& token = kToken1) {
  v1::GetRegionStatusRequest request;
  request.set_name(name);
  return Stub()->GetRegionStatus(Ctx(token).get(), request, response);
}

int64_t RegisteredBytes() {
  v1::GetRegionStatusResponse response;
  grpc::Status status = RegionStatus("", &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return status.ok() ? response.registered_bytes() : -1;
}

int64_t ReservedBytes() {
  v1::GetServerInfoResponse info;
  grpc::Status status = Stub()->GetServerInfo(Ctx().get(), v1::GetServerInfoRequest(), &info);
  EXPECT_TRUE(status.ok()) << status.error_message();
  int64_t reserved = 0;
  for (const v1::DeviceInfo& d : info.devices()) reserved += d.reserved_bytes();
  return reserved;
}

v1::RegionRef Ref(const std::string& name, int64_t offset) {
  v1::RegionRef ref;
  ref.set_name(name);
  ref.set_offset(offset);
  return ref;
}

grpc::Status MultiplyRegion(const v1::MultiplyRegionRequest& request,
                            v1::JobStats* stats = nullptr, const std::string& token = kToken1) {
  v1::MultiplyRegionResponse response;
  grpc::Status status = Stub()->MultiplyRegion(Ctx(token).get(), request, &response);
  if (stats != nullptr) *stats = response.stats();
  return status;
}

// A request for `job` with the matrix at `matrix_at` and the result at
// `result_at` of region `name`; the diagonal inline.
v1::MultiplyRegionRequest RegionRequest(const RandomJob& job, const std::string& name,
                                        int64_t matrix_at, int64_t result_at) {
  v1::MultiplyRegionRequest request;
  *request.mutable_header() = job.header;
  *request.mutable_matrix() = Ref(name, matrix_at);
  *request.mutable_result() = Ref(name, result_at);
  return request;
}

void Poison(char* at, int64_t bytes, v1::DType dtype) {
  if (dtype == v1::DTYPE_FLOAT64) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (int64_t i = 0; i < bytes / 8; ++i) std::memcpy(at + i * 8, &nan, 8);
  } else {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (int64_t i = 0; i < bytes / 4; ++i) std::memcpy(at + i * 4, &nan, 4);
  }
}

double Tolerance(v1::DType dtype) { return dtype == v1::DTYPE_FLOAT64 ? 1e-14 : 1e-6; }

std::string Name(v1::DType dtype, v1::Layout layout, v1::Side side) {
  return std::string(dtype == v1::DTYPE_FLOAT64 ? "f64" : "f32") +
         (layout == v1::LAYOUT_COL_MAJOR ? "-col" : "-row") +
         (side == v1::SIDE_LEFT ? "-left" : "-right");
}

class RegionsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(RegisteredBytes(), 0) << "a region of an earlier test is still registered";
  }
  // After every path: no region left, nothing registered, nothing reserved.
  void TearDown() override {
    EXPECT_TRUE(Unregister("", kToken1).ok());
    EXPECT_TRUE(Unregister("", kToken2).ok());
    EXPECT_TRUE(WaitUntil([] { return RegisteredBytes() == 0; }, 5000))
        << "registered bytes: " << RegisteredBytes();
    EXPECT_TRUE(WaitUntil([] { return ReservedBytes() == 0; }, 5000))
        << "reserved bytes: " << ReservedBytes();
  }
};

TEST_F(RegionsTest, RoundTripsEveryDtypeLayoutSide) {
  uint64_t seed = 1;
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
    for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
      for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
        SCOPED_TRACE(Name(dtype, layout, side));
        const RandomJob job = MakeJob(67, 45, dtype, layout, side, seed++);
        const int64_t bytes = static_cast<int64_t>(job.matrix.size());
        // A at 192 (an offset inside the region), C after it.
        const int64_t a_at = 192, c_at = Align64(a_at + bytes);
        ShmObject shm(c_at + bytes + 64);
        std::memcpy(shm.data() + a_at, job.matrix.data(), bytes);
        Poison(shm.data() + c_at, bytes, dtype);
        const std::string name = "rt." + Name(dtype, layout, side);
        v1::RegionStatus region;
        ASSERT_TRUE(Register(ShmRequest(name, shm, 0, shm.size()), kToken1, &region).ok());
        EXPECT_EQ(region.name(), name);
        EXPECT_EQ(region.kind(), v1::REGION_KIND_SYSTEM_SHM);
        EXPECT_EQ(region.key(), "/dev/shm" + shm.key());
        EXPECT_EQ(region.byte_size(), shm.size());
        EXPECT_EQ(region.device(), -1);

        v1::JobStats stats;
        grpc::Status status = MultiplyRegion(RegionRequest(job, name, a_at, c_at), &stats);
        ASSERT_TRUE(status.ok()) << status.error_code() << ": " << status.error_message();
        EXPECT_LE(MaxRelError(job, std::string(shm.data() + c_at, bytes)), Tolerance(dtype));
        EXPECT_EQ(std::memcmp(shm.data() + a_at, job.matrix.data(), bytes), 0) << "A changed";
        EXPECT_EQ(stats.bytes_out(), bytes);
        EXPECT_GE(stats.bytes_in(), bytes);
        EXPECT_EQ(stats.backend(), v1::BACKEND_CPU);
        EXPECT_EQ(stats.device_index(), -1);

        v1::GetRegionStatusResponse listed;
        ASSERT_TRUE(RegionStatus(name, &listed).ok());
        ASSERT_EQ(listed.regions_size(), 1);
        EXPECT_EQ(listed.regions(0).jobs_total(), 1);
        EXPECT_EQ(listed.regions(0).jobs_in_use(), 0);
        EXPECT_EQ(listed.registered_bytes(), shm.size());
        EXPECT_EQ(listed.region_budget_bytes(), kBudget);
        int unregistered = 0;
        ASSERT_TRUE(Unregister(name, kToken1, &unregistered).ok());
        EXPECT_EQ(unregistered, 1);
        EXPECT_EQ(RegisteredBytes(), 0);
      }
    }
  }
}

TEST_F(RegionsTest, InPlaceBothDtypes) {
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
    const v1::Layout layout =
        dtype == v1::DTYPE_FLOAT32 ? v1::LAYOUT_ROW_MAJOR : v1::LAYOUT_COL_MAJOR;
    const v1::Side side = dtype == v1::DTYPE_FLOAT32 ? v1::SIDE_RIGHT : v1::SIDE_LEFT;
    SCOPED_TRACE(Name(dtype, layout, side));
    const RandomJob job = MakeJob(300, 211, dtype, layout, side, 77);
    const int64_t bytes = static_cast<int64_t>(job.matrix.size());
    ShmObject shm(bytes + 128);
    std::memcpy(shm.data() + 128, job.matrix.data(), bytes);
    ASSERT_TRUE(RegisterShm("inplace", shm).ok());
    grpc::Status status = MultiplyRegion(RegionRequest(job, "inplace", 128, 128));
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_LE(MaxRelError(job, std::string(shm.data() + 128, bytes)), Tolerance(dtype));
    ASSERT_TRUE(Unregister("inplace").ok());
  }
}

TEST_F(RegionsTest, DiagonalInARegion) {
  for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
    const RandomJob job = MakeJob(90, 130, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, side, 5);
    const int64_t bytes = static_cast<int64_t>(job.matrix.size());
    const int64_t diag_bytes = static_cast<int64_t>(job.header.diagonal().size());
    // The diagonal in its own region, the matrix and result in another.
    ShmObject data(2 * bytes), diag(diag_bytes + 64);
    std::memcpy(data.data(), job.matrix.data(), bytes);
    Poison(data.data() + bytes, bytes, v1::DTYPE_FLOAT64);
    std::memcpy(diag.data() + 64, job.header.diagonal().data(), diag_bytes);
    ASSERT_TRUE(RegisterShm("data", data).ok());
    ASSERT_TRUE(RegisterShm("diag", diag).ok());
    v1::MultiplyRegionRequest request = RegionRequest(job, "data", 0, bytes);
    request.mutable_header()->clear_diagonal();
    *request.mutable_diagonal() = Ref("diag", 64);
    v1::JobStats stats;
    grpc::Status status = MultiplyRegion(request, &stats);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_LE(MaxRelError(job, std::string(data.data() + bytes, bytes)), 1e-14);
    EXPECT_EQ(stats.bytes_out(), bytes);

    // The diagonal both inline and in a region: INVALID_ARGUMENT.
    *request.mutable_header() = job.header;
    EXPECT_EQ(MultiplyRegion(request).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    // A diagonal ref past its region's end.
    request.mutable_header()->clear_diagonal();
    *request.mutable_diagonal() = Ref("diag", 128);
    EXPECT_EQ(MultiplyRegion(request).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    ASSERT_TRUE(Unregister("").ok());
  }
}

// Regions registered at offsets of their object: job refs are relative to
// the region, and two regions over the same bytes count as the same memory.
TEST_F(RegionsTest, RegionsAtOffsetsOfOneObject) {
  const RandomJob job = MakeJob(64, 48, v1::DTYPE_FLOAT32, v1::LAYOUT_COL_MAJOR,
                                v1::SIDE_RIGHT, 41);
  const int64_t bytes = static_cast<int64_t>(job.matrix.size());  // 12288
  ShmObject shm(4096 + 2 * bytes + 4096);
  // Region "a" is bytes [4096, 4096 + bytes) of the object, "c" the next
  // `bytes`, and "all" the whole object.
  std::memcpy(shm.data() + 4096, job.matrix.data(), bytes);
  Poison(shm.data() + 4096 + bytes, bytes, v1::DTYPE_FLOAT32);
  ASSERT_TRUE(Register(ShmRequest("a", shm, 4096, bytes)).ok());
  ASSERT_TRUE(Register(ShmRequest("c", shm, 4096 + bytes, bytes)).ok());
  ASSERT_TRUE(Register(ShmRequest("all", shm, 0, shm.size())).ok());
  v1::MultiplyRegionRequest request = RegionRequest(job, "a", 0, 0);
  request.mutable_result()->set_name("c");
  grpc::Status status = MultiplyRegion(request);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_LE(MaxRelError(job, std::string(shm.data() + 4096 + bytes, bytes)), 1e-6);
  EXPECT_EQ(std::memcmp(shm.data() + 4096, job.matrix.data(), bytes), 0);
  // A job range of `bytes` does not fit "a" at offset 4.
  EXPECT_EQ(MultiplyRegion(RegionRequest(job, "a", 4, 4)).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  // Matrix in "a", result in "all" 4 bytes later in the object: a partial
  // overlap through two regions.
  request = RegionRequest(job, "a", 0, 4096 + 4);
  request.mutable_result()->set_name("all");
  status = MultiplyRegion(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  // The same bytes through two regions are in place: allowed.
  Poison(shm.data() + 4096 + bytes, bytes, v1::DTYPE_FLOAT32);
  request = RegionRequest(job, "c", 0, 4096 + bytes);
  request.mutable_result()->set_name("all");
  std::memcpy(shm.data() + 4096 + bytes, job.matrix.data(), bytes);
  status = MultiplyRegion(request);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_LE(MaxRelError(job, std::string(shm.data() + 4096 + bytes, bytes)), 1e-6);
  EXPECT_EQ(RegisteredBytes(), 2 * bytes + shm.size());
}

TEST_F(RegionsTest, BadRegistrationsGetTheirCodes) {
  ShmObject shm(4096);
  const auto code = [](const v1::RegisterRegionRequest& r) { return Register(r).error_code(); };
  constexpr auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  // Names: 1-64 of [A-Za-z0-9._-].
  for (const std::string& name :
       {std::string(), std::string("a/b"), std::string("a b"), std::string(65, 'n'),
        std::string("r\xc3\xa9gion"), std::string("x\0y", 3)}) {
    SCOPED_TRACE(std::string("name '").append(name).append("'"));
    EXPECT_EQ(code(ShmRequest(name, shm, 0, 4096)), kInvalid);
  }
  EXPECT_TRUE(Register(ShmRequest(std::string(64, 'n'), shm, 0, 4096)).ok())
      << "a 64-character name is valid";
  // Registering by key is gone: whatever the key, INVALID_ARGUMENT.
  for (const std::string& key : {shm.key(), std::string("/../etc/passwd"), std::string("/a/b")}) {
    v1::RegisterRegionRequest by_key;
    by_key.set_name("k");
    by_key.mutable_system_shm()->set_key(key);
    by_key.mutable_system_shm()->set_byte_size(16);
    const grpc::Status status = Register(by_key);
    EXPECT_EQ(status.error_code(), kInvalid) << key;
    EXPECT_NE(status.error_message().find("removed"), std::string::npos) << status.error_message();
  }
  EXPECT_EQ(code(ShmRequest("k", shm, -1, 16)), kInvalid) << "negative offset";
  EXPECT_EQ(code(ShmRequest("k", shm, 0, 0)), kInvalid) << "zero size";
  EXPECT_EQ(code(ShmRequest("k", shm, 0, -16)), kInvalid) << "negative size";
  EXPECT_EQ(code(ShmRequest("k", shm, 0, 4097)), kInvalid) << "past the end";
  EXPECT_EQ(code(ShmRequest("k", shm, 4000, 97)), kInvalid) << "past the end";
  EXPECT_EQ(code(ShmRequest("k", shm, 4096, 1)), kInvalid) << "past the end";
  EXPECT_EQ(code(ShmRequest("k", shm, std::numeric_limits<int64_t>::max(), 1)), kInvalid)
      << "offset + size overflows";
  // The argument checks come before the budget (24 MiB here): an 8 GiB
  // region with a bad name or an overflowing range is INVALID_ARGUMENT.
  const int64_t huge = int64_t{8} << 30;
  EXPECT_EQ(code(ShmRequest("a/b", shm, 0, huge)), kInvalid);
  EXPECT_EQ(code(ShmRequest("k", shm, std::numeric_limits<int64_t>::max() - 8, huge)), kInvalid);
  EXPECT_EQ(code(ShmRequest("k", shm, 0, huge)), kInvalid) << "past the end, before the budget";
  // Tickets: unknown, used twice, or another session's are NOT_FOUND.
  v1::RegisterRegionRequest unknown = ShmRequest("k", shm, 0, 16);
  unknown.mutable_local_fd()->set_ticket("00112233445566778899aabbccddeeff");
  EXPECT_EQ(code(unknown), grpc::StatusCode::NOT_FOUND);
  const v1::RegisterRegionRequest once = ShmRequest("once", shm, 0, 16);
  EXPECT_TRUE(Register(once).ok());
  v1::RegisterRegionRequest again = once;
  again.set_name("twice");
  EXPECT_EQ(code(again), grpc::StatusCode::NOT_FOUND) << "a ticket is used once";
  std::unique_ptr<SocketPeer> other = OpenSession(Stub());
  const v1::RegisterRegionRequest theirs = ShmRequest("theirs", shm, 0, 16, other.get());
  EXPECT_EQ(code(theirs), grpc::StatusCode::NOT_FOUND) << "another session's ticket";
  v1::RegisterRegionRequest no_kind;
  no_kind.set_name("k");
  EXPECT_EQ(code(no_kind), kInvalid) << "neither local_fd nor cuda_ipc";
  EXPECT_EQ(RegisteredBytes(), 4096 + 16) << "only the 64-character name and 'once' registered";

  // The last byte exactly, and a duplicate name.
  EXPECT_TRUE(Register(ShmRequest("edge", shm, 4095, 1)).ok());
  EXPECT_EQ(code(ShmRequest("edge", shm, 0, 16)), grpc::StatusCode::ALREADY_EXISTS);
  EXPECT_EQ(RegisteredBytes(), 4096 + 16 + 1);
}

// Without a session, or with one that has closed, every region RPC is
// UNAUTHENTICATED: regions belong to the uid the local socket saw.
TEST_F(RegionsTest, RegionCallsNeedAnOpenSession) {
  ShmObject shm(4096);
  ASSERT_TRUE(RegisterShm("mine", shm).ok());
  v1::GetRegionStatusResponse listed;
  EXPECT_EQ(Stub()->GetRegionStatus(Ctx(kToken1, nullptr).get(), {}, &listed).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  std::unique_ptr<SocketPeer> closing = OpenSession(Stub());
  const std::string stale = closing->session();
  closing.reset();
  auto ctx = Ctx(kToken1, nullptr);
  ctx->AddMetadata("dgmm-session", stale);
  EXPECT_TRUE(WaitUntil(
      [&] {
        auto c = Ctx(kToken1, nullptr);
        c->AddMetadata("dgmm-session", stale);
        v1::GetRegionStatusResponse r;
        return Stub()->GetRegionStatus(c.get(), {}, &r).error_code() ==
               grpc::StatusCode::UNAUTHENTICATED;
      },
      5000));
  const RandomJob job = MakeJob(4, 4, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1);
  v1::MultiplyRegionResponse multiplied;
  EXPECT_EQ(Stub()->MultiplyRegion(ctx.get(), RegionRequest(job, "mine", 0, 64), &multiplied)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  // Another session of the same uid and token sees the same regions.
  std::unique_ptr<SocketPeer> second = OpenSession(Stub());
  v1::GetRegionStatusResponse seen;
  ASSERT_TRUE(Stub()->GetRegionStatus(Ctx(kToken1, second.get()).get(), {}, &seen).ok());
  ASSERT_EQ(seen.regions_size(), 1);
  EXPECT_EQ(seen.regions(0).name(), "mine");
  EXPECT_EQ(seen.regions(0).owner_uid(), static_cast<int64_t>(getuid()));
  // With tokens, the token is part of the owner: token 2 sees none of them.
  ASSERT_TRUE(Stub()->GetRegionStatus(Ctx(kToken2, second.get()).get(), {}, &seen).ok());
  EXPECT_EQ(seen.regions_size(), 0);
}

TEST_F(RegionsTest, CudaIpcOnACpuServerIsFailedPrecondition) {
  v1::RegisterRegionRequest request;
  request.set_name("ipc");
  std::string handle(64, '\0');
  std::mt19937 rng(3);
  for (char& c : handle) c = static_cast<char>(rng());
  request.mutable_cuda_ipc()->set_handle(handle);
  request.mutable_cuda_ipc()->set_device(0);
  request.mutable_cuda_ipc()->set_byte_size(1 << 20);
  grpc::Status status = Register(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_EQ(RegisteredBytes(), 0);
}

TEST_F(RegionsTest, BudgetAndRegionsPerClientAreEnforced) {
  // Over the byte budget, at once and cumulatively.
  ShmObject big(kBudget + 4096);
  grpc::Status status = RegisterShm("big", big);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  // The message names the bytes asked and the budget.
  EXPECT_NE(status.error_message().find(std::to_string(kBudget + 4096)), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find(std::to_string(kBudget)), std::string::npos)
      << status.error_message();
  ASSERT_TRUE(Register(ShmRequest("half1", big, 0, kBudget / 2 + 1)).ok());
  status = Register(ShmRequest("half2", big, 0, kBudget / 2));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  // The budget is for every client together: the second token is refused too.
  status = Register(ShmRequest("half2", big, 0, kBudget / 2), kToken2);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_EQ(RegisteredBytes(), kBudget / 2 + 1);
  ASSERT_TRUE(Unregister("half1").ok());
  EXPECT_TRUE(Register(ShmRequest("half2", big, 0, kBudget / 2)).ok()) << "budget back";
  ASSERT_TRUE(Unregister("half2").ok());

  // Regions per client: kMaxRegions, then RESOURCE_EXHAUSTED; another client
  // (token) has its own count.
  ShmObject small(4096);
  for (int i = 0; i < kMaxRegions; ++i) {
    ASSERT_TRUE(Register(ShmRequest(std::string("r").append(std::to_string(i)), small, 0, 64)).ok()) << i;
  }
  status = Register(ShmRequest("one-more", small, 0, 64));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_TRUE(Register(ShmRequest("one-more", small, 0, 64), kToken2).ok());
  int unregistered = 0;
  ASSERT_TRUE(Unregister("", kToken1, &unregistered).ok());
  EXPECT_EQ(unregistered, kMaxRegions);
  // registered_bytes counts every client's regions: token 2's is left.
  EXPECT_EQ(RegisteredBytes(), 64);
}

TEST_F(RegionsTest, BadJobsGetTheirCodes) {
  const RandomJob job = MakeJob(40, 30, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR,
                                v1::SIDE_RIGHT, 9);
  const int64_t bytes = static_cast<int64_t>(job.matrix.size());  // 4800
  ShmObject shm(3 * bytes), other(3 * bytes);
  std::memcpy(shm.data(), job.matrix.data(), bytes);
  ASSERT_TRUE(RegisterShm("m", shm).ok());
  ASSERT_TRUE(RegisterShm("other", other).ok());
  constexpr auto kInvalid = grpc::StatusCode::INVALID_ARGUMENT;
  const auto code = [](const v1::MultiplyRegionRequest& r) {
    grpc::Status status = MultiplyRegion(r);
    return status.error_code();
  };
  // Ranges outside the region.
  EXPECT_EQ(code(RegionRequest(job, "m", 2 * bytes + 4, bytes)), kInvalid) << "matrix past end";
  EXPECT_EQ(code(RegionRequest(job, "m", 0, 2 * bytes + 4)), kInvalid) << "result past end";
  EXPECT_EQ(code(RegionRequest(job, "m", -4, bytes)), kInvalid) << "negative matrix offset";
  EXPECT_EQ(code(RegionRequest(job, "m", 0, -4)), kInvalid) << "negative result offset";
  EXPECT_EQ(code(RegionRequest(job, "m", std::numeric_limits<int64_t>::max() - 8, bytes)),
            kInvalid)
      << "offset + size overflows";
  // Offsets that are not a multiple of the element size.
  EXPECT_EQ(code(RegionRequest(job, "m", 2, bytes)), kInvalid) << "misaligned matrix";
  EXPECT_EQ(code(RegionRequest(job, "m", 0, bytes + 1)), kInvalid) << "misaligned result";
  // A result that partly overlaps the matrix (in place is the same offset).
  EXPECT_EQ(code(RegionRequest(job, "m", 0, 4)), kInvalid) << "partial overlap";
  EXPECT_EQ(code(RegionRequest(job, "m", bytes / 2, 0)), kInvalid) << "partial overlap";
  // Names that are not this client's regions.
  EXPECT_EQ(code(RegionRequest(job, "nope", 0, bytes)), grpc::StatusCode::NOT_FOUND);
  v1::MultiplyRegionRequest result_missing = RegionRequest(job, "m", 0, bytes);
  result_missing.mutable_result()->set_name("nope");
  EXPECT_EQ(code(result_missing), grpc::StatusCode::NOT_FOUND);
  v1::MultiplyRegionRequest diag_missing = RegionRequest(job, "m", 0, bytes);
  diag_missing.mutable_header()->clear_diagonal();
  *diag_missing.mutable_diagonal() = Ref("nope", 0);
  EXPECT_EQ(code(diag_missing), grpc::StatusCode::NOT_FOUND);
  // The header is validated as for every job.
  v1::MultiplyRegionRequest bad_header = RegionRequest(job, "m", 0, bytes);
  bad_header.mutable_header()->set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(code(bad_header), kInvalid) << "no dtype";
  bad_header = RegionRequest(job, "m", 0, bytes);
  bad_header.mutable_header()->mutable_diagonal()->resize(4);
  EXPECT_EQ(code(bad_header), kInvalid) << "short inline diagonal";
  bad_header = RegionRequest(job, "m", 0, bytes);
  bad_header.mutable_header()->set_rows(0);
  EXPECT_EQ(code(bad_header), kInvalid) << "zero rows";
  // Another client's region: NOT_FOUND for every region RPC.
  v1::MultiplyRegionResponse response;
  EXPECT_EQ(Stub()
                ->MultiplyRegion(Ctx(kToken2).get(), RegionRequest(job, "m", 0, bytes), &response)
                .error_code(),
            grpc::StatusCode::NOT_FOUND);
  v1::GetRegionStatusResponse listed;
  EXPECT_EQ(RegionStatus("m", &listed, kToken2).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Unregister("m", kToken2).error_code(), grpc::StatusCode::NOT_FOUND);
  ASSERT_TRUE(RegionStatus("", &listed, kToken2).ok());
  EXPECT_EQ(listed.regions_size(), 0) << "token 2 sees none of token 1's regions";
  // ... and may use the same name for its own region.
  EXPECT_TRUE(RegisterShm("m", other, kToken2).ok());
  // No token at all.
  EXPECT_EQ(Stub()->MultiplyRegion(Ctx("").get(), RegionRequest(job, "m", 0, bytes), &response)
                .error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  // After all that, the region still works, and nothing was written by the
  // refused jobs (the result area is still what we put there).
  Poison(shm.data() + bytes, bytes, v1::DTYPE_FLOAT32);
  ASSERT_TRUE(MultiplyRegion(RegionRequest(job, "m", 0, bytes)).ok());
  EXPECT_LE(MaxRelError(job, std::string(shm.data() + bytes, bytes)), 1e-6);
  EXPECT_EQ(std::memcmp(shm.data(), job.matrix.data(), bytes), 0);
}

TEST_F(RegionsTest, UnregisterWhileAJobRunsLetsItFinish) {
  // A job large enough to be caught running: f64, A and C apart, 2 x 11 MB
  // under the 24 MiB budget. Tried a few times: the test needs one run in
  // which the unregister came while the server reported the job in use and
  // before its answer arrived.
  const RandomJob job = MakeJob(1500, 960, v1::DTYPE_FLOAT64, v1::LAYOUT_COL_MAJOR,
                                v1::SIDE_RIGHT, 21);
  const int64_t bytes = static_cast<int64_t>(job.matrix.size());
  bool caught = false;
  int attempts = 0;
  for (; attempts < 20 && !caught; ++attempts) {
    ShmObject shm(2 * bytes);
    std::memcpy(shm.data(), job.matrix.data(), bytes);
    Poison(shm.data() + bytes, bytes, v1::DTYPE_FLOAT64);
    ASSERT_TRUE(RegisterShm("busy", shm).ok());
    grpc::Status job_status;
    std::atomic<bool> done{false};
    std::thread runner([&] {
      job_status = MultiplyRegion(RegionRequest(job, "busy", 0, bytes));
      done = true;
    });
    bool in_use = false;
    while (!done && !in_use) {
      v1::GetRegionStatusResponse listed;
      if (RegionStatus("busy", &listed).ok() && listed.regions_size() == 1) {
        in_use = listed.regions(0).jobs_in_use() > 0;
      }
    }
    int unregistered = 0;
    ASSERT_TRUE(Unregister("busy", kToken1, &unregistered).ok());
    EXPECT_EQ(unregistered, 1);
    caught = in_use && !done;
    if (caught) {
      // The name is gone at once.
      v1::GetRegionStatusResponse listed;
      EXPECT_EQ(RegionStatus("busy", &listed).error_code(), grpc::StatusCode::NOT_FOUND);
    }
    runner.join();
    ASSERT_TRUE(job_status.ok()) << job_status.error_message();
    EXPECT_LE(MaxRelError(job, std::string(shm.data() + bytes, bytes)), 1e-14);
    // The memory goes once the job has ended.
    EXPECT_TRUE(WaitUntil([] { return RegisteredBytes() == 0; }, 5000));
  }
  EXPECT_TRUE(caught) << "no attempt unregistered the region while its job ran";
  std::printf("caught the job running after %d attempt(s)\n", attempts);
}

TEST_F(RegionsTest, ShrunkObjectFailsTheJobNotTheServer) {
  const RandomJob job = MakeJob(256, 256, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR,
                                v1::SIDE_LEFT, 31);
  const int64_t bytes = static_cast<int64_t>(job.matrix.size());
  ShmObject shm(2 * bytes);
  std::memcpy(shm.data(), job.matrix.data(), bytes);
  ASSERT_TRUE(RegisterShm("shrinking", shm).ok());
  ASSERT_TRUE(MultiplyRegion(RegionRequest(job, "shrinking", 0, bytes)).ok());
  shm.Shrink();  // from here on, do not touch shm.data()
  for (int i = 0; i < 2; ++i) {
    grpc::Status status = MultiplyRegion(RegionRequest(job, "shrinking", 0, bytes));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << i << ": " << status.error_message();
  }
  // In place too (the path that reads and writes the same pages).
  EXPECT_EQ(MultiplyRegion(RegionRequest(job, "shrinking", 0, 0)).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // The server lives and serves.
  ASSERT_EQ(waitpid(Server().pid(), nullptr, WNOHANG), 0) << "the server died";
  v1::MultiplyResponse response;
  grpc::Status status = Stub()->Multiply(Ctx().get(), [&] {
    v1::MultiplyRequest request;
    *request.mutable_header() = job.header;
    request.set_matrix(job.matrix);
    return request;
  }(), &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_LE(MaxRelError(job, response.result()), 1e-6);
  ASSERT_TRUE(Unregister("shrinking").ok());
}

// A shrink that the after-job size check finds (no SIGBUS: the object keeps
// part of its last page, so every access still lands) fails the job, and the
// region stays failed when the object grows back, until it is registered
// again.
TEST_F(RegionsTest, AFailedRegionStaysFailedUntilRegisteredAgain) {
  const RandomJob job = MakeJob(256, 256, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR,
                                v1::SIDE_RIGHT, 37);
  const int64_t bytes = static_cast<int64_t>(job.matrix.size());
  ShmObject shm(2 * bytes);
  std::memcpy(shm.data(), job.matrix.data(), bytes);
  ASSERT_TRUE(RegisterShm("size-checked", shm).ok());
  ASSERT_TRUE(MultiplyRegion(RegionRequest(job, "size-checked", 0, bytes)).ok());
  ASSERT_EQ(ftruncate(shm.fd(), 2 * bytes - 8), 0);
  grpc::Status status = MultiplyRegion(RegionRequest(job, "size-checked", 0, bytes));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("shrank below"), std::string::npos)
      << status.error_message();
  // Back to size: the region is still failed, before the job runs.
  ASSERT_EQ(ftruncate(shm.fd(), 2 * bytes), 0);
  std::memcpy(shm.data(), job.matrix.data(), bytes);
  const std::vector<char> poison(static_cast<size_t>(bytes), '\x7f');
  std::memcpy(shm.data() + bytes, poison.data(), poison.size());
  for (int i = 0; i < 2; ++i) {
    status = MultiplyRegion(RegionRequest(job, "size-checked", 0, bytes));
    EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
        << i << ": " << status.error_message();
    EXPECT_NE(status.error_message().find("registered again"), std::string::npos)
        << status.error_message();
  }
  EXPECT_EQ(std::memcmp(shm.data() + bytes, poison.data(), poison.size()), 0)
      << "a failed region's job wrote its result";
  // Registered again, it works.
  ASSERT_TRUE(Unregister("size-checked").ok());
  ASSERT_TRUE(RegisterShm("size-checked", shm).ok());
  ASSERT_TRUE(MultiplyRegion(RegionRequest(job, "size-checked", 0, bytes)).ok());
  EXPECT_LE(MaxRelError(job, std::string(shm.data() + bytes, static_cast<size_t>(bytes))), 1e-6);
  ASSERT_TRUE(Unregister("size-checked").ok());
}

// A region on a tmpfs with no room left: the server's first write to a
// page that does not exist yet raises SIGBUS with the object's size intact.
// The job fails saying the filesystem is full (not that it shrank).
TEST_F(RegionsTest, AFullFilesystemIsNamedAsSuch) {
  if (getuid() != 0) GTEST_SKIP() << "needs root: mounts a small tmpfs";
  char dir[] = "/tmp/dgmm-full-tmpfs-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  if (mount("tmpfs", dir, "tmpfs", 0, "size=1m") != 0) {
    rmdir(dir);
    GTEST_SKIP() << "cannot mount a tmpfs here: " << std::strerror(errno);
  }
  const RandomJob job = MakeJob(256, 256, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR,
                                v1::SIDE_LEFT, 41);
  const int64_t bytes = static_cast<int64_t>(job.matrix.size());  // 256 KiB
  const std::string region_path = std::string(dir) + "/region";
  const std::string filler_path = std::string(dir) + "/filler";
  const int fd = open(region_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 2 * bytes), 0);  // sparse: A is written, C is not
  ASSERT_EQ(pwrite(fd, job.matrix.data(), job.matrix.size(), 0), bytes);
  // Fill what is left of the tmpfs.
  const int filler = open(filler_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0600);
  ASSERT_GE(filler, 0);
  const std::vector<char> chunk(4096, 'f');
  while (write(filler, chunk.data(), chunk.size()) > 0) {
  }
  EXPECT_EQ(errno, ENOSPC);
  ASSERT_TRUE(Register(FdRequest("full", fd, 0, 2 * bytes)).ok());
  grpc::Status status = MultiplyRegion(RegionRequest(job, "full", 0, bytes));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("is full"), std::string::npos) << status.error_message();
  EXPECT_EQ(status.error_message().find("shrank"), std::string::npos) << status.error_message();
  // Room again does not revive it: registered again, it works.
  close(filler);
  unlink(filler_path.c_str());
  status = MultiplyRegion(RegionRequest(job, "full", 0, bytes));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  ASSERT_TRUE(Unregister("full").ok());
  ASSERT_TRUE(Register(FdRequest("full", fd, 0, 2 * bytes)).ok());
  ASSERT_TRUE(MultiplyRegion(RegionRequest(job, "full", 0, bytes)).ok());
  std::string c(static_cast<size_t>(bytes), '\0');
  ASSERT_EQ(pread(fd, c.data(), c.size(), bytes), bytes);
  EXPECT_LE(MaxRelError(job, c), 1e-6);
  ASSERT_TRUE(Unregister("full").ok());
  close(fd);
  ASSERT_EQ(waitpid(Server().pid(), nullptr, WNOHANG), 0) << "the server died";
  EXPECT_TRUE(WaitUntil([] { return RegisteredBytes() == 0; }, 5000));
  umount2(dir, MNT_DETACH);
  rmdir(dir);
}

TEST_F(RegionsTest, ClientThatExitsWithoutUnregisteringIsDropped) {
  ShmObject shm(1 << 20);
  // Everything the child needs is made before fork(): between fork() and
  // exec the child of this multi-threaded process may not allocate.
  const std::string address = Server().address();
  const std::string size = std::to_string(shm.size());
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // A fresh process image: gRPC must not be used across fork().
    execl("/proc/self/exe", "dgmm_regions_test", "--register-and-exit", address.c_str(),
          kToken1, shm.key().c_str(), "orphan", size.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int wstatus = 0;
  ASSERT_EQ(waitpid(child, &wstatus, 0), child);
  ASSERT_TRUE(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0) << wstatus;
  // The child's session closed when it exited: the server dropped its
  // region at once, though its object still exists.
  EXPECT_TRUE(WaitUntil([] { return RegisteredBytes() == 0; }, 5000))
      << "registered bytes: " << RegisteredBytes();
  v1::GetRegionStatusResponse listed;
  EXPECT_EQ(RegionStatus("orphan", &listed).error_code(), grpc::StatusCode::NOT_FOUND);
}

// --trusted_proxies does not name the owner of regions: that is the uid the
// local socket saw, whatever x-forwarded-for says (the fair share's use of
// the header is tested in tests/unit/call_context_test.cc).
TEST(RegionsTrustedProxyTest, ForwardedForDoesNotChangeTheOwnerOfRegions) {
  ServerProcess server({"--backend=cpu", "--threads=1", "--allow_regions",
                        "--max_regions_per_client=1", "--trusted_proxies=127.0.0.1, ::1"});
  std::unique_ptr<v1::Dgmm::Stub> stub = Connect(server.address());
  std::unique_ptr<SocketPeer> session = OpenSession(stub.get());
  ShmObject shm(4096);
  const auto register_as = [&](const std::string& name, const std::string& forwarded) {
    std::unique_ptr<grpc::ClientContext> ctx = Ctx("", session.get());
    ctx->AddMetadata("x-forwarded-for", forwarded);
    v1::RegisterRegionResponse response;
    return stub->RegisterRegion(ctx.get(), ShmRequest(name, shm, 0, 64, session.get()),
                                &response);
  };
  ASSERT_TRUE(register_as("a", "10.0.0.1, 192.168.0.1").ok());
  // Another forwarded address is the same uid: over its one region.
  EXPECT_EQ(register_as("b", "10.0.0.2").error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
}

TEST(RegionsOffTest, EveryRegionRpcIsFailedPrecondition) {
  ServerProcess off({"--backend=cpu", "--threads=1"});
  std::unique_ptr<v1::Dgmm::Stub> stub = Connect(off.address());
  v1::GetServerInfoResponse info = Info(stub.get());
  EXPECT_FALSE(info.limits().regions_enabled());
  ShmObject shm(4096);
  const auto ctx = [] { return Ctx(""); };
  v1::RegisterRegionResponse registered;
  EXPECT_EQ(stub->RegisterRegion(ctx().get(), ShmRequest("r", shm, 0, 4096), &registered)
                .error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::UnregisterRegionResponse unregistered;
  EXPECT_EQ(stub->UnregisterRegion(ctx().get(), v1::UnregisterRegionRequest(), &unregistered)
                .error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  v1::GetRegionStatusResponse listed;
  EXPECT_EQ(stub->GetRegionStatus(ctx().get(), v1::GetRegionStatusRequest(), &listed).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  const RandomJob job = MakeJob(4, 4, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1);
  v1::MultiplyRegionResponse multiplied;
  EXPECT_EQ(stub->MultiplyRegion(ctx().get(), RegionRequest(job, "r", 0, 64), &multiplied)
                .error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
}

TEST(RegionsIdleTest, AnIdleRegionIsDroppedAfterTheTimeout) {
  ServerProcess server({"--backend=cpu", "--threads=1", "--allow_regions",
                        "--region_idle_timeout_s=1"});
  std::unique_ptr<v1::Dgmm::Stub> stub = Connect(server.address());
  std::unique_ptr<SocketPeer> session = OpenSession(stub.get());
  ShmObject shm(1 << 16);
  v1::RegisterRegionResponse registered;
  grpc::Status status = stub->RegisterRegion(
      Ctx("", session.get()).get(), ShmRequest("idle", shm, 0, shm.size(), session.get()),
      &registered);
  ASSERT_TRUE(status.ok()) << status.error_message();
  const auto registered_bytes = [&] {
    v1::GetRegionStatusResponse listed;
    grpc::Status s = stub->GetRegionStatus(Ctx("", session.get()).get(),
                                           v1::GetRegionStatusRequest(), &listed);
    return s.ok() ? listed.registered_bytes() : -1;
  };
  EXPECT_EQ(registered_bytes(), shm.size());
  // Idle past 1 s, found by the sweep (every second): gone within 3 s.
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(WaitUntil([&] { return registered_bytes() == 0; }, 5000));
  EXPECT_GE(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(500));
  v1::GetRegionStatusRequest one;
  one.set_name("idle");
  v1::GetRegionStatusResponse listed;
  EXPECT_EQ(stub->GetRegionStatus(Ctx("", session.get()).get(), one, &listed).error_code(),
            grpc::StatusCode::NOT_FOUND);
}

TEST(RegionsInfoTest, LimitsReportTheFlags) {
  v1::GetServerInfoResponse info;
  ASSERT_TRUE(Stub()->GetServerInfo(Ctx().get(), v1::GetServerInfoRequest(), &info).ok());
  EXPECT_TRUE(info.limits().regions_enabled());
  EXPECT_EQ(info.limits().region_budget_bytes(), kBudget);
  EXPECT_EQ(info.limits().max_regions_per_client(), kMaxRegions);
  EXPECT_EQ(info.limits().region_idle_timeout_s(), 600);
  EXPECT_FALSE(info.limits().local_socket().empty());
  EXPECT_EQ(info.instance_id().size(), 32u);
}

// The child of ClientThatExitsWithoutUnregistering.
int RegisterAndExit(char** argv) {
  std::unique_ptr<v1::Dgmm::Stub> stub = Connect(argv[0]);
  std::unique_ptr<SocketPeer> session = OpenSession(stub.get());
  const int fd = shm_open(argv[2], O_RDWR, 0);
  if (fd < 0) _exit(2);
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", std::string("Bearer ") + argv[1]);
  ctx.AddMetadata("dgmm-session", session->session());
  v1::RegisterRegionResponse response;
  grpc::Status status = stub->RegisterRegion(
      &ctx, FdRequest(argv[3], fd, 0, std::atoll(argv[4]), session.get()), &response);
  if (!status.ok()) {
    std::fprintf(stderr, "child: RegisterRegion: %d %s\n", status.error_code(),
                 status.error_message().c_str());
    _exit(1);
  }
  _exit(0);  // no unregister, no cleanup
}

}  // namespace
}  // namespace dgmm::testing

int main(int argc, char** argv) {
  if (argc == 7 && std::string(argv[1]) == "--register-and-exit") {
    return dgmm::testing::RegisterAndExit(argv + 2);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
