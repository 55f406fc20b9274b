#include "service/regions/local_socket.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "service/regions/region_registry.h"
#include "service/core/log.h"

namespace dgmm {
namespace {

constexpr size_t kMaxFrame = 4096;
constexpr int kMaxPendingFds = 4;
// The most descriptors one message can carry (the kernel's SCM_MAX_FD): the
// control buffer has room for them all, so that a message with too many is
// refused with its count rather than cut short.
constexpr int kMaxFdsInAMessage = 253;

std::string ErrnoText(int err) { return std::strerror(err); }

// 32 random bytes as hex: a session secret or a ticket.
std::string RandomHex(size_t bytes) {
  std::string raw(bytes, '\0');
  size_t got = 0;
  while (got < bytes) {
    const ssize_t n = getrandom(raw.data() + got, bytes - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return absl::BytesToHexString(raw);
}

void Reply(v1::LocalResponse* out, absl::StatusCode code, absl::string_view message) {
  out->set_code(static_cast<int>(code));
  out->set_message(std::string(message));
}

void Reply(v1::LocalResponse* out, const absl::Status& s) { Reply(out, s.code(), s.message()); }

}  // namespace

// ------------------------------------------------------------------ a peer

struct LocalSocket::Conn {
  OwnedFd fd;
  uid_t connected_uid = 0;  // SO_PEERCRED: what the per-uid bound counts
  LocalPeer peer;
  std::string session;  // empty until hello
  absl::Time hello_by;
  std::string in;
  // Who wrote the bytes in `in` (SCM_CREDENTIALS: the kernel's word for the
  // sending process at the time it sent them, not the one that connected).
  std::optional<ucred> in_from;
  std::deque<OwnedFd> fds;  // received, not yet claimed by a pass_fd
  // Descriptors beyond the one a pass_fd may carry, closed on arrival: the
  // pass_fd they came with is refused, naming how many there were.
  int extra_fds = 0;
};

LocalSocket::LocalSocket(LocalSocketOptions options, SessionClosed on_closed)
    : options_(std::move(options)), on_closed_(std::move(on_closed)) {}

absl::StatusOr<std::unique_ptr<LocalSocket>> LocalSocket::Start(LocalSocketOptions options,
                                                                 SessionClosed on_closed) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (options.path.empty() || options.path.size() >= sizeof addr.sun_path) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--local_socket path must have 1 to %d characters, got '%s'", sizeof addr.sun_path - 1,
        options.path));
  }
  std::memcpy(addr.sun_path, options.path.c_str(), options.path.size() + 1);
  std::unique_ptr<LocalSocket> s(new LocalSocket(std::move(options), std::move(on_closed)));
  const std::string& path = s->options_.path;
  // Not ours to remove until this server has bound it: a start that fails
  // before (a live server's path) must leave the file alone.
  s->unlinked_ = true;
  s->listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (s->listen_fd_ < 0) return absl::InternalError(absl::StrCat("socket: ", ErrnoText(errno)));
  struct stat st;
  if (lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return absl::FailedPreconditionError(
          absl::StrCat("--local_socket ", path, " exists and is not a socket"));
    }
    // A socket file: a live server answers; a dead one's file is replaced.
    const int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live =
        probe >= 0 && connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    if (probe >= 0) close(probe);
    if (live) {
      return absl::FailedPreconditionError(absl::StrCat(
          "--local_socket ", path, " is in use by another server; give this one another path"));
    }
    unlink(path.c_str());
  }
  // Created with no permission bits, then given options.mode: no client can
  // connect before the mode is what it should be.
  const mode_t old_umask = umask(0777);
  const int bound = bind(s->listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  const int bind_errno = errno;
  umask(old_umask);
  if (bound != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot bind --local_socket ", path, ": ", ErrnoText(bind_errno)));
  }
  s->unlinked_ = false;
  // Every message then carries its sender's credentials (SCM_CREDENTIALS);
  // accepted connections inherit the option, and bytes sent before the
  // accept carry them too.
  const int on = 1;
  if (setsockopt(s->listen_fd_, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0) {
    return absl::InternalError(absl::StrCat("SO_PASSCRED: ", ErrnoText(errno)));
  }
  if (chmod(path.c_str(), s->options_.mode) != 0 || listen(s->listen_fd_, 128) != 0) {
    const int err = errno;
    unlink(path.c_str());
    return absl::FailedPreconditionError(
        absl::StrCat("cannot set up --local_socket ", path, ": ", ErrnoText(err)));
  }
  s->wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (s->wake_fd_ < 0) return absl::InternalError(absl::StrCat("eventfd: ", ErrnoText(errno)));
  LocalSocket* raw = s.get();
  s->thread_ = std::thread([raw] { raw->Loop(); });
  return s;
}

LocalSocket::~LocalSocket() {
  stopping_ = true;
  if (wake_fd_ >= 0) {
    const uint64_t one = 1;
    (void)!write(wake_fd_, &one, sizeof one);
  }
  if (thread_.joinable()) thread_.join();
  for (auto& [fd, c] : conns_) {
    if (!c->session.empty() && on_closed_) on_closed_(c->peer.session_id);
  }
  conns_.clear();
  if (listen_fd_ >= 0) {
    close(listen_fd_);
    Unlink();
  }
  if (wake_fd_ >= 0) close(wake_fd_);
}

void LocalSocket::Unlink() {
  if (!unlinked_.exchange(true)) unlink(options_.path.c_str());
}

int64_t LocalSocket::tickets() const {
  std::lock_guard lock(mu_);
  return static_cast<int64_t>(tickets_.size());
}

absl::StatusOr<LocalPeer> LocalSocket::FindSession(absl::string_view session) const {
  std::lock_guard lock(mu_);
  auto it = sessions_.find(session);
  if (it == sessions_.end()) {
    return absl::UnauthenticatedError(absl::StrCat(
        "region calls need the metadata dgmm-session: a session of this server's local socket ",
        options_.path,
        " that is still open (connect, say hello, keep the connection; docs/protocol.md "
        "\"The local socket\")"));
  }
  return it->second;
}

absl::StatusOr<PassedMemory> LocalSocket::TakeTicket(uint64_t session_id,
                                                     absl::string_view ticket) {
  std::lock_guard lock(mu_);
  auto it = tickets_.find(ticket);
  if (it == tickets_.end() || it->second.session_id != session_id ||
      it->second.expires < absl::Now()) {
    return absl::NotFoundError(
        "no open ticket of that value for this session: a ticket is used once, within its "
        "timeout, by the session that got it");
  }
  PassedMemory m = std::move(it->second.memory);
  EraseTicket(it);
  return m;
}

std::map<std::string, LocalSocket::Ticket, std::less<>>::iterator LocalSocket::EraseTicket(
    std::map<std::string, Ticket, std::less<>>::iterator it) {
  if (--tickets_per_session_[it->second.session_id] <= 0) {
    tickets_per_session_.erase(it->second.session_id);
  }
  if (--tickets_per_uid_[it->second.uid] <= 0) tickets_per_uid_.erase(it->second.uid);
  return tickets_.erase(it);
}

void LocalSocket::Loop() {
  std::vector<pollfd> polled;
  while (!stopping_.load()) {
    polled.clear();
    polled.push_back({wake_fd_, POLLIN, 0});
    polled.push_back({listen_fd_, POLLIN, 0});
    for (const auto& [fd, c] : conns_) polled.push_back({fd, POLLIN, 0});
    const int n = poll(polled.data(), polled.size(), 1000);
    if (stopping_.load()) break;
    Expire(absl::Now());
    if (n <= 0) continue;
    if ((polled[1].revents & POLLIN) != 0) Accept();
    for (size_t i = 2; i < polled.size(); ++i) {
      if (polled[i].revents == 0) continue;
      auto it = conns_.find(polled[i].fd);
      if (it == conns_.end()) continue;
      if (!Serve(*it->second)) Close(polled[i].fd);
    }
  }
}

void LocalSocket::Accept() {
  for (;;) {
    const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;  // EAGAIN, or out of descriptors: try again on the next poll
    auto c = std::make_unique<Conn>();
    c->fd = OwnedFd(fd);
    ucred cred{};
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) continue;
    const int on = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0) continue;
    int of_uid = 0;
    for (const auto& [f, other] : conns_) of_uid += other->connected_uid == cred.uid ? 1 : 0;
    if (static_cast<int>(conns_.size()) >= options_.max_connections ||
        of_uid >= options_.max_connections_per_uid) {
      LogInfo("local socket: connection of uid ", cred.uid, " pid ", cred.pid, " refused: ",
              conns_.size(), " open, ", of_uid, " of this uid");
      continue;  // closed: the client sees its connection end before a hello reply
    }
    c->connected_uid = cred.uid;
    c->peer.uid = cred.uid;
    c->peer.gid = cred.gid;
    c->peer.pid = cred.pid;
    c->hello_by = absl::Now() + options_.hello_timeout;
    conns_[fd] = std::move(c);
    connections_.fetch_add(1);
  }
}

