// Process memory (docs/protocol.md "Process memory"): a real
// dgmm-server with --allow_regions on loopback (CPU backend), a raw client
// of its local socket (tests/support/local_peer.h) whose hello asks that its
// jobs may name this process's own memory, and MultiplyRegion through the
// generated stubs with RegionRef.process_address. Checks, against a
// float64 reference with results poisoned with NaN first: every dtype x
// layout x side, in place; every refusal of the hello (wrong, short or
// unreadable cookie, another uid, the server's --process_memory=false) with
// its reason; every bad job with its code (no grant, unreadable matrix,
// unwritable result, misaligned, overlapping, mixed with region names, a
// cookie changed after the hello); and that the server serves and holds
// nothing reserved after each.
#include <sys/mman.h>
#include <unistd.h>

#include <array>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/local_peer.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

using ::testing::HasSubstr;

ServerProcess& Server() {
  static ServerProcess server({"--backend=cpu", "--threads=2", "--allow_regions"});
  return server;
}

v1::Dgmm::Stub* Stub() {
  static std::unique_ptr<v1::Dgmm::Stub> stub = Connect(Server().address());
  return stub.get();
}

std::string SocketPath(v1::Dgmm::Stub* stub) { return Info(stub).limits().local_socket(); }

// A session whose hello asks for process memory, proving it with `cookie`
// read at `cookie_address` (the cookie's own bytes when 0).
struct Session {
  std::unique_ptr<SocketPeer> peer;
  v1::LocalHelloReply hello;
};

Session Hello(const std::string& path, const std::string& cookie, uint64_t cookie_address = 0,
              bool ask = true) {
  Session s;
  s.peer = std::make_unique<SocketPeer>(path);
  EXPECT_TRUE(s.peer->connected());
  v1::LocalHello h;
  if (ask) {
    h.set_process_memory(true);
    h.set_cookie(cookie);
    h.set_cookie_address(cookie_address != 0 ? cookie_address
                                             : reinterpret_cast<uint64_t>(cookie.data()));
  }
  std::optional<v1::LocalResponse> reply = s.peer->Hello(h);
  EXPECT_TRUE(reply.has_value() && reply->code() == 0);
  if (reply.has_value()) s.hello = reply->hello();
  return s;
}

// 32 random bytes, kept at a fixed address (the string's heap buffer) for
// as long as the session that names them.
std::string RandomCookie() {
  std::random_device random;
  std::string cookie(32, '\0');
  for (char& c : cookie) c = static_cast<char>(random());
  return cookie;
}

v1::RegionRef At(const void* p) {
  v1::RegionRef ref;
  ref.set_process_address(reinterpret_cast<uint64_t>(p));
  return ref;
}

grpc::Status Multiply(const Session& s, const v1::JobHeader& header, v1::RegionRef matrix,
                      v1::RegionRef result, v1::JobStats* stats = nullptr) {
  v1::MultiplyRegionRequest request;
  *request.mutable_header() = header;
  *request.mutable_matrix() = std::move(matrix);
  *request.mutable_result() = std::move(result);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  ctx.AddMetadata("dgmm-session", s.peer->session());
  v1::MultiplyRegionResponse response;
  grpc::Status status = Stub()->MultiplyRegion(&ctx, request, &response);
  if (stats != nullptr) *stats = response.stats();
  return status;
}

std::string Poisoned(size_t bytes, v1::DType dtype) {
  std::string out(bytes, '\0');
  if (dtype == v1::DTYPE_FLOAT64) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    for (size_t i = 0; i + 8 <= bytes; i += 8) std::memcpy(&out[i], &nan, 8);
  } else {
    const float nan = std::numeric_limits<float>::quiet_NaN();
    for (size_t i = 0; i + 4 <= bytes; i += 4) std::memcpy(&out[i], &nan, 4);
  }
  return out;
}

double Tolerance(v1::DType dtype) { return dtype == v1::DTYPE_FLOAT64 ? 1e-14 : 1e-6; }

class ProcessMemoryTest : public ::testing::Test {
 protected:
  void TearDown() override {
    EXPECT_TRUE(WaitUntil([] { return Reserved(Stub()) == 0; }, 5000)) << Reserved(Stub());
  }
  const std::string cookie_ = RandomCookie();
};

