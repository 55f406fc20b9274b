#include "tests/support/local_peer.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

namespace dgmm::testing {

SocketPeer::SocketPeer(const std::string& path) {
  fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof addr.sun_path - 1);
  connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
}

void SocketPeer::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

std::string SocketPeer::Frame(const v1::LocalRequest& r) {
  const std::string body = r.SerializeAsString();
  std::string f(4, '\0');
  for (int i = 0; i < 4; ++i) f[i] = static_cast<char>((body.size() >> (8 * i)) & 0xff);
  return f + body;
}

bool SocketPeer::Send(const std::string& bytes, const std::vector<int>& fds) {
  iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* h = CMSG_FIRSTHDR(&msg);
    h->cmsg_level = SOL_SOCKET;
    h->cmsg_type = SCM_RIGHTS;
    h->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(h), fds.data(), sizeof(int) * fds.size());
  }
  return sendmsg(fd_, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

std::optional<v1::LocalResponse> SocketPeer::Read() {
  std::string in;
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (;;) {
    if (in.size() >= 4) {
      uint32_t len = 0;
      for (int i = 3; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(in[i]);
      if (in.size() >= 4 + len) {
        v1::LocalResponse r;
        if (!r.ParseFromArray(in.data() + 4, static_cast<int>(len))) return std::nullopt;
        return r;
      }
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        until - std::chrono::steady_clock::now());
    pollfd p{fd_, POLLIN, 0};
    if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
      return std::nullopt;
    }
    char buf[4096];
    const ssize_t n = recv(fd_, buf, sizeof buf, 0);
    if (n <= 0) return std::nullopt;
    in.append(buf, static_cast<size_t>(n));
  }
}

std::optional<v1::LocalResponse> SocketPeer::Call(const v1::LocalRequest& r,
                                                  const std::vector<int>& fds) {
  if (!Send(Frame(r), fds)) return std::nullopt;
  return Read();
}

std::optional<v1::LocalResponse> SocketPeer::Hello() { return Hello(v1::LocalHello()); }

std::optional<v1::LocalResponse> SocketPeer::Hello(const v1::LocalHello& hello) {
  v1::LocalRequest r;
  *r.mutable_hello() = hello;
  auto reply = Call(r);
  if (reply.has_value() && reply->code() == 0) session_ = reply->hello().session();
  return reply;
}

std::optional<v1::LocalResponse> SocketPeer::Pass(int fd) {
  v1::LocalRequest r;
  r.mutable_pass_fd()->set_kind(v1::LOCAL_FD_KIND_MEMORY);
  return Call(r, {fd});
}

std::string SocketPeer::Ticket(int fd, std::string* why) {
  auto reply = Pass(fd);
  if (!reply.has_value() || reply->code() != 0) {
    if (why != nullptr) *why = reply.has_value() ? reply->message() : "connection closed";
    return "";
  }
  return reply->ticket().ticket();
}

ChildRun RunInChild(const std::function<std::string()>& child) {
  ChildRun run;
  int pipe_fds[2];
  if (pipe(pipe_fds) != 0) return run;
  run.pid = fork();
  if (run.pid == 0) {
    close(pipe_fds[0]);
    const std::string said = child();
    const bool sent =
        write(pipe_fds[1], said.data(), said.size()) == static_cast<ssize_t>(said.size());
    _exit(sent ? 0 : 125);
  }
  close(pipe_fds[1]);
  char buf[1024];
  for (ssize_t n; run.pid > 0 && (n = read(pipe_fds[0], buf, sizeof buf)) > 0;) {
    run.said.append(buf, static_cast<size_t>(n));
  }
  close(pipe_fds[0]);
  if (run.pid > 0 && waitpid(run.pid, &run.wait_status, 0) == run.pid) {
    run.exited_ok = WIFEXITED(run.wait_status) && WEXITSTATUS(run.wait_status) == 0;
  }
  return run;
}

bool SocketPeer::ClosedByServer() {
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, 5000) <= 0) return false;
  char c;
  return recv(fd_, &c, 1, 0) == 0;
}

}  // namespace dgmm::testing