void LocalSocket::Close(int fd) {
  auto it = conns_.find(fd);
  if (it == conns_.end()) return;
  std::unique_ptr<Conn> c = std::move(it->second);
  conns_.erase(it);
  connections_.fetch_sub(1);
  if (c->session.empty()) return;
  std::vector<PassedMemory> dropped;  // closed outside the lock
  {
    std::lock_guard lock(mu_);
    sessions_.erase(c->session);
    for (auto t = tickets_.begin(); t != tickets_.end();) {
      if (t->second.session_id == c->peer.session_id) {
        dropped.push_back(std::move(t->second.memory));
        t = EraseTicket(t);
      } else {
        ++t;
      }
    }
  }
  if (on_closed_) on_closed_(c->peer.session_id);
}

void LocalSocket::Expire(absl::Time now) {
  std::vector<int> late;
  for (const auto& [fd, c] : conns_) {
    if (c->session.empty() && now > c->hello_by) late.push_back(fd);
  }
  for (int fd : late) Close(fd);
  std::vector<PassedMemory> dropped;
  std::lock_guard lock(mu_);
  for (auto t = tickets_.begin(); t != tickets_.end();) {
    if (t->second.expires < now) {
      dropped.push_back(std::move(t->second.memory));
      t = EraseTicket(t);
    } else {
      ++t;
    }
  }
}

