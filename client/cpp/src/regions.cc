#include "dgmm/regions.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "dgmm/grpc_status.h"
#include "src/retry.h"
#include "src/trace_headers.h"

namespace dgmm {
namespace {

absl::Time DeadlineFromNow(const Client& client) { return absl::Now() + client.options().deadline; }

absl::Status ErrnoStatus(int error, absl::string_view what) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (error) {
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case EACCES:
    case EPERM:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case EEXIST:
      code = absl::StatusCode::kAlreadyExists;
      break;
    case EINVAL:
    case ENAMETOOLONG:
      code = absl::StatusCode::kInvalidArgument;
      break;
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(what, ": ", std::strerror(error)));
}

// "dgmm-<pid>-<n>": a memfd's name, unique among this process's regions.
std::string UniqueName() {
  static std::atomic<uint64_t> counter{0};
  return absl::StrFormat("dgmm-%d-%d", static_cast<int>(getpid()), counter.fetch_add(1));
}

// The longest one request on the local socket may take.
constexpr absl::Duration kLocalSocketWait = absl::Seconds(30);

// Sends all of `data`, with `pass_fd` (>= 0) as SCM_RIGHTS on its first bytes.
absl::Status SendFrame(int sock, const std::string& data, int pass_fd) {
  size_t sent = 0;
  while (sent < data.size()) {
    iovec iov{const_cast<char*>(data.data()) + sent, data.size() - sent};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (sent == 0 && pass_fd >= 0) {
      msg.msg_control = control;
      msg.msg_controllen = sizeof control;
      cmsghdr* h = CMSG_FIRSTHDR(&msg);
      h->cmsg_level = SOL_SOCKET;
      h->cmsg_type = SCM_RIGHTS;
      h->cmsg_len = CMSG_LEN(sizeof(int));
      std::memcpy(CMSG_DATA(h), &pass_fd, sizeof(int));
    }
    const ssize_t n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::UnavailableError(
          absl::StrCat("the server's local socket closed: ", std::strerror(errno)));
    }
    sent += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

absl::Status RecvAll(int sock, char* p, size_t bytes) {
  while (bytes > 0) {
    const ssize_t n = recv(sock, p, bytes, 0);
    if (n == 0) return absl::UnavailableError("the server closed its local socket");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        return absl::DeadlineExceededError(
            absl::StrCat("the server's local socket did not answer within ",
                         absl::FormatDuration(kLocalSocketWait)));
      }
      return absl::UnavailableError(
          absl::StrCat("reading the server's local socket: ", std::strerror(errno)));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// The destructor of a SharedMemoryRegion waits at most this long for its
// UnregisterRegion call (a server that is gone must not hang it).
constexpr absl::Duration kDestructorUnregisterWait = absl::Seconds(5);

absl::Status PrepareRegionCall(Client& client, grpc::ClientContext* context, absl::Time deadline,
                               bool await_connection = true);

absl::StatusOr<int> Unregister(Client& client, const std::string& name, absl::Time deadline) {
  grpc::ClientContext context;
  // Fail-fast, with no wait for a connection: a region's destructor calls
  // this, and must not hang on a server that is gone.
  if (absl::Status ok = PrepareRegionCall(client, &context, deadline, /*await_connection=*/false);
      !ok.ok()) {
    return ok;
  }
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  v1::UnregisterRegionResponse response;
  grpc::Status status = client.stub()->UnregisterRegion(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.unregistered();
}

// PrepareCall, a connected channel (unless not asked), and the region
// session's metadata.
absl::Status PrepareRegionCall(Client& client, grpc::ClientContext* context, absl::Time deadline,
                               bool await_connection) {
  if (absl::Status ok = client.PrepareCall(context, deadline); !ok.ok()) return ok;
  if (await_connection) {
    if (absl::Status up = client.AwaitChannel(deadline); !up.ok()) return up;
  }
  auto session = client.RegionSession();
  if (!session.ok()) return session.status();
  context->AddMetadata("dgmm-session", (*session)->hello().session());
  return absl::OkStatus();
}

absl::StatusOr<v1::RegionStatus> Register(Client& client,
                                          const v1::RegisterRegionRequest& request) {
  grpc::ClientContext context;
  if (absl::Status ok = PrepareRegionCall(client, &context, DeadlineFromNow(client)); !ok.ok()) {
    return ok;
  }
  v1::RegisterRegionResponse response;
  grpc::Status status = client.stub()->RegisterRegion(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_region());
}

}  // namespace

// ---------------------------------------------------------------- session

absl::StatusOr<std::unique_ptr<LocalSession>> LocalSession::Open(const std::string& path,
                                                                 const std::string& instance_id,
                                                                 bool process_memory) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof addr.sun_path) {
    return absl::FailedPreconditionError(
        absl::StrCat("the server reports no usable local socket ('", path,
                     "'): it runs without --allow_regions, or is too old for descriptor regions"));
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket(AF_UNIX)");
  std::unique_ptr<LocalSession> session(new LocalSession(fd, path));
  // The server answers each request at once (one poll loop, no work), so
  // this only bounds a hang: connecting, sending and each reply.
  const timeval limit{absl::ToInt64Seconds(kLocalSocketWait), 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &limit, sizeof limit);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    const int error = errno;
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot reach the server's local socket ", path, ": ", std::strerror(error),
        ". Regions need a client on the server's host that can open that path (in a "
        "container, mount its directory and set ClientOptions.local_socket); otherwise "
        "stream the job"));
  }
  v1::LocalRequest hello;
  v1::LocalHello* h = hello.mutable_hello();
  if (process_memory) {
    std::random_device random;
    for (unsigned char& b : session->cookie_) b = static_cast<unsigned char>(random());
    h->set_process_memory(true);
    h->set_cookie_address(reinterpret_cast<uint64_t>(session->cookie_.data()));
    h->set_cookie(session->cookie_.data(), session->cookie_.size());
  }
  auto reply = session->Call(hello, -1);
  if (!reply.ok()) return reply.status();
  if (reply->code() != 0 || !reply->has_hello()) {
    return absl::Status(static_cast<absl::StatusCode>(reply->code()),
                        absl::StrCat("local socket hello: ", reply->message()));
  }
  session->hello_ = reply->hello();
  if (!instance_id.empty() && session->hello_.instance_id() != instance_id) {
    return absl::FailedPreconditionError(
        absl::StrCat("the local socket ", path, " belongs to another dgmm server (instance ",
                     session->hello_.instance_id(), ", not ", instance_id, ")"));
  }
  return session;
}