TEST_F(ProcessMemoryTest, JobsReadAndWriteTheCallersOwnMemory) {
  Session s = Hello(SocketPath(Stub()), cookie_);
  ASSERT_TRUE(s.hello.process_memory()) << s.hello.process_memory_refused();
  EXPECT_EQ(s.hello.process_memory_refused(), "");
  uint64_t seed = 3;
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
    for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
      for (v1::Side side : {v1::SIDE_RIGHT, v1::SIDE_LEFT}) {
        SCOPED_TRACE(v1::DType_Name(dtype) + " " + v1::Layout_Name(layout) + " " +
                     v1::Side_Name(side));
        // Large enough for several of the CPU backend's pieces per thread.
        const RandomJob job = MakeJob(701, 389, dtype, layout, side, seed++);
        const std::string a = job.matrix;
        std::string c = Poisoned(a.size(), dtype);
        v1::JobStats stats;
        grpc::Status st = Multiply(s, job.header, At(a.data()), At(c.data()), &stats);
        ASSERT_TRUE(st.ok()) << st.error_code() << ": " << st.error_message();
        EXPECT_LE(MaxRelError(job, c), Tolerance(dtype));
        EXPECT_EQ(a, job.matrix) << "A changed";
        EXPECT_EQ(stats.bytes_in(), static_cast<int64_t>(a.size()));
        EXPECT_EQ(stats.bytes_out(), static_cast<int64_t>(a.size()));
        // In place.
        std::string inplace = job.matrix;
        st = Multiply(s, job.header, At(inplace.data()), At(inplace.data()));
        ASSERT_TRUE(st.ok()) << st.error_message();
        EXPECT_LE(MaxRelError(job, inplace), Tolerance(dtype));
      }
    }
  }
}

TEST_F(ProcessMemoryTest, TheHelloIsRefusedWithItsReason) {
  const std::string path = SocketPath(Stub());
  // Not asked: not granted, no reason.
  Session plain = Hello(path, "", 0, /*ask=*/false);
  EXPECT_FALSE(plain.hello.process_memory());
  EXPECT_EQ(plain.hello.process_memory_refused(), "");
  // Other bytes at the cookie's address.
  const std::string other = RandomCookie();
  Session wrong = Hello(path, cookie_, reinterpret_cast<uint64_t>(other.data()));
  EXPECT_FALSE(wrong.hello.process_memory());
  EXPECT_THAT(wrong.hello.process_memory_refused(), HasSubstr("not the cookie"));
  // Too short to be unguessable.
  Session short_cookie = Hello(path, cookie_.substr(0, 8));
  EXPECT_FALSE(short_cookie.hello.process_memory());
  EXPECT_THAT(short_cookie.hello.process_memory_refused(), HasSubstr("16 to 64"));
  // An address with nothing mapped.
  void* hole = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  Session unreadable = Hello(path, cookie_, reinterpret_cast<uint64_t>(hole));
  EXPECT_FALSE(unreadable.hello.process_memory());
  EXPECT_THAT(unreadable.hello.process_memory_refused(), HasSubstr("could not be read"));
  munmap(hole, 4096);
  // Each of them still has a session, and a job naming process memory on
  // it is FAILED_PRECONDITION.
  const RandomJob job = MakeJob(40, 30, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 9);
  std::string c = Poisoned(job.matrix.size(), v1::DTYPE_FLOAT32);
  for (const Session* s : {&plain, &wrong, &short_cookie, &unreadable}) {
    grpc::Status st = Multiply(*s, job.header, At(job.matrix.data()), At(c.data()));
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr("LocalHello.process_memory"));
  }
  EXPECT_EQ(c, Poisoned(job.matrix.size(), v1::DTYPE_FLOAT32)) << "C written";
}