bool LocalSocket::Serve(Conn& c) {
  char buf[kMaxFrame + 4];
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) +
                                 CMSG_SPACE(sizeof(int) * kMaxFdsInAMessage)];
  iovec iov{buf, sizeof buf};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  const ssize_t n = recvmsg(c.fd.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
  if (n < 0) return errno == EAGAIN || errno == EINTR;
  // Descriptors first, so that every one received is owned (and closed).
  bool bad_control = (msg.msg_flags & MSG_CTRUNC) != 0;
  std::optional<ucred> from;
  std::vector<OwnedFd> received;
  for (cmsghdr* h = CMSG_FIRSTHDR(&msg); h != nullptr; h = CMSG_NXTHDR(&msg, h)) {
    if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_CREDENTIALS &&
        h->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
      ucred cred;
      std::memcpy(&cred, CMSG_DATA(h), sizeof cred);
      from = cred;
      continue;
    }
    if (h->cmsg_level != SOL_SOCKET || h->cmsg_type != SCM_RIGHTS) {
      bad_control = true;
      continue;
    }
    const size_t count = (h->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(h) + i * sizeof(int), sizeof fd);
      received.emplace_back(fd);
    }
  }
  if (n == 0 || bad_control) return false;
  // One descriptor travels with one pass_fd's bytes: more in one message are
  // closed here, and the pass_fd they came with is refused with the count.
  if (received.size() > 1) {
    c.extra_fds = static_cast<int>(received.size());
    received.clear();
  }
  for (OwnedFd& fd : received) c.fds.push_back(std::move(fd));
  if (c.fds.size() > kMaxPendingFds) return false;
  // A frame's bytes come from one process: the kernel never joins the
  // writes of two in one read, so a frame that another process completes
  // breaks the protocol.
  const auto same = [](const std::optional<ucred>& a, const std::optional<ucred>& b) {
    return a.has_value() == b.has_value() &&
           (!a.has_value() || (a->pid == b->pid && a->uid == b->uid && a->gid == b->gid));
  };
  if (!c.in.empty() && !same(c.in_from, from)) return false;
  c.in_from = from;
  c.in.append(buf, static_cast<size_t>(n));
  while (c.in.size() >= 4) {
    uint32_t len = 0;
    for (int i = 3; i >= 0; --i) len = (len << 8) | static_cast<uint8_t>(c.in[i]);
    if (len > kMaxFrame) return false;
    if (c.in.size() < 4 + len) break;
    v1::LocalRequest request;
    const bool parsed = request.ParseFromArray(c.in.data() + 4, static_cast<int>(len));
    c.in.erase(0, 4 + len);
    if (!parsed) return false;
    OwnedFd fd;
    v1::LocalResponse response;
    if (request.has_pass_fd() && c.extra_fds > 0) {
      if (c.session.empty()) return false;  // hello first
      Reply(&response, absl::StatusCode::kInvalidArgument,
            absl::StrFormat("a pass_fd carries exactly one descriptor; %d came with this one "
                            "(all closed, no ticket)",
                            c.extra_fds));
      c.extra_fds = 0;
    } else {
      if (request.has_pass_fd()) {
        if (c.fds.empty()) return false;  // a pass_fd without its descriptor
        fd = std::move(c.fds.front());
        c.fds.pop_front();
      }
      if (!Handle(c, request, std::move(fd), &response)) return false;
    }
    const std::string body = response.SerializeAsString();
    std::string frame(4, '\0');
    for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((body.size() >> (8 * i)) & 0xff);
    frame += body;
    // Replies are small; a client that does not read them fills its socket
    // buffer after thousands of requests and is dropped.
    if (send(c.fd.get(), frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(frame.size())) {
      return false;
    }
  }
  // A descriptor may arrive with the first bytes of its frame; one that no
  // frame under way can claim breaks the protocol.
  return (c.fds.empty() && c.extra_fds == 0) || !c.in.empty();
}