LocalSession::~LocalSession() { close(fd_); }

// shutdown, not close: the descriptor stays this object's until it dies, so
// no other file can take its number while a request may still use it.
void LocalSession::Close() { shutdown(fd_, SHUT_RDWR); }

bool LocalSession::open() const {
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, 0) <= 0) return true;  // nothing to read: still open
  if ((p.revents & (POLLHUP | POLLERR)) != 0) return false;
  char byte;
  return recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT) != 0;
}

absl::StatusOr<v1::LocalResponse> LocalSession::Call(const v1::LocalRequest& request, int pass_fd) {
  const std::string body = request.SerializeAsString();
  std::string frame(4, '\0');
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((body.size() >> (8 * i)) & 0xff);
  frame += body;
  std::lock_guard lock(mu_);
  // A request that fails half-way leaves the stream out of step: the
  // session is over (the server drops its regions when it sees the close).
  auto broken = [this](absl::Status failure) {
    Close();
    return failure;
  };
  if (absl::Status sent = SendFrame(fd_, frame, pass_fd); !sent.ok()) return broken(sent);
  unsigned char head[4];
  if (absl::Status got = RecvAll(fd_, reinterpret_cast<char*>(head), 4); !got.ok()) {
    return broken(got);
  }
  const uint32_t len = head[0] | (head[1] << 8) | (head[2] << 16) | (uint32_t{head[3]} << 24);
  if (len > 4096) {
    return broken(absl::InternalError("the local socket sent a frame over 4096 bytes"));
  }
  std::string reply(len, '\0');
  if (absl::Status got = RecvAll(fd_, reply.data(), len); !got.ok()) return broken(got);
  v1::LocalResponse response;
  if (!response.ParseFromString(reply)) {
    return absl::InternalError("the local socket's reply does not parse as a LocalResponse");
  }
  return response;
}

namespace {

// The ticket of a pass_fd or open_shm reply, or its refusal as a status.
absl::StatusOr<v1::LocalTicket> TicketOf(absl::StatusOr<v1::LocalResponse> reply) {
  if (!reply.ok()) return reply.status();
  if (reply->code() != 0) {
    return absl::Status(static_cast<absl::StatusCode>(reply->code()), reply->message());
  }
  return std::move(*reply->mutable_ticket());
}

}  // namespace

absl::StatusOr<v1::LocalTicket> LocalSession::PassFd(int fd, v1::LocalFdKind kind, int device,
                                                     int64_t allocation_bytes) {
  v1::LocalRequest request;
  request.mutable_pass_fd()->set_kind(kind);
  request.mutable_pass_fd()->set_device(device);
  request.mutable_pass_fd()->set_allocation_bytes(allocation_bytes);
  return TicketOf(Call(request, fd));
}

