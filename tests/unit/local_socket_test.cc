// The server's local socket (service/regions/local_socket.h) through a real
// Unix socket: hello and credentials, descriptors passed for tickets, and
// every way a client can get the protocol wrong.
#include "service/regions/local_socket.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/support/local_peer.h"

namespace dgmm {
namespace {

using Peer = testing::SocketPeer;

class LocalSocketTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/dgmm-local-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    options_.path = dir_ + "/s.sock";
    options_.instance_id = "test-instance";
    options_.max_tickets_per_connection = 3;
    options_.ticket_timeout = absl::Seconds(30);
    options_.hello_timeout = absl::Milliseconds(300);
  }
  void TearDown() override {
    socket_.reset();
    rmdir(dir_.c_str());
  }
  void Start() {
    auto s = LocalSocket::Start(options_, [this](uint64_t id) {
      closed_.fetch_add(1);
      last_closed_ = id;
    });
    ASSERT_TRUE(s.ok()) << s.status();
    socket_ = std::move(*s);
  }
  static int Memory(int64_t bytes) {
    const int fd = memfd_create("dgmm-test", MFD_CLOEXEC);
    EXPECT_EQ(ftruncate(fd, bytes), 0);
    return fd;
  }
  // Waits up to 5 s for `done`.
  template <typename F>
  static bool Eventually(F done) {
    for (int i = 0; i < 500; ++i) {
      if (done()) return true;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return done();
  }

  std::string dir_;
  LocalSocketOptions options_;
  std::unique_ptr<LocalSocket> socket_;
  std::atomic<int> closed_{0};
  std::atomic<uint64_t> last_closed_{0};
};

TEST_F(LocalSocketTest, HelloGivesASessionWithTheKernelsCredentials) {
  Start();
  struct stat st;
  ASSERT_EQ(stat(options_.path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);
  Peer peer(options_.path);
  ASSERT_TRUE(peer.connected());
  auto hello = peer.Hello();
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(hello->code(), 0);
  EXPECT_EQ(hello->hello().uid(), getuid());
  EXPECT_EQ(hello->hello().pid(), getpid());
  EXPECT_EQ(hello->hello().instance_id(), "test-instance");
  EXPECT_EQ(hello->hello().session().size(), 64u);
  auto found = socket_->FindSession(hello->hello().session());
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(found->uid, getuid());
  EXPECT_EQ(socket_->FindSession("not-a-session").status().code(),
            absl::StatusCode::kUnauthenticated);
  // A second hello breaks the protocol: the connection ends, so does the session.
  EXPECT_FALSE(peer.Hello().has_value());
  EXPECT_TRUE(Eventually([&] { return closed_.load() == 1; }));
  EXPECT_EQ(last_closed_.load(), found->session_id);
  EXPECT_EQ(socket_->FindSession(hello->hello().session()).status().code(),
            absl::StatusCode::kUnauthenticated);
}

// The session is the process's that says hello, not the one that
// connected: a child that says hello on its parent's connection gets its own
// pid (and so, with process memory, its own memory).
TEST_F(LocalSocketTest, TheHelloSendersCredentialsNotTheConnectors) {
  Start();
  Peer peer(options_.path);
  ASSERT_TRUE(peer.connected());
  const testing::ChildRun run = testing::RunInChild([&] {
    auto hello = peer.Hello();
    return hello.has_value() ? hello->SerializeAsString() : std::string();
  });
  ASSERT_TRUE(run.exited_ok) << run.wait_status;
  const pid_t child = run.pid;
  v1::LocalResponse hello;
  ASSERT_TRUE(!run.said.empty() && hello.ParseFromString(run.said));
  EXPECT_EQ(hello.hello().pid(), child) << "the connector's pid is " << getpid();
  auto found = socket_->FindSession(hello.hello().session());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->pid, child);
}

TEST_F(LocalSocketTest, APassFdWithTwoDescriptorsIsRefusedAtOnce) {
  Start();
  Peer peer(options_.path);
  ASSERT_TRUE(peer.Hello().has_value());
  const int a = Memory(4096), b = Memory(4096);
  v1::LocalRequest r;
  r.mutable_pass_fd()->set_kind(v1::LOCAL_FD_KIND_MEMORY);
  auto reply = peer.Call(r, {a, b});
  ASSERT_TRUE(reply.has_value()) << "refused with a reply, not a closed connection";
  EXPECT_EQ(reply->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(reply->message().find("exactly one descriptor; 2 came"), std::string::npos)
      << reply->message();
  EXPECT_FALSE(reply->has_ticket());
  EXPECT_EQ(socket_->tickets(), 0);
  // The connection serves on.
  reply = peer.Pass(a);
  ASSERT_TRUE(reply.has_value());
  EXPECT_EQ(reply->code(), 0) << reply->message();
  close(a);
  close(b);
}

TEST_F(LocalSocketTest, ACudaVmmPassFdIsRefusedAtOnceForWhatCannotBeOne) {
  const auto pass_vmm = [](Peer& peer, int fd) {
    v1::LocalRequest r;
    r.mutable_pass_fd()->set_kind(v1::LOCAL_FD_KIND_CUDA_VMM);
    r.mutable_pass_fd()->set_device(0);
    r.mutable_pass_fd()->set_allocation_bytes(2 << 20);
    return peer.Call(r, {fd});
  };
  const int mem = Memory(2 << 20);
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  {  // a server with no GPU in use
    Start();
    Peer peer(options_.path);
    ASSERT_TRUE(peer.Hello().has_value());
    auto reply = pass_vmm(peer, mem);
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
    EXPECT_NE(reply->message().find("no GPU"), std::string::npos) << reply->message();
    socket_.reset();
  }
  options_.cuda_vmm = true;  // a GPU server: the descriptor's type is checked
  Start();
  Peer peer(options_.path);
  ASSERT_TRUE(peer.Hello().has_value());
  for (const auto& [fd, what] : {std::pair{mem, "memfd"}, std::pair{p[0], "a pipe"}}) {
    auto reply = pass_vmm(peer, fd);
    ASSERT_TRUE(reply.has_value());
    EXPECT_EQ(reply->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
    EXPECT_NE(reply->message().find(what), std::string::npos) << reply->message();
    EXPECT_NE(reply->message().find("not a CUDA allocation"), std::string::npos);
  }
  EXPECT_EQ(socket_->tickets(), 0);
  close(mem);
  close(p[0]);
  close(p[1]);
}

TEST_F(LocalSocketTest, ATicketIsUsedOnceBySessionThatGotIt) {
  Start();
  Peer a(options_.path), b(options_.path);
  auto ha = a.Hello(), hb = b.Hello();
  ASSERT_TRUE(ha.has_value() && hb.has_value());
  const uint64_t sa = socket_->FindSession(ha->hello().session())->session_id;
  const uint64_t sb = socket_->FindSession(hb->hello().session())->session_id;
  const int mem = Memory(8192);
  auto t = a.Pass(mem);
  close(mem);  // closed early by the client: the server holds its own copy
  ASSERT_TRUE(t.has_value());
  ASSERT_EQ(t->code(), 0) << t->message();
  EXPECT_EQ(t->ticket().object_bytes(), 8192);
  EXPECT_FALSE(t->ticket().sealed());
  // Another session cannot take it, and that does not use it up.
  EXPECT_EQ(socket_->TakeTicket(sb, t->ticket().ticket()).status().code(),
            absl::StatusCode::kNotFound);
  auto taken = socket_->TakeTicket(sa, t->ticket().ticket());
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->object_bytes, 8192);
  EXPECT_EQ(lseek(taken->fd.get(), 0, SEEK_END), 8192);  // the same memory
  EXPECT_EQ(socket_->TakeTicket(sa, t->ticket().ticket()).status().code(),
            absl::StatusCode::kNotFound);  // reused
  EXPECT_EQ(socket_->tickets(), 0);
}

TEST_F(LocalSocketTest, NonMemoryDescriptorsAreRefusedClearly) {
  Start();
  Peer peer(options_.path);
  ASSERT_TRUE(peer.Hello().has_value());
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  auto r = peer.Pass(p[0]);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_NE(r->message().find("a pipe"), std::string::npos) << r->message();
  close(p[0]);
  close(p[1]);
  const int dir = open("/", O_RDONLY | O_DIRECTORY);
  r = peer.Pass(dir);
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->message().find("a directory"), std::string::npos) << r->message();
  close(dir);
  r = peer.Pass(peer.connected() ? open("/dev/null", O_RDWR) : -1);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  // The connection is still good for memory.
  const int mem = Memory(4096);
  r = peer.Pass(mem);
  close(mem);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->code(), 0) << r->message();
}