bool LocalSocket::Handle(Conn& c, const v1::LocalRequest& request, OwnedFd fd,
                         v1::LocalResponse* out) {
  if (request.has_hello()) {
    if (!c.session.empty()) return false;
    c.session = RandomHex(32);
    const std::string refused =
        TakeHelloSender(c.in_from, request.hello(), options_.process_memory, &c.peer);
    {
      std::lock_guard lock(mu_);
      static std::atomic<uint64_t> next_session{1};
      c.peer.session_id = next_session.fetch_add(1);
      sessions_[c.session] = c.peer;
    }
    v1::LocalHelloReply* hello = out->mutable_hello();
    hello->set_session(c.session);
    hello->set_uid(c.peer.uid);
    hello->set_gid(c.peer.gid);
    hello->set_pid(c.peer.pid);
    hello->set_instance_id(options_.instance_id);
    hello->set_max_tickets(options_.max_tickets_per_connection);
    hello->set_ticket_timeout_ms(absl::ToInt64Milliseconds(options_.ticket_timeout));
    hello->set_process_memory(c.peer.memory != nullptr);
    hello->set_process_memory_refused(refused);
    Reply(out, absl::StatusCode::kOk, "");
    return true;
  }
  if (c.session.empty()) return false;  // hello first
  PassedMemory memory;
  if (request.has_pass_fd()) {
    if (absl::Status st = TakePassedFd(request.pass_fd(), std::move(fd), options_.cuda_vmm,
                                       &memory);
        !st.ok()) {
      Reply(out, st);
      return true;
    }
  } else if (request.has_open_shm()) {
    if (absl::Status st = OpenShmForOwner(request.open_shm().key(), c.peer.uid, &memory);
        !st.ok()) {
      Reply(out, st);
      return true;
    }
  } else {
    Reply(out, absl::StatusCode::kInvalidArgument,
          "LocalRequest needs one of hello, pass_fd and open_shm");
    return true;
  }
  const std::string ticket = RandomHex(16);
  v1::LocalTicket* reply = out->mutable_ticket();
  reply->set_ticket(ticket);
  reply->set_object_bytes(memory.object_bytes);
  reply->set_sealed(memory.sealed);
  std::lock_guard lock(mu_);
  const int held = tickets_per_session_[c.peer.session_id];
  const int of_uid = tickets_per_uid_[c.peer.uid];
  const char* limit = held >= options_.max_tickets_per_connection ? "this connection"
                      : of_uid >= options_.max_tickets_per_uid     ? "this uid"
                      : static_cast<int>(tickets_.size()) >= options_.max_tickets
                          ? "the server (all clients)"
                          : nullptr;
  if (limit != nullptr) {
    out->clear_ticket();
    Reply(out, absl::StatusCode::kResourceExhausted,
          absl::StrFormat("%s already holds the most unclaimed tickets it may (%d per "
                          "connection, %d per uid, %d in all): register them (RegisterRegion) "
                          "or wait %s for them to expire",
                          limit, options_.max_tickets_per_connection,
                          options_.max_tickets_per_uid, options_.max_tickets,
                          absl::FormatDuration(options_.ticket_timeout)));
    return true;
  }
  ++tickets_per_session_[c.peer.session_id];
  ++tickets_per_uid_[c.peer.uid];
  tickets_[ticket] = Ticket{c.peer.session_id, c.peer.uid,
                            absl::Now() + options_.ticket_timeout, std::move(memory)};
  Reply(out, absl::StatusCode::kOk, "");
  return true;
}

absl::StatusOr<std::string> DefaultLocalSocketPath(int port) {
  const std::string file = absl::StrCat("dgmm-", port, ".sock");
  if (mkdir("/run/dgmm", 0755) == 0 || errno == EEXIST) {
    if (access("/run/dgmm", W_OK | X_OK) == 0) return absl::StrCat("/run/dgmm/", file);
  }
  if (const char* xdg = std::getenv("XDG_RUNTIME_DIR"); xdg != nullptr && xdg[0] == '/') {
    if (access(xdg, W_OK | X_OK) == 0) return absl::StrCat(xdg, "/", file);
  }
  const std::string dir = absl::StrCat("/tmp/dgmm-", getuid());
  if (mkdir(dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot make ", dir, " for the local socket: ", ErrnoText(errno),
                     "; give --local_socket a path"));
  }
  struct stat st;
  if (lstat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != getuid()) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir, " is not a directory of this user; give --local_socket a path"));
  }
  return absl::StrCat(dir, "/", file);
}

}  // namespace dgmm
