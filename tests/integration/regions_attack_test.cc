// The confused-deputy attack on regions, run for real: the server runs as
// root with --allow_regions and no tokens; a victim (uid 65534) keeps a
// secret in a 0600 shared-memory object and has it registered as a region;
// an attacker (uid 65533), who can see the object's name in /dev/shm but not
// open it, tries every RPC and every local-socket request to read or write
// those bytes, or to list or drop the victim's regions. Every attempt must
// fail, the secret must be intact, and two uids without tokens must each see
// only their own regions (with the same region name).
//
// Needs root (it switches uids); skipped otherwise. The victim and the
// attacker are this binary again, exec'd as the other uid:
//   dgmm_regions_attack_test --victim ADDRESS KEY      (registers, waits on stdin)
//   dgmm_regions_attack_test --attacker ADDRESS KEY TICKET  (one line per attempt)
#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/local_peer.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

constexpr uid_t kVictim = 65534;
constexpr uid_t kAttacker = 65533;
constexpr int64_t kBytes = 64 * 64 * 4;  // a 64x64 float32 matrix

// The secret: bytes no zero page or computation would produce by chance.
std::string Secret() {
  std::string s(kBytes, '\0');
  for (int64_t i = 0; i < kBytes; ++i) s[i] = static_cast<char>((i * 131 + 7) % 251);
  return s;
}

std::unique_ptr<grpc::ClientContext> Ctx(const std::string& session) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  if (!session.empty()) ctx->AddMetadata("dgmm-session", session);
  return ctx;
}

std::unique_ptr<SocketPeer> OpenSession(v1::Dgmm::Stub* stub) {
  auto peer = std::make_unique<SocketPeer>(Info(stub).limits().local_socket());
  if (!peer->connected() || !peer->Hello().has_value()) return nullptr;
  return peer;
}

grpc::Status RegisterFd(v1::Dgmm::Stub* stub, SocketPeer& session, const std::string& name,
                        int fd, int64_t bytes) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  request.mutable_local_fd()->set_ticket(session.Ticket(fd));
  request.mutable_local_fd()->set_byte_size(bytes);
  v1::RegisterRegionResponse response;
  return stub->RegisterRegion(Ctx(session.session()).get(), request, &response);
}

v1::MultiplyRegionRequest JobOn(const std::string& name, float d) {
  const RandomJob job = MakeJob(64, 64, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 5);
  v1::MultiplyRegionRequest request;
  *request.mutable_header() = job.header;
  std::string diag(64 * 4, '\0');
  for (int i = 0; i < 64; ++i) std::memcpy(diag.data() + 4 * i, &d, 4);
  request.mutable_header()->set_diagonal(diag);
  request.mutable_matrix()->set_name(name);
  request.mutable_result()->set_name(name);
  return request;
}

// ---------------------------------------------------------------- victim

int Victim(const std::string& address, const std::string& key) {
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0 || ftruncate(fd, kBytes) != 0) return 2;
  const std::string secret = Secret();
  if (pwrite(fd, secret.data(), secret.size(), 0) != kBytes) return 2;
  std::unique_ptr<v1::Dgmm::Stub> stub = Connect(address);
  std::unique_ptr<SocketPeer> session = OpenSession(stub.get());
  if (session == nullptr) return 3;
  grpc::Status st = RegisterFd(stub.get(), *session, "secret", fd, kBytes);
  if (!st.ok()) {
    std::fprintf(stderr, "victim: RegisterRegion: %s\n", st.error_message().c_str());
    return 4;
  }
  // A ticket the victim holds and has not used yet: the attacker gets its
  // value (as if it leaked) and tries to register it.
  const std::string unused_ticket = session->Ticket(fd);
  std::printf("ready %s\n", unused_ticket.c_str());
  std::fflush(stdout);
  std::string line;
  std::getline(std::cin, line);  // until the parent says the attack is over
  // The region is still the victim's, and still holds the secret.
  v1::GetRegionStatusResponse listed;
  st = stub->GetRegionStatus(Ctx(session->session()).get(), {}, &listed);
  std::printf("victim regions: %d%s\n", listed.regions_size(),
              st.ok() && listed.regions_size() == 1 && listed.regions(0).name() == "secret"
                  ? " (secret)"
                  : "");
  std::string now(kBytes, '\0');
  std::printf("victim secret intact: %s\n",
              pread(fd, now.data(), now.size(), 0) == kBytes && now == secret ? "yes" : "no");
  close(fd);
  shm_unlink(key.c_str());
  return 0;
}

// -------------------------------------------------------------- attacker

