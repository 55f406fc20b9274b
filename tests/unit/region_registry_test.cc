// RegionRegistry and SigbusGuard without gRPC: real memfds, checked and
// mapped as the server maps what a client passes through its local socket.
#include "service/regions/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/regions/sigbus_guard.h"

namespace dgmm {
namespace {

// A memfd the test owns.
class Memfd {
 public:
  explicit Memfd(int64_t bytes, bool seal = false) {
    fd_ = memfd_create("dgmm-unit", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, bytes), 0);
    if (seal) {
      EXPECT_EQ(fcntl(fd_, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW), 0);
    }
  }
  ~Memfd() { close(fd_); }
  int fd() const { return fd_; }
  int Truncate(int64_t bytes) { return ftruncate(fd_, bytes); }

 private:
  int fd_ = -1;
};

// What the local socket would hand the registry for `fd` (a copy of it).
PassedMemory Passed(int fd) {
  PassedMemory m;
  m.kind = v1::LOCAL_FD_KIND_MEMORY;
  const absl::Status checked = CheckMemoryFd(fd, &m);
  EXPECT_TRUE(checked.ok()) << checked;
  m.fd = OwnedFd(fcntl(fd, F_DUPFD_CLOEXEC, 0));
  return m;
}

v1::RegisterRegionRequest Local(const std::string& name, int64_t offset, int64_t bytes,
                                const std::string& ticket = "t") {
  v1::RegisterRegionRequest r;
  r.set_name(name);
  r.mutable_local_fd()->set_ticket(ticket);
  r.mutable_local_fd()->set_offset(offset);
  r.mutable_local_fd()->set_byte_size(bytes);
  return r;
}

RegionRegistry::Caller CallerOf(const std::string& owner, uint64_t session = 1,
                                uid_t uid = 1000) {
  RegionRegistry::Caller c;
  c.owner = owner;
  c.peer.session_id = session;
  c.peer.uid = uid;
  return c;
}

// Registers `fd`'s memory, as if its ticket had been passed.
absl::StatusOr<v1::RegionStatus> Register(RegionRegistry& reg, const std::string& owner,
                                          const v1::RegisterRegionRequest& request, int fd,
                                          uint64_t session = 1, uid_t uid = 1000) {
  return reg.Register(CallerOf(owner, session, uid), request,
                      [fd](absl::string_view) -> absl::StatusOr<PassedMemory> {
                        return Passed(fd);
                      });
}

RegionOptions Enabled(int64_t budget = int64_t{1} << 30) {
  RegionOptions o;
  o.enabled = true;
  o.budget_bytes = budget;
  o.max_per_client = 4;
  o.sweep_interval = absl::Hours(1);  // the tests call Sweep themselves
  return o;
}

TEST(RegionRegistryTest, MapsTheMemoryPassedAndReleasesItsBytes) {
  Memfd mem(1 << 16);
  RegionRegistry reg(Enabled(), {});
  auto st = Register(reg, "alice", Local("a", 4096, 8192), mem.fd());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->byte_size(), 8192);
  EXPECT_EQ(st->owner_uid(), 1000);
  EXPECT_FALSE(st->pinned());  // no GPU ops given
  EXPECT_FALSE(st->sealed());
  EXPECT_EQ(reg.registered_bytes(), 8192);
  auto r = reg.Find("alice", "a");
  ASSERT_TRUE(r.ok());
  // The mapping is the memfd: bytes written through it are there.
  std::memset((*r)->data(), 0x5a, 8192);
  char seen[2] = {};
  ASSERT_EQ(pread(mem.fd(), seen, 2, 4096 + 8190), 2);
  EXPECT_EQ(seen[0], 0x5a);
  EXPECT_EQ(seen[1], 0x5a);
  EXPECT_TRUE((*r)->CheckIntact().ok());
  EXPECT_EQ(reg.Find("bob", "a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*reg.Unregister("alice", "a"), 1);
  EXPECT_EQ(reg.registered_bytes(), 8192);  // still held by `r`, like a running job
  r->reset();
  EXPECT_EQ(reg.registered_bytes(), 0);
}

// INVALID_ARGUMENT for the name, the kind, the range and overflow comes
// before the budget is counted.
TEST(RegionRegistryTest, ArgumentsAreCheckedBeforeTheTicketAndTheBudget) {
  Memfd mem(4096);
  RegionRegistry reg(Enabled(10000), {});
  int taken = 0;
  auto code = [&](const v1::RegisterRegionRequest& r) {
    return reg
        .Register(CallerOf("c"), r,
                  [&](absl::string_view) -> absl::StatusOr<PassedMemory> {
                    ++taken;
                    return Passed(mem.fd());
                  })
        .status()
        .code();
  };
  using C = absl::StatusCode;
  const int64_t huge = int64_t{8} << 30;  // far over the budget
  EXPECT_EQ(code(Local("", 0, huge)), C::kInvalidArgument);
  EXPECT_EQ(code(Local("a/b", 0, huge)), C::kInvalidArgument);
  EXPECT_EQ(code(Local("a", -1, huge)), C::kInvalidArgument);
  EXPECT_EQ(code(Local("a", 0, 0)), C::kInvalidArgument);
  EXPECT_EQ(code(Local("a", INT64_MAX - 8, huge)), C::kInvalidArgument);  // overflow
  EXPECT_EQ(code(Local("a", 0, huge, /*ticket=*/"")), C::kInvalidArgument);
  v1::RegisterRegionRequest by_key;
  by_key.set_name("a");
  by_key.mutable_system_shm()->set_key("/victim");
  by_key.mutable_system_shm()->set_byte_size(huge);
  EXPECT_EQ(code(by_key), C::kInvalidArgument);  // removed
  EXPECT_EQ(code(v1::RegisterRegionRequest()), C::kInvalidArgument);
  v1::RegisterRegionRequest ipc;
  ipc.set_name("g");
  ipc.mutable_cuda_ipc()->set_handle("short");
  ipc.mutable_cuda_ipc()->set_byte_size(huge);
  EXPECT_EQ(code(ipc), C::kInvalidArgument);
  EXPECT_EQ(taken, 5);  // the bad requests' tickets are used up, not left to pile up
  // Past the end of the memory: after the ticket, before the budget.
  EXPECT_EQ(code(Local("a", 4000, 97)), C::kInvalidArgument);
  EXPECT_EQ(code(Local("a", 0, huge)), C::kInvalidArgument);
  EXPECT_EQ(taken, 7);
  ipc.mutable_cuda_ipc()->set_handle(std::string(64, 'x'));
  ipc.mutable_cuda_ipc()->set_byte_size(16);
  EXPECT_EQ(code(ipc), C::kFailedPrecondition);  // no GPU
}

TEST(RegionRegistryTest, TicketsBudgetNamesAndCounts) {
  Memfd mem(1 << 20);
  RegionRegistry reg(Enabled(10000), {});
  using C = absl::StatusCode;
  const auto no_ticket = [](absl::string_view) -> absl::StatusOr<PassedMemory> {
    return absl::NotFoundError("no such ticket");
  };
  EXPECT_EQ(reg.Register(CallerOf("c"), Local("a", 0, 16), no_ticket).status().code(),
            C::kNotFound);
  EXPECT_EQ(Register(reg, "c", Local("a", 0, 20000), mem.fd()).status().code(),
            C::kResourceExhausted);  // over the budget
  ASSERT_TRUE(Register(reg, "c", Local("a", 0, 16), mem.fd()).ok());
  EXPECT_EQ(Register(reg, "c", Local("a", 0, 16), mem.fd()).status().code(), C::kAlreadyExists);
  for (int i = 1; i < 4; ++i) {
    ASSERT_TRUE(Register(reg, "c", Local(absl::StrCat("n", i), 0, 16), mem.fd()).ok());
  }
  EXPECT_EQ(Register(reg, "c", Local("n9", 0, 16), mem.fd()).status().code(),
            C::kResourceExhausted);                                    // max_per_client 4
  EXPECT_TRUE(Register(reg, "other", Local("n9", 0, 16), mem.fd()).ok());  // per owner
  EXPECT_EQ(reg.registered_bytes(), 5 * 16);
  EXPECT_EQ(*reg.Unregister("c", ""), 4);
  EXPECT_EQ(reg.registered_bytes(), 16);
}

TEST(RegionRegistryTest, ShrunkUnsealedMemoryIsAbsorbedNotFatal) {
  const long page = sysconf(_SC_PAGESIZE);
  Memfd mem(4 * page);
  RegionRegistry reg(Enabled(), {});
  ASSERT_TRUE(Register(reg, "c", Local("a", 0, 4 * page), mem.fd()).ok());
  auto r = reg.Find("c", "a");
  ASSERT_TRUE(r.ok());
  std::memset((*r)->data(), 1, 4 * page);
  const long before = SigbusGuard::absorbed();
  ASSERT_EQ(mem.Truncate(0), 0);
  // Without the guard this read is a SIGBUS that kills the process.
  volatile std::byte* p = (*r)->data() + 2 * page;
  const std::byte seen = *p;
  EXPECT_EQ(seen, std::byte{0});
  EXPECT_EQ(SigbusGuard::absorbed(), before + 1);
  const absl::Status intact = (*r)->CheckIntact();
  EXPECT_EQ(intact.code(), absl::StatusCode::kFailedPrecondition) << intact;
}

TEST(RegionRegistryTest, ShrinkSeenBySizeEvenWithoutAFault) {
  Memfd mem(8192);
  RegionRegistry reg(Enabled(), {});
  ASSERT_TRUE(Register(reg, "c", Local("a", 0, 8192), mem.fd()).ok());
  ASSERT_EQ(mem.Truncate(4096), 0);
  auto r = reg.Find("c", "a");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->CheckIntact().code(), absl::StatusCode::kFailedPrecondition);
  // Back to its size, the region stays failed until it is registered again.
  ASSERT_EQ(mem.Truncate(8192), 0);
  EXPECT_EQ((*r)->CheckIntact().code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status usable = (*r)->Usable();
  EXPECT_EQ(usable.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(usable.message().find("registered again"), std::string::npos) << usable;
  ASSERT_EQ(*reg.Unregister("c", "a"), 1);
  ASSERT_TRUE(Register(reg, "c", Local("a", 0, 8192), mem.fd()).ok());
  r = reg.Find("c", "a");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE((*r)->Usable().ok());
  EXPECT_TRUE((*r)->CheckIntact().ok());
}

// No uid can hold the whole budget: a sparse memfd of the budget's size
// from one uid is refused beyond its share, and another uid's small region
// still fits.
TEST(RegionRegistryTest, OneUidsRegionsDoNotShutAnotherOut) {
  Memfd sparse(10000);
  Memfd small(4096);
  RegionOptions options = Enabled(10000);
  options.max_uid_share_percent = 50;
  {
    RegionRegistry reg(options, {});
    auto whole = Register(reg, "a", Local("whole", 0, 10000), sparse.fd(), 1, 1000);
    EXPECT_EQ(whole.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(whole.status().message().find("uid 1000's share"), std::string::npos)
        << whole.status();
    ASSERT_TRUE(Register(reg, "a", Local("half", 0, 5000), sparse.fd(), 1, 1000).ok());
    // The same uid under another owner (another bearer token) shares the cap.
    EXPECT_EQ(Register(reg, "a2", Local("more", 0, 16), sparse.fd(), 2, 1000).status().code(),
              absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(Register(reg, "b", Local("small", 0, 4096), small.fd(), 3, 1001).ok());
    EXPECT_EQ(reg.registered_bytes(), 5000 + 4096);
    // Its bytes come back to the uid when its regions go.
    EXPECT_EQ(*reg.Unregister("a", ""), 1);
    EXPECT_TRUE(Register(reg, "a", Local("again", 0, 5000), sparse.fd(), 1, 1000).ok());
  }
  {  // --max_region_share_percent=100: one uid may take it all, and then
     // nobody else has room (what the share prevents).
    options.max_uid_share_percent = 100;
    RegionRegistry reg(options, {});
    ASSERT_TRUE(Register(reg, "a", Local("whole", 0, 10000), sparse.fd(), 1, 1000).ok());
    EXPECT_EQ(Register(reg, "b", Local("small", 0, 4096), small.fd(), 3, 1001).status().code(),
              absl::StatusCode::kResourceExhausted);
  }
}

TEST(RegionRegistryTest, SealedMemoryCannotShrinkUnderTheServer) {
  Memfd mem(8192, /*seal=*/true);
  RegionRegistry reg(Enabled(), {});
  auto st = Register(reg, "c", Local("a", 0, 8192), mem.fd());
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_TRUE(st->sealed());
  auto r = reg.Find("c", "a");
  std::memset((*r)->data(), 7, 8192);
  errno = 0;
  EXPECT_EQ(mem.Truncate(0), -1);  // the client cannot shrink it
  EXPECT_EQ(errno, EPERM);
  EXPECT_TRUE((*r)->CheckIntact().ok());
  EXPECT_EQ(static_cast<int>((*r)->data()[8191]), 7);
}

TEST(RegionRegistryTest, OnlyMemoryDescriptorsPass) {
  PassedMemory m;
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  EXPECT_EQ(CheckMemoryFd(p[0], &m).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(CheckMemoryFd(p[0], &m).message().find("pipe"), std::string::npos);
  close(p[0]);
  close(p[1]);
  int s[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, s), 0);
  EXPECT_NE(CheckMemoryFd(s[0], &m).message().find("socket"), std::string::npos);
  close(s[0]);
  close(s[1]);
  const int dir = open("/", O_RDONLY | O_DIRECTORY);
  EXPECT_NE(CheckMemoryFd(dir, &m).message().find("directory"), std::string::npos);
  close(dir);
  const int dev = open("/dev/zero", O_RDWR);
  EXPECT_EQ(CheckMemoryFd(dev, &m).code(), absl::StatusCode::kInvalidArgument);
  close(dev);
  // A regular file on disk (the test's working directory, unless tmpfs).
  const std::string path = absl::StrCat("dgmm-unit-file-", getpid());
  const int file = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(file, 0);
  unlink(path.c_str());
  struct statfs fs;
  ASSERT_EQ(fstatfs(file, &fs), 0);
  if (fs.f_type != 0x01021994) {  // TMPFS_MAGIC
    EXPECT_NE(CheckMemoryFd(file, &m).message().find("not memory"), std::string::npos)
        << CheckMemoryFd(file, &m);
  }
  close(file);
  // Memory opened read-only, or sealed against writes.
  Memfd mem(4096);
  const int ro = open(absl::StrCat("/proc/self/fd/", mem.fd()).c_str(), O_RDONLY);
  ASSERT_GE(ro, 0);
  EXPECT_NE(CheckMemoryFd(ro, &m).message().find("reading and writing"), std::string::npos);
  close(ro);
  Memfd sealed(4096);
  ASSERT_EQ(fcntl(sealed.fd(), F_ADD_SEALS, F_SEAL_WRITE), 0);
  EXPECT_EQ(CheckMemoryFd(sealed.fd(), &m).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckMemoryFd(mem.fd(), &m).ok());
  EXPECT_EQ(m.object_bytes, 4096);
}

TEST(RegionRegistryTest, SweepDropsIdleRegionsNotUsedOnes) {
  Memfd idle(4096), busy(4096);
  RegionOptions o = Enabled();
  o.idle_timeout = absl::Seconds(30);
  RegionRegistry reg(o, {});
  ASSERT_TRUE(Register(reg, "c", Local("idle", 0, 4096), idle.fd()).ok());
  ASSERT_TRUE(Register(reg, "c", Local("busy", 0, 4096), busy.fd()).ok());
  {
    Region::Use use(*reg.Find("c", "busy"));  // a job is using it
    reg.Sweep(absl::Now());
    EXPECT_TRUE(reg.Find("c", "busy").ok());
    EXPECT_TRUE(reg.Find("c", "idle").ok());
    reg.Sweep(absl::Now() + absl::Minutes(1));  // idle past the timeout; busy still used
    EXPECT_EQ(reg.Find("c", "idle").status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(reg.Find("c", "busy").ok());
  }
  reg.Sweep(absl::Now() + absl::Minutes(1));
  EXPECT_EQ(reg.count(), 0);
  EXPECT_EQ(reg.registered_bytes(), 0);
}

TEST(RegionRegistryTest, ClosedSessionTakesItsRegionsOnlyAndAJobKeepsItsMemory) {
  Memfd mem(1 << 16);
  RegionRegistry reg(Enabled(), {});
  ASSERT_TRUE(Register(reg, "uid 1", Local("a", 0, 4096), mem.fd(), /*session=*/7).ok());
  ASSERT_TRUE(Register(reg, "uid 1", Local("b", 0, 4096), mem.fd(), /*session=*/8).ok());
  ASSERT_TRUE(Register(reg, "uid 2", Local("c", 0, 4096), mem.fd(), /*session=*/7).ok());
  auto used = reg.Find("uid 1", "a");
  ASSERT_TRUE(used.ok());
  Region::Use use(*used);
  reg.DropSession(7);
  EXPECT_EQ(reg.Find("uid 1", "a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(reg.Find("uid 2", "c").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(reg.Find("uid 1", "b").ok());  // another session of the same uid
  // `c` is released on a region worker (not the caller's thread); `a` stays
  // mapped while the job uses it.
  for (int i = 0; i < 500 && reg.registered_bytes() != 2 * 4096; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(reg.registered_bytes(), 2 * 4096);
  std::memset(use->data(), 3, 4096);             // and still writable
}

}  // namespace
}  // namespace dgmm