absl::StatusOr<v1::LocalTicket> LocalSession::OpenShm(const std::string& key) {
  v1::LocalRequest request;
  request.mutable_open_shm()->set_key(key);
  return TicketOf(Call(request, -1));
}

absl::StatusOr<std::shared_ptr<LocalSession>> Client::RegionSession() {
  {
    std::lock_guard lock(session_mu_);
    if (session_ != nullptr && session_->open()) return session_;
  }
  // Connected first: the session may be the first call on a new channel,
  // or follow a server restart, where a call would fail at once. After a
  // restart the first call may still meet the old connection's end
  // (UNAVAILABLE): GetServerInfo is safe to repeat, so it is, twice.
  const absl::Time deadline = Deadline();
  absl::StatusOr<v1::GetServerInfoResponse> info;
  for (int attempt = 0;; ++attempt) {
    if (absl::Status up = AwaitChannel(deadline); !up.ok()) return up;
    info = GetServerInfo(deadline);
    if (info.ok() || info.status().code() != absl::StatusCode::kUnavailable || attempt == 2) break;
    const absl::Duration wait = absl::Milliseconds(100) * (1 << attempt);
    if (absl::Now() + wait >= deadline) break;
    absl::SleepFor(wait);
  }
  if (!info.ok()) return info.status();
  return RegionSessionWith(*info);
}

absl::StatusOr<std::shared_ptr<LocalSession>> Client::RegionSessionWith(
    const v1::GetServerInfoResponse& server) {
  std::lock_guard lock(session_mu_);
  if (session_ != nullptr && session_->open()) return session_;
  session_ = nullptr;
  const v1::GetServerInfoResponse* info = &server;
  if (!info->limits().regions_enabled()) {
    return absl::FailedPreconditionError(
        "this server does not take regions (it runs with --allow_regions=false); stream the job");
  }
  const std::string& path =
      options_.local_socket.empty() ? info->limits().local_socket() : options_.local_socket;
  auto opened = LocalSession::Open(path, info->instance_id(), options_.process_memory);
  if (!opened.ok()) return opened.status();
  session_ = std::move(*opened);
  return session_;
}

// ---------------------------------------------------------------- register

namespace {

// Passes `fd` through the client's session and registers its ticket.
absl::StatusOr<v1::RegionStatus> RegisterPassed(Client& client, const std::string& name, int fd,
                                                v1::LocalFdKind kind, int device,
                                                int64_t allocation_bytes, int64_t offset,
                                                int64_t byte_size) {
  auto session = client.RegionSession();
  if (!session.ok()) return session.status();
  auto ticket = (*session)->PassFd(fd, kind, device, allocation_bytes);
  if (!ticket.ok()) return ticket.status();
  v1::RegisterRegionRequest request;
  request.set_name(name);
  v1::LocalFdRegion* at = request.mutable_local_fd();
  at->set_ticket(ticket->ticket());
  at->set_offset(offset);
  at->set_byte_size(byte_size);
  return Register(client, request);
}

}  // namespace

absl::StatusOr<v1::RegionStatus> RegisterFdRegion(Client& client, const std::string& name, int fd,
                                                  int64_t offset, int64_t byte_size) {
  return RegisterPassed(client, name, fd, v1::LOCAL_FD_KIND_MEMORY, -1, 0, offset, byte_size);
}

absl::StatusOr<v1::RegionStatus> RegisterShmRegion(Client& client, const std::string& name,
                                                   const std::string& key, int64_t offset,
                                                   int64_t byte_size) {
  const int fd = shm_open(key.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW, 0);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open(", key, ")"));
  absl::StatusOr<v1::RegionStatus> registered =
      RegisterFdRegion(client, name, fd, offset, byte_size);
  close(fd);
  return registered;
}

absl::StatusOr<v1::RegionStatus> RegisterCudaVmmRegion(Client& client, const std::string& name,
                                                       int fd, int device, int64_t allocation_bytes,
                                                       int64_t offset, int64_t byte_size) {
  return RegisterPassed(client, name, fd, v1::LOCAL_FD_KIND_CUDA_VMM, device, allocation_bytes,
                        offset, byte_size);
}

