// The server's local socket (docs/protocol.md "The local socket";
// the messages are LocalRequest and LocalResponse in dgmm.proto): a Unix
// domain socket beside the gRPC port through which a client on this host
// gets a region session and passes the descriptors of its memory.
//
// gRPC cannot do this part: HTTP/2 carries no descriptors, and gRPC 1.51's
// auth context for local (unix:) connections names only the security type,
// not the peer's uid. Here the kernel tells the server who sent each message
// (SCM_CREDENTIALS: uid, gid, pid; a session is its hello's sender's, not
// the connecting process's), and a client can only pass memory it opened
// itself, so the server never opens anything with its own rights for a
// client (LocalOpenShm, for clients that cannot pass descriptors, opens an
// object only when the connection's uid owns it and nobody else may write
// it).
//
// One thread polls the listening socket and every connection; requests are
// small and answered at once. Bounded: connections (in all and per uid),
// unclaimed tickets per connection, and ticket lifetimes.
#ifndef DGMM_SERVICE_REGIONS_LOCAL_SOCKET_H_
#define DGMM_SERVICE_REGIONS_LOCAL_SOCKET_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dgmm/v1/dgmm.pb.h"
#include "service/regions/passed_memory.h"
#include "service/regions/process_memory.h"

namespace dgmm {

struct LocalSocketOptions {
  // Where to listen. The parent directory must exist.
  std::string path;
  // Permission bits of the socket file (who may connect: safe for anyone,
  // because a client can register only memory it could open itself).
  mode_t mode = 0666;
  int max_connections = 1024;
  // Most connections of one uid (a quarter of max_connections by default).
  int max_connections_per_uid = 256;
  int max_tickets_per_connection = 8;
  // Unclaimed tickets (each holds a descriptor) of one uid, and in all.
  int max_tickets_per_uid = 64;
  int max_tickets = 256;
  absl::Duration ticket_timeout = absl::Seconds(30);
  // A connection that has not said hello by then is closed.
  absl::Duration hello_timeout = absl::Seconds(10);
  // GetServerInfoResponse.instance_id, repeated in every hello.
  std::string instance_id;
  // Whether a hello may ask for process memory (--process_memory).
  bool process_memory = true;
  // Whether this server can import CUDA VMM descriptors (it has a GPU in
  // use): without, a pass_fd of that kind is refused at once.
  bool cuda_vmm = false;
};

class LocalSocket {
 public:
  // Called on the socket's thread when a session's connection closes.
  using SessionClosed = std::function<void(uint64_t session_id)>;

  // Binds `options.path` (a stale socket file of a dead server is replaced;
  // a live one is FAILED_PRECONDITION) and starts serving.
  static absl::StatusOr<std::unique_ptr<LocalSocket>> Start(LocalSocketOptions options,
                                                            SessionClosed on_closed);
  // Closes every connection (their tickets too) and removes the socket file.
  ~LocalSocket();
  LocalSocket(const LocalSocket&) = delete;
  LocalSocket& operator=(const LocalSocket&) = delete;

  const std::string& path() const { return options_.path; }
  // Removes the socket file (once): no new client finds it. Sessions already
  // open go on. For a server that drains before it exits.
  void Unlink();

  // The open session whose secret is `session` (the metadata
  // `dgmm-session`), or UNAUTHENTICATED.
  absl::StatusOr<LocalPeer> FindSession(absl::string_view session) const;
  // Takes (once) ticket `ticket` of session `session_id`: NOT_FOUND when it
  // does not exist, expired, was taken, or is another session's.
  absl::StatusOr<PassedMemory> TakeTicket(uint64_t session_id, absl::string_view ticket);

  int64_t connections() const { return connections_.load(); }
  int64_t tickets() const;

 private:
  struct Conn;
  LocalSocket(LocalSocketOptions options, SessionClosed on_closed);
  void Loop();
  void Accept();
  // Reads what `c` sent and answers every whole request; false: close it.
  bool Serve(Conn& c);
  // One request; false when the connection breaks the protocol.
  bool Handle(Conn& c, const v1::LocalRequest& request, OwnedFd fd, v1::LocalResponse* out);
  void Close(int fd);
  void Expire(absl::Time now);

  const LocalSocketOptions options_;
  const SessionClosed on_closed_;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd: stop
  std::atomic<bool> stopping_{false};
  std::atomic<bool> unlinked_{false};
  std::atomic<int64_t> connections_{0};
  std::thread thread_;

  // The socket's thread owns the connections; sessions and tickets are also
  // read by gRPC handlers.
  std::map<int, std::unique_ptr<Conn>> conns_;  // by descriptor, thread only
  struct Ticket {
    uint64_t session_id = 0;
    uid_t uid = 0;
    absl::Time expires;
    PassedMemory memory;
  };
  // Forgets ticket `it`'s counts; returns what follows it.
  std::map<std::string, Ticket, std::less<>>::iterator EraseTicket(
      std::map<std::string, Ticket, std::less<>>::iterator it) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable std::mutex mu_;
  std::map<std::string, LocalPeer, std::less<>> sessions_ ABSL_GUARDED_BY(mu_);  // by secret
  std::map<std::string, Ticket, std::less<>> tickets_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, int> tickets_per_session_ ABSL_GUARDED_BY(mu_);
  std::map<uid_t, int> tickets_per_uid_ ABSL_GUARDED_BY(mu_);
};

// The default --local_socket path for a server on gRPC port `port`:
// /run/dgmm/dgmm-<port>.sock when /run/dgmm exists or can be made (root),
// else $XDG_RUNTIME_DIR/dgmm-<port>.sock, else /tmp/dgmm-<uid>/dgmm-<port>.sock
// (made 0755 and owned by this uid; refused when another uid owns it).
absl::StatusOr<std::string> DefaultLocalSocketPath(int port);

}  // namespace dgmm

#endif  // DGMM_SERVICE_REGIONS_LOCAL_SOCKET_H_