TEST_F(LocalSocketTest, UnclaimedTicketsAreBoundedAndExpire) {
  options_.ticket_timeout = absl::Milliseconds(200);
  Start();
  Peer peer(options_.path);
  auto hello = peer.Hello();
  ASSERT_TRUE(hello.has_value());
  const uint64_t session = socket_->FindSession(hello->hello().session())->session_id;
  const int mem = Memory(4096);
  std::vector<std::string> tickets;
  for (int i = 0; i < 3; ++i) {
    auto t = peer.Pass(mem);
    ASSERT_TRUE(t.has_value());
    ASSERT_EQ(t->code(), 0);
    tickets.push_back(t->ticket().ticket());
  }
  auto over = peer.Pass(mem);  // a flood: the fourth is refused, the connection lives
  ASSERT_TRUE(over.has_value());
  EXPECT_EQ(over->code(), static_cast<int>(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(socket_->tickets(), 3);
  // Expired: not usable, and dropped (their descriptors closed) by the sweep.
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(socket_->TakeTicket(session, tickets[0]).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(Eventually([&] { return socket_->tickets() == 0; }));
  auto again = peer.Pass(mem);  // room again
  close(mem);
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->code(), 0);
}

TEST_F(LocalSocketTest, ClosingTheConnectionEndsTheSessionAndItsTickets) {
  Start();
  auto peer = std::make_unique<Peer>(options_.path);
  auto hello = peer->Hello();
  ASSERT_TRUE(hello.has_value());
  const int mem = Memory(4096);
  ASSERT_TRUE(peer->Pass(mem).has_value());
  close(mem);
  EXPECT_EQ(socket_->tickets(), 1);
  peer.reset();
  EXPECT_TRUE(Eventually([&] { return closed_.load() == 1 && socket_->tickets() == 0; }));
  EXPECT_FALSE(socket_->FindSession(hello->hello().session()).ok());
}

TEST_F(LocalSocketTest, ProtocolErrorsCloseTheConnection) {
  Start();
  const int mem = Memory(4096);
  {  // a request before hello
    Peer peer(options_.path);
    v1::LocalRequest r;
    r.mutable_pass_fd()->set_kind(v1::LOCAL_FD_KIND_MEMORY);
    EXPECT_FALSE(peer.Call(r, {mem}).has_value());
  }
  {  // a frame over 4096 bytes
    Peer peer(options_.path);
    ASSERT_TRUE(peer.Hello().has_value());
    EXPECT_TRUE(peer.Send(std::string("\xff\xff\x00\x00", 4)));
    EXPECT_TRUE(peer.ClosedByServer());
  }
  {  // bytes that do not parse
    Peer peer(options_.path);
    ASSERT_TRUE(peer.Hello().has_value());
    EXPECT_TRUE(peer.Send(std::string("\x03\x00\x00\x00\xff\xff\xff", 7)));
    EXPECT_TRUE(peer.ClosedByServer());
  }
  {  // a descriptor with a hello, not a pass_fd
    Peer peer(options_.path);
    ASSERT_TRUE(peer.Hello().has_value());
    v1::LocalRequest r;
    r.mutable_open_shm()->set_key("/dgmm-none");
    EXPECT_TRUE(peer.Send(testing::SocketPeer::Frame(r), {mem}));
    auto reply = peer.Read();  // the open_shm is answered...
    EXPECT_TRUE(reply.has_value());
    EXPECT_TRUE(peer.ClosedByServer());  // ...then the stray descriptor ends it
  }
  {  // a pass_fd without its descriptor
    Peer peer(options_.path);
    ASSERT_TRUE(peer.Hello().has_value());
    v1::LocalRequest r;
    r.mutable_pass_fd()->set_kind(v1::LOCAL_FD_KIND_MEMORY);
    EXPECT_FALSE(peer.Call(r).has_value());
  }
  {  // no hello in time
    Peer peer(options_.path);
    EXPECT_TRUE(peer.ClosedByServer());
  }
  close(mem);
  EXPECT_TRUE(Eventually([&] { return socket_->connections() == 0; }));
  // The socket still serves.
  Peer fine(options_.path);
  EXPECT_TRUE(fine.Hello().has_value());
}

TEST_F(LocalSocketTest, OpenShmOnlyForTheOwnerOfAnObjectNobodyElseWrites) {
  Start();
  Peer peer(options_.path);
  ASSERT_TRUE(peer.Hello().has_value());
  const std::string key = absl::StrCat("/dgmm-local-test-", getpid());
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 4096), 0);
  v1::LocalRequest r;
  r.mutable_open_shm()->set_key(key);
  auto ok = peer.Call(r);
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->code(), 0) << ok->message();
  EXPECT_EQ(ok->ticket().object_bytes(), 4096);
  ASSERT_EQ(fchmod(fd, 0666), 0);  // world-writable: not the caller's alone
  auto open_to_all = peer.Call(r);
  ASSERT_TRUE(open_to_all.has_value());
  EXPECT_EQ(open_to_all->code(), static_cast<int>(absl::StatusCode::kPermissionDenied));
  close(fd);
  shm_unlink(key.c_str());
  auto missing = peer.Call(r);
  ASSERT_TRUE(missing.has_value());
  EXPECT_EQ(missing->code(), static_cast<int>(absl::StatusCode::kNotFound));
  r.mutable_open_shm()->set_key("/../etc/passwd");
  auto bad = peer.Call(r);
  ASSERT_TRUE(bad.has_value());
  EXPECT_EQ(bad->code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
}

TEST_F(LocalSocketTest, ALiveSocketIsNotTakenOverAStaleOneIs) {
  Start();
  auto second = LocalSocket::Start(options_, nullptr);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
  socket_.reset();  // removes its file
  // A stale socket file (its server died): replaced.
  const int stale = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, options_.path.c_str(), sizeof addr.sun_path - 1);
  ASSERT_EQ(bind(stale, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  close(stale);
  Start();
  Peer peer(options_.path);
  EXPECT_TRUE(peer.Hello().has_value());
}

}  // namespace
}  // namespace dgmm