TEST_F(ProcessMemoryTest, ABadJobGetsItsCodeAndTheServerServesOn) {
  Session s = Hello(SocketPath(Stub()), cookie_);
  ASSERT_TRUE(s.hello.process_memory()) << s.hello.process_memory_refused();
  const RandomJob job =
      MakeJob(300, 200, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 11);
  const size_t bytes = job.matrix.size();
  std::string c = Poisoned(bytes, v1::DTYPE_FLOAT32);
  const auto expect = [&](grpc::Status st, grpc::StatusCode code, const std::string& text) {
    EXPECT_EQ(st.error_code(), code) << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr(text));
  };
  // A matrix the process cannot read: its second half in pages with no
  // access (all within this mapping, so no other buffer can lie there).
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t first = (bytes / 2 / page + 1) * page;  // readable
  const size_t span = first + (bytes / page + 1) * page;
  auto* area = static_cast<char*>(
      mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(area, MAP_FAILED);
  ASSERT_EQ(mprotect(area + first, span - first, PROT_NONE), 0);
  char* tail = area + first - bytes / 2;  // its second half is not readable
  std::memcpy(tail, job.matrix.data(), bytes / 2);
  expect(Multiply(s, job.header, At(tail), At(c.data())), grpc::StatusCode::INVALID_ARGUMENT,
         "cannot be read");
  // A result the process cannot write (the whole mapping read-only now).
  ASSERT_EQ(mprotect(area, span, PROT_READ), 0);
  expect(Multiply(s, job.header, At(job.matrix.data()), At(area)),
         grpc::StatusCode::INVALID_ARGUMENT, "cannot be written");
  munmap(area, span);
  // Nothing mapped at all.
  expect(Multiply(s, job.header, At(reinterpret_cast<void*>(4096)), At(c.data())),
         grpc::StatusCode::INVALID_ARGUMENT, "cannot be read");
  // Misaligned, wrapping, partly overlapping.
  expect(Multiply(s, job.header, At(job.matrix.data() + 2), At(c.data())),
         grpc::StatusCode::INVALID_ARGUMENT, "not aligned");
  v1::RegionRef end;
  end.set_process_address(std::numeric_limits<uint64_t>::max() - 7);
  expect(Multiply(s, job.header, At(job.matrix.data()), end), grpc::StatusCode::INVALID_ARGUMENT,
         "past the end");
  std::string both(2 * bytes, '\0');
  std::memcpy(both.data(), job.matrix.data(), bytes);
  expect(Multiply(s, job.header, At(both.data()), At(both.data() + 64)),
         grpc::StatusCode::INVALID_ARGUMENT, "partly overlaps");
  // Mixed with region names, or a diagonal region.
  v1::RegionRef named = At(c.data());
  named.set_name("r");
  expect(Multiply(s, job.header, At(job.matrix.data()), named), grpc::StatusCode::INVALID_ARGUMENT,
         "process_address alone");
  v1::RegionRef by_name;
  by_name.set_name("r");
  expect(Multiply(s, job.header, At(job.matrix.data()), by_name),
         grpc::StatusCode::INVALID_ARGUMENT, "process_address alone");
  {
    v1::MultiplyRegionRequest request;
    *request.mutable_header() = job.header;
    *request.mutable_matrix() = At(job.matrix.data());
    *request.mutable_result() = At(c.data());
    request.mutable_diagonal()->set_name("d");
    request.mutable_header()->clear_diagonal();
    grpc::ClientContext ctx;
    ctx.AddMetadata("dgmm-session", s.peer->session());
    v1::MultiplyRegionResponse response;
    expect(Stub()->MultiplyRegion(&ctx, request, &response), grpc::StatusCode::INVALID_ARGUMENT,
           "goes inline");
  }
  // The server serves this session on, right.
  grpc::Status st = Multiply(s, job.header, At(job.matrix.data()), At(c.data()));
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_LE(MaxRelError(job, c), Tolerance(v1::DTYPE_FLOAT32));
}

// A result whose first part is writable and whose tail is read-only, and a
// matrix whose tail is not mapped: refused before anything is written, so
// the writable part keeps its poison.
TEST_F(ProcessMemoryTest, AJobThatCannotFinishWritesNoneOfItsResult) {
  Session s = Hello(SocketPath(Stub()), cookie_);
  ASSERT_TRUE(s.hello.process_memory()) << s.hello.process_memory_refused();
  const RandomJob job =
      MakeJob(512, 384, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 13);
  const size_t bytes = job.matrix.size();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t span = (bytes / page + 2) * page;
  auto* area = static_cast<char*>(
      mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0));
  ASSERT_NE(area, MAP_FAILED);
  // C ends a page into the read-only part: all but its last page is writable.
  char* c = area + span - page - bytes + page;
  const std::string poison = Poisoned(bytes, v1::DTYPE_FLOAT32);
  std::memcpy(c, poison.data(), bytes);
  ASSERT_EQ(mprotect(area + span - page, page, PROT_READ), 0);
  grpc::Status st = Multiply(s, job.header, At(job.matrix.data()), At(c));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("cannot be written"));
  EXPECT_EQ(std::memcmp(c, poison.data(), bytes), 0) << "part of C was written: " << st.error_message();
  // A matrix whose tail is not mapped, with a result that is all writable.
  ASSERT_EQ(mprotect(area + span - page, page, PROT_READ | PROT_WRITE), 0);
  ASSERT_EQ(munmap(area + span - page, page), 0);
  char* a = area + span - page - bytes + 64;  // its last 64 bytes are unmapped
  std::memcpy(a, job.matrix.data(), bytes - 64);
  std::string out = poison;
  st = Multiply(s, job.header, At(a), At(out.data()));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("cannot be read"));
  EXPECT_EQ(out, poison) << "part of C was written";
  munmap(area, span - page);
  // The session serves on.
  st = Multiply(s, job.header, At(job.matrix.data()), At(out.data()));
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_LE(MaxRelError(job, out), Tolerance(v1::DTYPE_FLOAT32));
}