int Attacker(const std::string& address, const std::string& key, const std::string& ticket) {
  const auto say = [](const std::string& what, const std::string& outcome) {
    std::printf("%s: %s\n", what.c_str(), outcome.c_str());
  };
  const auto code = [](const grpc::Status& s) {
    static const char* names[] = {"OK", "CANCELLED", "UNKNOWN", "INVALID_ARGUMENT",
                                  "DEADLINE_EXCEEDED", "NOT_FOUND", "ALREADY_EXISTS",
                                  "PERMISSION_DENIED", "RESOURCE_EXHAUSTED",
                                  "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
                                  "UNIMPLEMENTED", "INTERNAL", "UNAVAILABLE", "DATA_LOSS",
                                  "UNAUTHENTICATED"};
    return std::string(names[s.error_code()]);
  };
  // 0. The object's name is in plain sight; its bytes are not.
  const int own = shm_open(key.c_str(), O_RDWR, 0);
  say("shm_open", own < 0 && errno == EACCES ? "EACCES" : "opened");
  const int ro = shm_open(key.c_str(), O_RDONLY, 0);
  say("shm_open_rdonly", ro < 0 && errno == EACCES ? "EACCES" : "opened");
  std::unique_ptr<v1::Dgmm::Stub> stub = Connect(address);
  // 1. The old way: ask the server to open the key.
  v1::RegisterRegionRequest by_key;
  by_key.set_name("stolen");
  by_key.mutable_system_shm()->set_key(key);
  by_key.mutable_system_shm()->set_byte_size(kBytes);
  v1::RegisterRegionResponse registered;
  std::unique_ptr<SocketPeer> session = OpenSession(stub.get());
  if (session == nullptr) return 3;
  say("register_by_key",
      code(stub->RegisterRegion(Ctx(session->session()).get(), by_key, &registered)));
  say("register_by_key_no_session",
      code(stub->RegisterRegion(Ctx("").get(), by_key, &registered)));
  // 2. Ask the local socket to open it.
  v1::LocalRequest open_shm;
  open_shm.mutable_open_shm()->set_key(key);
  auto opened = session->Call(open_shm);
  say("open_shm", !opened.has_value() ? "closed"
                  : opened->code() == 7 ? "PERMISSION_DENIED"
                                        : "code " + std::to_string(opened->code()));
  // 2b. The victim's unused ticket, leaked: bound to the victim's session.
  v1::RegisterRegionRequest leaked;
  leaked.set_name("leaked");
  leaked.mutable_local_fd()->set_ticket(ticket);
  leaked.mutable_local_fd()->set_byte_size(kBytes);
  say("register_victims_ticket",
      code(stub->RegisterRegion(Ctx(session->session()).get(), leaked, &registered)));
  // 3. List, name, use and drop the victim's region.
  v1::GetRegionStatusResponse listed;
  grpc::Status st = stub->GetRegionStatus(Ctx(session->session()).get(), {}, &listed);
  say("list_all", st.ok() ? std::to_string(listed.regions_size()) + " regions" : code(st));
  v1::GetRegionStatusRequest one;
  one.set_name("secret");
  say("status_secret", code(stub->GetRegionStatus(Ctx(session->session()).get(), one, &listed)));
  v1::MultiplyRegionResponse multiplied;
  say("read_secret", code(stub->MultiplyRegion(Ctx(session->session()).get(), JobOn("secret", 1.0f),
                                               &multiplied)));
  say("write_secret", code(stub->MultiplyRegion(Ctx(session->session()).get(),
                                                JobOn("secret", 2.0f), &multiplied)));
  v1::UnregisterRegionRequest drop_one;
  drop_one.set_name("secret");
  v1::UnregisterRegionResponse dropped;
  say("unregister_secret",
      code(stub->UnregisterRegion(Ctx(session->session()).get(), drop_one, &dropped)));
  st = stub->UnregisterRegion(Ctx(session->session()).get(), {}, &dropped);
  say("unregister_all", st.ok() ? std::to_string(dropped.unregistered()) + " unregistered" : code(st));
  // 4. Without a session, or with a guessed one.
  say("list_no_session", code(stub->GetRegionStatus(Ctx("").get(), {}, &listed)));
  say("read_guessed_session",
      code(stub->MultiplyRegion(Ctx(std::string(64, '0')).get(), JobOn("secret", 1.0f),
                                &multiplied)));
  // 5. Its own memory under the same name works, and is its own.
  const int mine = memfd_create("attacker", MFD_CLOEXEC);
  if (mine < 0 || ftruncate(mine, kBytes) != 0) return 2;
  say("register_own_secret_name", code(RegisterFd(stub.get(), *session, "secret", mine, kBytes)));
  st = stub->MultiplyRegion(Ctx(session->session()).get(), JobOn("secret", 1.0f), &multiplied);
  std::string back(kBytes, '\0');
  const bool zeros = pread(mine, back.data(), back.size(), 0) == kBytes &&
                     back == std::string(kBytes, '\0');
  say("read_own_secret_name", code(st) + (zeros ? " own zeros" : " NOT own bytes"));
  st = stub->GetRegionStatus(Ctx(session->session()).get(), {}, &listed);
  say("list_own", st.ok() ? std::to_string(listed.regions_size()) + " regions, uid " +
                                std::to_string(listed.regions_size() > 0
                                                   ? listed.regions(0).owner_uid()
                                                   : -1)
                          : code(st));
  return 0;
}

// ------------------------------------------------------------------ test

// Runs this binary (copied to `exe`) as `uid` with `args`; its stdin and
// stdout are pipes the caller gets.
struct Child {
  pid_t pid = -1;
  FILE* out = nullptr;
  int in = -1;
};