absl::StatusOr<v1::RegionStatus> RegisterCudaIpcRegion(Client& client, const std::string& name,
                                                       absl::string_view handle, int device,
                                                       int64_t offset, int64_t byte_size) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  v1::CudaIpcRegion* ipc = request.mutable_cuda_ipc();
  ipc->set_handle(handle.data(), handle.size());
  ipc->set_device(device);
  ipc->set_offset(offset);
  ipc->set_byte_size(byte_size);
  return Register(client, request);
}

absl::StatusOr<int> UnregisterRegion(Client& client, const std::string& name) {
  return Unregister(client, name, DeadlineFromNow(client));
}

absl::StatusOr<v1::GetRegionStatusResponse> GetRegionStatus(Client& client,
                                                            const std::string& name) {
  grpc::ClientContext context;
  if (absl::Status ok = PrepareRegionCall(client, &context, DeadlineFromNow(client)); !ok.ok()) {
    return ok;
  }
  v1::GetRegionStatusRequest request;
  request.set_name(name);
  v1::GetRegionStatusResponse response;
  grpc::Status status = client.stub()->GetRegionStatus(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

v1::RegionRef ProcessMemoryRef(const void* address) {
  v1::RegionRef ref;
  ref.set_process_address(reinterpret_cast<uint64_t>(address));
  return ref;
}

v1::RegionRef MakeRegionRef(const std::string& name, int64_t offset) {
  v1::RegionRef ref;
  ref.set_name(name);
  ref.set_offset(offset);
  return ref;
}

RegionJob RegionJobOf(const Job& job, v1::RegionRef matrix, v1::RegionRef result,
                      CancelToken* cancel) {
  RegionJob rj;
  rj.rows = job.matrix.rows;
  rj.cols = job.matrix.cols;
  rj.dtype = job.matrix.dtype;
  rj.layout = job.matrix.layout;
  rj.side = job.side;
  rj.backend = job.backend;
  rj.matrix = std::move(matrix);
  rj.result = std::move(result);
  rj.diagonal = job.diagonal;
  rj.diagonal_bytes = job.diagonal_bytes;
  rj.right_diagonal = job.right_diagonal;
  rj.right_diagonal_bytes = job.right_diagonal_bytes;
  rj.diagonal_dtype = job.diagonal_dtype;
  rj.result_dtype = job.result_dtype;
  rj.deadline = job.deadline;
  rj.traceparent = job.traceparent;
  rj.tracestate = job.tracestate;
  rj.cancel = cancel;
  return rj;
}

absl::StatusOr<JobResult> MultiplyRegion(Client& client, const RegionJob& job) {
  v1::MultiplyRegionRequest request;
  v1::JobHeader* header = request.mutable_header();
  header->set_rows(job.rows);
  header->set_cols(job.cols);
  header->set_dtype(job.dtype);
  header->set_layout(job.layout);
  header->set_side(job.side);
  header->set_backend(job.backend);
  if (job.diagonal_bytes > 0) {
    header->set_diagonal(static_cast<const char*>(job.diagonal), job.diagonal_bytes);
  }
  if (job.right_diagonal_bytes > 0) {
    header->set_right_diagonal(static_cast<const char*>(job.right_diagonal),
                               job.right_diagonal_bytes);
  }
  header->set_diagonal_dtype(job.diagonal_dtype);
  header->set_result_dtype(job.result_dtype);
  *request.mutable_matrix() = job.matrix;
  *request.mutable_result() = job.result;
  if (job.diagonal_ref.has_value()) *request.mutable_diagonal() = *job.diagonal_ref;
  if (job.right_diagonal_ref.has_value()) {
    *request.mutable_right_diagonal() = *job.right_diagonal_ref;
  }

  std::string traceparent = job.traceparent;
  if (absl::Status ok = internal::ResolveTrace(&traceparent, job.tracestate, "RegionJob");
      !ok.ok()) {
    return ok;
  }
  const RetryPolicy& policy = client.options().retry;
  const absl::Time deadline = std::min(DeadlineFromNow(client), job.deadline);
  for (int made = 1;; ++made) {
    grpc::ClientContext context;
    if (absl::Status ok = PrepareRegionCall(client, &context, deadline); !ok.ok()) return ok;
    internal::AddTraceMetadata(&context, traceparent, job.tracestate);
    v1::MultiplyRegionResponse response;
    grpc::Status status;
    {
      // A cancel before the call starts cancels it as it starts.
      CancelToken::Watch watch(job.cancel, [&context] { context.TryCancel(); });
      status = client.stub()->MultiplyRegion(&context, request, &response);
    }
    if (status.ok()) {
      JobResult result;
      result.stats = std::move(*response.mutable_stats());
      result.mode = TransferMode::kUnary;
      result.attempts = made;
      result.traceparent = traceparent;
      return result;
    }
    absl::Status failure = FromGrpcStatus(status);
    // Only a full admission queue (with the server's pushback) is retried:
    // see MultiplyRegion's comment.
    std::optional<absl::Duration> pushback = RetryPushback(context);
    std::optional<absl::Duration> wait;
    if (failure.code() == absl::StatusCode::kResourceExhausted && pushback.has_value()) {
      wait = RetryDelay(policy, made, failure.code(), FailureOriginOf(context), pushback,
                        absl::Now(), deadline, RandomJitter());
    }
    if (!wait.has_value()) {
      absl::Status final_status =
          made == 1 ? failure
                    : absl::Status(failure.code(),
                                   absl::StrCat(failure.message(), " (after ", made, " attempts)"));
      if (pushback.has_value()) SetRetryAfter(&final_status, *pushback);
      return final_status;
    }
    if (!CancelToken::SleepUnlessCancelled(*wait, job.cancel)) {
      return absl::CancelledError("the job was cancelled");
    }
  }
}

absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> SharedMemoryRegion::Create(
    Client& client, size_t byte_size, const std::string& name) {
  if (byte_size == 0 || byte_size > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a host-memory region needs 1 to 2^63-1 bytes, not ", byte_size));
  }
  const std::string key = UniqueName();
  const int fd = memfd_create(key.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("memfd_create(", key, ")"));
  // From here on every failure closes the memfd.
  if (ftruncate(fd, static_cast<off_t>(byte_size)) != 0 ||
      fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoStatus(error,
                       absl::StrCat("sizing and sealing memfd ", key, " (", byte_size, " bytes)"));
  }
  void* data = mmap(nullptr, byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) {
    const int error = errno;
    close(fd);
    return ErrnoStatus(error, absl::StrCat("mmap(", key, ", ", byte_size, ")"));
  }
  // Transparent huge pages where the host allows them for shared memory
  // (/sys/kernel/mm/transparent_hugepage/shmem_enabled "advise" or more): a
  // new region's first touch then faults 2 MiB at a time, not 4 KiB. Where
  // it does not, this changes nothing.
  madvise(data, byte_size, MADV_HUGEPAGE);
  const std::string region_name = name.empty() ? key : name;
  // Owns the mapping and the memfd from here (the destructor releases them).
  std::unique_ptr<SharedMemoryRegion> region(
      new SharedMemoryRegion(&client, region_name, key, fd, data, byte_size));
  absl::StatusOr<v1::RegionStatus> registered =
      RegisterFdRegion(client, region_name, fd, 0, static_cast<int64_t>(byte_size));
  if (!registered.ok()) return registered.status();
  region->registered_ = true;
  region->registration_ = *std::move(registered);
  {
    std::lock_guard lock(client.own_regions_mu_);
    client.own_regions_[reinterpret_cast<uintptr_t>(data)] = {byte_size, region_name};
  }
  return region;
}

SharedMemoryRegion::SharedMemoryRegion(Client* client, std::string name, std::string key, int fd,
                                       void* data, size_t size)
    : client_(client),
      name_(std::move(name)),
      key_(std::move(key)),
      fd_(fd),
      data_(data),
      size_(size) {}

void SharedMemoryRegion::Forget() {
  std::lock_guard lock(client_->own_regions_mu_);
  client_->own_regions_.erase(reinterpret_cast<uintptr_t>(data_));
}

std::optional<v1::RegionRef> Client::OwnRegionRef(const void* p, size_t bytes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard lock(own_regions_mu_);
  auto it = own_regions_.upper_bound(at);
  if (it == own_regions_.begin()) return std::nullopt;
  --it;
  if (at + bytes > it->first + it->second.bytes) return std::nullopt;
  return MakeRegionRef(it->second.name, static_cast<int64_t>(at - it->first));
}

SharedMemoryRegion::~SharedMemoryRegion() {
  Forget();
  if (registered_) {
    registered_ = false;
    (void)dgmm::Unregister(
        *client_, name_,
        std::min(DeadlineFromNow(*client_), absl::Now() + kDestructorUnregisterWait));
  }
  munmap(data_, size_);
  close(fd_);
}

absl::Status SharedMemoryRegion::Unregister() {
  Forget();
  if (!registered_) return absl::OkStatus();
  registered_ = false;
  absl::StatusOr<int> unregistered = UnregisterRegion(*client_, name_);
  return unregistered.ok() ? absl::OkStatus() : unregistered.status();
}

}  // namespace dgmm
