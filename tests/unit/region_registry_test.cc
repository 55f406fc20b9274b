// RegionRegistry and SigbusGuard without gRPC: real POSIX shared-memory
// objects, mapped by the registry as the server maps them.
#include "service/regions/region_registry.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "service/regions/sigbus_guard.h"

namespace dgmm {
namespace {

// A shared-memory object the test owns, unlinked at the end.
class ShmObject {
 public:
  explicit ShmObject(int64_t bytes) : key_(absl::StrCat("/dgmm-unit-", getpid(), "-", next_++)) {
    fd_ = shm_open(key_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    EXPECT_GE(fd_, 0);
    EXPECT_EQ(ftruncate(fd_, bytes), 0);
  }
  ~ShmObject() {
    if (fd_ >= 0) close(fd_);
    if (!unlinked_) shm_unlink(key_.c_str());
  }
  const std::string& key() const { return key_; }
  void Truncate(int64_t bytes) { ASSERT_EQ(ftruncate(fd_, bytes), 0); }
  void Unlink() {
    shm_unlink(key_.c_str());
    unlinked_ = true;
  }

 private:
  static inline int next_ = 0;
  std::string key_;
  int fd_ = -1;
  bool unlinked_ = false;
};

v1::RegisterRegionRequest Shm(const std::string& name, const std::string& key, int64_t offset,
                              int64_t bytes) {
  v1::RegisterRegionRequest r;
  r.set_name(name);
  r.mutable_system_shm()->set_key(key);
  r.mutable_system_shm()->set_offset(offset);
  r.mutable_system_shm()->set_byte_size(bytes);
  return r;
}

RegionOptions Enabled(int64_t budget = int64_t{1} << 30) {
  RegionOptions o;
  o.enabled = true;
  o.budget_bytes = budget;
  o.max_per_client = 4;
  o.sweep_interval = absl::Hours(1);  // the tests call Sweep themselves
  return o;
}

TEST(RegionRegistryTest, MapsTheObjectAndReleasesItsBytes) {
  ShmObject obj(1 << 16);
  RegionRegistry reg(Enabled(), {});
  auto st = reg.Register("alice", Shm("a", obj.key(), 4096, 8192));
  ASSERT_TRUE(st.ok()) << st.status();
  EXPECT_EQ(st->byte_size(), 8192);
  EXPECT_FALSE(st->pinned());  // no GPU ops given
  EXPECT_EQ(reg.registered_bytes(), 8192);
  auto r = reg.Find("alice", "a");
  ASSERT_TRUE(r.ok());
  // The mapping is the object: bytes written through it are there.
  std::memset((*r)->data(), 0x5a, 8192);
  EXPECT_TRUE((*r)->CheckIntact().ok());
  EXPECT_EQ(reg.Find("bob", "a").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(*reg.Unregister("alice", "a"), 1);
  EXPECT_EQ(reg.registered_bytes(), 8192);  // still held by `r`, like a running job
  r->reset();
  EXPECT_EQ(reg.registered_bytes(), 0);
}

TEST(RegionRegistryTest, RefusesBadInputWithItsCode) {
  ShmObject obj(4096);
  RegionRegistry reg(Enabled(10000), {});
  auto code = [&](const v1::RegisterRegionRequest& r) {
    return reg.Register("c", r).status().code();
  };
  using C = absl::StatusCode;
  EXPECT_EQ(code(Shm("", obj.key(), 0, 16)), C::kInvalidArgument);
  EXPECT_EQ(code(Shm("a/b", obj.key(), 0, 16)), C::kInvalidArgument);
  EXPECT_EQ(code(Shm("a", "/../etc/passwd", 0, 16)), C::kInvalidArgument);
  EXPECT_EQ(code(Shm("a", "relative", 0, 16)), C::kInvalidArgument);
  EXPECT_EQ(code(Shm("a", "/..", 0, 16)), C::kInvalidArgument);
  EXPECT_EQ(code(Shm("a", obj.key(), -1, 16)), C::kInvalidArgument);
  EXPECT_EQ(code(Shm("a", obj.key(), 0, 0)), C::kInvalidArgument);
  EXPECT_EQ(code(Shm("a", obj.key(), 4000, 97)), C::kInvalidArgument);  // past the end
  EXPECT_EQ(code(Shm("a", obj.key(), INT64_MAX, 16)), C::kInvalidArgument);  // no overflow
  EXPECT_EQ(code(Shm("a", "/dgmm-no-such-object", 0, 16)), C::kNotFound);
  EXPECT_EQ(code(Shm("a", obj.key(), 0, 20000)), C::kResourceExhausted);  // over the budget
  v1::RegisterRegionRequest ipc;
  ipc.set_name("g");
  ipc.mutable_cuda_ipc()->set_handle(std::string(64, 'x'));
  ipc.mutable_cuda_ipc()->set_byte_size(16);
  EXPECT_EQ(code(ipc), C::kFailedPrecondition);  // no GPU
  ipc.mutable_cuda_ipc()->set_handle("short");
  EXPECT_EQ(code(ipc), C::kInvalidArgument);
  ASSERT_TRUE(reg.Register("c", Shm("a", obj.key(), 0, 16)).ok());
  EXPECT_EQ(code(Shm("a", obj.key(), 0, 16)), C::kAlreadyExists);
  for (int i = 1; i < 4; ++i) ASSERT_TRUE(reg.Register("c", Shm(absl::StrCat("n", i), obj.key(), 0, 16)).ok());
  EXPECT_EQ(code(Shm("n9", obj.key(), 0, 16)), C::kResourceExhausted);  // max_per_client 4
  EXPECT_TRUE(reg.Register("other", Shm("n9", obj.key(), 0, 16)).ok());  // per client
  EXPECT_EQ(reg.registered_bytes(), 5 * 16);
  EXPECT_EQ(*reg.Unregister("c", ""), 4);
  EXPECT_EQ(reg.registered_bytes(), 16);
}

TEST(RegionRegistryTest, ShrunkObjectIsAbsorbedNotFatal) {
  const long page = sysconf(_SC_PAGESIZE);
  ShmObject obj(4 * page);
  RegionRegistry reg(Enabled(), {});
  ASSERT_TRUE(reg.Register("c", Shm("a", obj.key(), 0, 4 * page)).ok());
  auto r = reg.Find("c", "a");
  ASSERT_TRUE(r.ok());
  std::memset((*r)->data(), 1, 4 * page);
  const long before = SigbusGuard::absorbed();
  obj.Truncate(0);
  // Without the guard this read is a SIGBUS that kills the process.
  volatile std::byte* p = (*r)->data() + 2 * page;
  const std::byte seen = *p;
  EXPECT_EQ(seen, std::byte{0});
  EXPECT_EQ(SigbusGuard::absorbed(), before + 1);
  const absl::Status intact = (*r)->CheckIntact();
  EXPECT_EQ(intact.code(), absl::StatusCode::kFailedPrecondition) << intact;
}

TEST(RegionRegistryTest, ShrinkSeenBySizeEvenWithoutAFault) {
  ShmObject obj(8192);
  RegionRegistry reg(Enabled(), {});
  ASSERT_TRUE(reg.Register("c", Shm("a", obj.key(), 0, 8192)).ok());
  obj.Truncate(4096);
  EXPECT_EQ((*reg.Find("c", "a"))->CheckIntact().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(RegionRegistryTest, SweepDropsUnlinkedAndIdleRegionsNotUsedOnes) {
  ShmObject gone(4096), idle(4096), busy(4096);
  RegionOptions o = Enabled();
  o.idle_timeout = absl::Seconds(30);
  RegionRegistry reg(o, {});
  ASSERT_TRUE(reg.Register("c", Shm("gone", gone.key(), 0, 4096)).ok());
  ASSERT_TRUE(reg.Register("c", Shm("idle", idle.key(), 0, 4096)).ok());
  ASSERT_TRUE(reg.Register("c", Shm("busy", busy.key(), 0, 4096)).ok());
  gone.Unlink();
  busy.Unlink();
  {
    Region::Use use(*reg.Find("c", "busy"));  // a job is using it
    reg.Sweep(absl::Now());
    EXPECT_EQ(reg.Find("c", "gone").status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(reg.Find("c", "busy").ok());
    EXPECT_TRUE(reg.Find("c", "idle").ok());
    reg.Sweep(absl::Now() + absl::Minutes(1));  // idle past the timeout; busy still used
    EXPECT_EQ(reg.Find("c", "idle").status().code(), absl::StatusCode::kNotFound);
    EXPECT_TRUE(reg.Find("c", "busy").ok());
  }
  reg.Sweep(absl::Now());
  EXPECT_EQ(reg.count(), 0);
  EXPECT_EQ(reg.registered_bytes(), 0);
}

}  // namespace
}  // namespace dgmm