Child Spawn(const std::string& exe, uid_t uid, const std::vector<std::string>& args) {
  int to_child[2], from_child[2];
  if (pipe(to_child) != 0 || pipe(from_child) != 0) std::abort();
  std::vector<char*> argv;
  argv.push_back(const_cast<char*>(exe.c_str()));
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(to_child[0], 0);
    dup2(from_child[1], 1);
    close(to_child[1]);
    close(from_child[0]);
    if (setgroups(0, nullptr) != 0 || setresgid(uid, uid, uid) != 0 ||
        setresuid(uid, uid, uid) != 0) {
      _exit(126);
    }
    execv(exe.c_str(), argv.data());
    _exit(127);
  }
  close(to_child[0]);
  close(from_child[1]);
  return {pid, fdopen(from_child[0], "r"), to_child[1]};
}

std::string ReadLine(FILE* f) {
  char buf[512];
  if (std::fgets(buf, sizeof buf, f) == nullptr) return "";
  std::string s(buf);
  if (!s.empty() && s.back() == '\n') s.pop_back();
  return s;
}

std::string ReadAll(FILE* f) {
  std::string all;
  for (std::string line = ReadLine(f); !line.empty() || !std::feof(f); line = ReadLine(f)) {
    all += line + "\n";
  }
  return all;
}

int Wait(pid_t pid) {
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(RegionsAttackTest, AnotherUidCannotReachAVictimsMemoryThroughARootServer) {
  if (getuid() != 0) GTEST_SKIP() << "needs root: it runs the victim and attacker as other uids";
  ServerProcess server({"--backend=cpu", "--threads=1", "--allow_regions"});
  // The victim and the attacker exec a copy of this binary that they can
  // read, whatever the permissions of the build tree.
  char dir[] = "/tmp/dgmm-attack-XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_EQ(chmod(dir, 0755), 0);
  const std::string exe = std::string(dir) + "/attack";
  {
    std::ifstream src("/proc/self/exe", std::ios::binary);
    std::ofstream dst(exe, std::ios::binary);
    dst << src.rdbuf();
  }
  ASSERT_EQ(chmod(exe.c_str(), 0755), 0);
  const std::string key = "/dgmm-victim-" + std::to_string(getpid());

  Child victim = Spawn(exe, kVictim, {"--victim", server.address(), key});
  const std::string ready = ReadLine(victim.out);
  ASSERT_EQ(ready.substr(0, 6), "ready ") << ready;
  const std::string victims_ticket = ready.substr(6);
  ASSERT_EQ(victims_ticket.size(), 32u) << ready;
  // The object is the victim's, 0600, and its name is listable by anyone.
  struct stat st;
  ASSERT_EQ(stat(("/dev/shm" + key).c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, kVictim);
  EXPECT_EQ(st.st_mode & 0777, 0600u);

  Child attacker =
      Spawn(exe, kAttacker, {"--attacker", server.address(), key, victims_ticket});
  close(attacker.in);
  const std::string report = ReadAll(attacker.out);
  EXPECT_EQ(Wait(attacker.pid), 0) << report;
  std::printf("attacker (uid %d):\n%s", kAttacker, report.c_str());
  const std::vector<std::string> expected = {
      "shm_open: EACCES",
      "shm_open_rdonly: EACCES",
      "register_by_key: INVALID_ARGUMENT",
      "register_by_key_no_session: UNAUTHENTICATED",
      "open_shm: PERMISSION_DENIED",
      "register_victims_ticket: NOT_FOUND",
      "list_all: 0 regions",
      "status_secret: NOT_FOUND",
      "read_secret: NOT_FOUND",
      "write_secret: NOT_FOUND",
      "unregister_secret: NOT_FOUND",
      "unregister_all: 0 unregistered",
      "list_no_session: UNAUTHENTICATED",
      "read_guessed_session: UNAUTHENTICATED",
      "register_own_secret_name: OK",
      "read_own_secret_name: OK own zeros",
      "list_own: 1 regions, uid 65533",
  };
  for (const std::string& line : expected) {
    EXPECT_NE(report.find(line + "\n"), std::string::npos) << "missing: " << line;
  }

  // The attack is over: the victim still has its region and its secret.
  ASSERT_EQ(write(victim.in, "done\n", 5), 5);
  close(victim.in);
  const std::string after = ReadAll(victim.out);
  EXPECT_EQ(Wait(victim.pid), 0) << after;
  std::printf("victim (uid %d):\n%s", kVictim, after.c_str());
  EXPECT_NE(after.find("victim regions: 1 (secret)"), std::string::npos) << after;
  EXPECT_NE(after.find("victim secret intact: yes"), std::string::npos) << after;
  std::fclose(victim.out);
  std::fclose(attacker.out);
  unlink(exe.c_str());
  rmdir(dir);
}

}  // namespace
}  // namespace dgmm::testing

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--victim") {
    return dgmm::testing::Victim(argv[2], argv[3]);
  }
  if (argc == 5 && std::string(argv[1]) == "--attacker") {
    return dgmm::testing::Attacker(argv[2], argv[3], argv[4]);
  }
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