TEST_F(ProcessMemoryTest, ACookieChangedAfterTheHelloFailsTheJob) {
  std::string cookie = RandomCookie();
  Session s = Hello(SocketPath(Stub()), cookie);
  ASSERT_TRUE(s.hello.process_memory()) << s.hello.process_memory_refused();
  const RandomJob job = MakeJob(64, 64, v1::DTYPE_FLOAT64, v1::LAYOUT_COL_MAJOR, v1::SIDE_RIGHT, 5);
  std::string c = Poisoned(job.matrix.size(), v1::DTYPE_FLOAT64);
  ASSERT_TRUE(Multiply(s, job.header, At(job.matrix.data()), At(c.data())).ok());
  cookie[0] = static_cast<char>(cookie[0] ^ 1);
  c = Poisoned(job.matrix.size(), v1::DTYPE_FLOAT64);
  grpc::Status st = Multiply(s, job.header, At(job.matrix.data()), At(c.data()));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_THAT(st.error_message(), HasSubstr("cookie"));
  EXPECT_EQ(c, Poisoned(job.matrix.size(), v1::DTYPE_FLOAT64)) << "C written";
}

TEST(ProcessMemoryServerTest, OffOnTheServerIsRefusedWithTheFlagsName) {
  ServerProcess off({"--backend=cpu", "--threads=1", "--allow_regions", "--process_memory=false"});
  auto stub = Connect(off.address());
  const std::string cookie = RandomCookie();
  Session s = Hello(SocketPath(stub.get()), cookie);
  EXPECT_FALSE(s.hello.process_memory());
  EXPECT_THAT(s.hello.process_memory_refused(), HasSubstr("--process_memory=false"));
}

// In a child of this process that drops to `uid` (and the same gid): a
// hello asking for process memory, over `peer` (already connected by this
// process) or, when null, over a connection the child opens to `path`, with
// the cookie at `cookie`'s address. Returns "granted" or "refused: <why>",
// then " uid <the uid the server saw>"; "no child" when it could not run.
std::string HelloAsUid(uid_t uid, const std::string& path, SocketPeer* peer,
                       const std::string& cookie) {
  const ChildRun run = RunInChild([&] {
    if (setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0) _exit(126);
    std::optional<SocketPeer> own;
    if (peer == nullptr) peer = &own.emplace(path);
    v1::LocalRequest r;
    r.mutable_hello()->set_process_memory(true);
    r.mutable_hello()->set_cookie(cookie);
    r.mutable_hello()->set_cookie_address(reinterpret_cast<uint64_t>(cookie.data()));
    std::optional<v1::LocalResponse> reply = peer->Call(r);
    std::string said = !reply.has_value() ? "no reply"
                       : reply->hello().process_memory()
                           ? "granted"
                           : "refused: " + reply->hello().process_memory_refused();
    return said + " uid " + std::to_string(reply.has_value() ? reply->hello().uid() : -1);
  });
  return run.exited_ok ? run.said : "no child (wait status " + std::to_string(run.wait_status) + ")";
}

// A process of another uid (the server runs as root here) is refused: the
// server would read its memory with more rights than it has.
TEST(ProcessMemoryServerTest, AnotherUidIsRefused) {
  if (getuid() != 0) GTEST_SKIP() << "needs root: the client runs as another uid";
  const std::string said = HelloAsUid(65534, SocketPath(Stub()), nullptr, std::string(32, 'k'));
  EXPECT_THAT(said, HasSubstr("refused"));
  EXPECT_THAT(said, HasSubstr("uid 65534 is not the server's"));
}

// The grant is checked against the process that sends the hello, not the
// one that connected: a root process connects, forks, and its child drops to
// another uid and says hello with a cookie that both of them hold (the same
// address after the fork). It must be refused, not granted the parent's
// memory.
TEST(ProcessMemoryServerTest, AChildOfAnotherUidOnItsParentsConnectionIsRefused) {
  if (getuid() != 0) GTEST_SKIP() << "needs root: the child drops to another uid";
  const std::string path = SocketPath(Stub());
  const std::string cookie = RandomCookie();
  SocketPeer peer(path);  // connected by root
  ASSERT_TRUE(peer.connected());
  const std::string said = HelloAsUid(65533, path, &peer, cookie);
  EXPECT_THAT(said, HasSubstr("refused"));
  EXPECT_THAT(said, HasSubstr("uid 65533 is not the server's"));
  EXPECT_THAT(said, HasSubstr("uid 65533"));
}

}  // namespace
}  // namespace dgmm::testing
