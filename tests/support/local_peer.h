// A client of the server's local socket written from the protocol alone
// (docs/protocol.md "The local socket"; LocalRequest/LocalResponse in
// dgmm.proto), for tests: raw frames, descriptors attached by hand, so tests
// can also get the protocol wrong on purpose.
#ifndef DGMM_TESTS_SUPPORT_LOCAL_PEER_H_
#define DGMM_TESTS_SUPPORT_LOCAL_PEER_H_

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "dgmm/v1/dgmm.pb.h"

namespace dgmm::testing {

class SocketPeer {
 public:
  // Connects to `path` (connected() says whether it could).
  explicit SocketPeer(const std::string& path);
  ~SocketPeer() { Close(); }
  SocketPeer(const SocketPeer&) = delete;
  SocketPeer& operator=(const SocketPeer&) = delete;
  void Close();
  bool connected() const { return connected_; }

  // A request as a frame: 4 bytes of length, little-endian, then the message.
  static std::string Frame(const v1::LocalRequest& r);
  // Sends raw bytes with `fds` attached (SCM_RIGHTS).
  bool Send(const std::string& bytes, const std::vector<int>& fds = {});
  // The next reply, or nullopt when the server closed the connection (or
  // said nothing within 5 s).
  std::optional<v1::LocalResponse> Read();
  std::optional<v1::LocalResponse> Call(const v1::LocalRequest& r,
                                        const std::vector<int>& fds = {});
  // hello (plain, or `hello`); the session is kept (session()).
  std::optional<v1::LocalResponse> Hello();
  std::optional<v1::LocalResponse> Hello(const v1::LocalHello& hello);
  const std::string& session() const { return session_; }
  // pass_fd of host memory `fd`.
  std::optional<v1::LocalResponse> Pass(int fd);
  // The ticket for `fd`, or "" (with the reason in *why).
  std::string Ticket(int fd, std::string* why = nullptr);
  // True once the server has closed the connection (waits up to 5 s).
  bool ClosedByServer();

 private:
  int fd_ = -1;
  bool connected_ = false;
  std::string session_;
};

// Runs `child` in a forked child of this process (no exec: it must not use
// gRPC) and returns what it returned, with its pid and whether it exited 0
// (a child that cannot go on calls _exit with another status).
struct ChildRun {
  pid_t pid = -1;
  bool exited_ok = false;
  int wait_status = 0;
  std::string said;
};
ChildRun RunInChild(const std::function<std::string()>& child);

}  // namespace dgmm::testing

#endif  // DGMM_TESTS_SUPPORT_LOCAL_PEER_H_
