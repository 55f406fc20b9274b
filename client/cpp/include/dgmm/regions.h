// Regions: the same-host data plane of dgmm (proto/dgmm/v1/dgmm.proto,
// "regions"; docs/protocol.md "Regions" and "The local socket").
//
// A client on the server's host puts its matrix in memory the server can
// reach, registers that memory once under a name, and then runs jobs whose
// matrix, result and (optionally) diagonal live there: requests and responses
// carry only the header and the stats, no payload bytes.
//
// The server never opens memory by name for a client: the client passes the
// descriptor of memory it opened itself through the server's local socket
// (a Unix socket; the kernel tells the server the client's uid), and
// registers the ticket it gets back. Each Client keeps one session on that
// socket (Client::RegionSession), opened at its first region call; every
// region call carries it. Regions belong to this process's uid (and bearer
// token, when the server has several) and are unregistered by the server
// when the session closes (this Client is destroyed or the process exits).
//
//  - SharedMemoryRegion (host memory): a memfd of this process, sealed
//    against shrinking and growing, mapped here and registered; its
//    destructor unregisters it and unmaps it.
//  - RegisterFdRegion / RegisterShmRegion: memory the caller made (any memfd
//    or POSIX shared-memory object it can open for reading and writing).
//  - RegisterCudaIpcRegion, RegisterCudaVmmRegion (GPU memory): a
//    cudaIpcMemHandle_t, or the POSIX descriptor of a cuMemCreate allocation.
//    Opaque here: this library does not use CUDA.
//  - MultiplyRegion: one job on registered regions.
//
// The server must run with --allow_regions (else every region RPC is
// FAILED_PRECONDITION) on this host: for a remote server the local socket
// cannot be reached, and the first region call says so (FAILED_PRECONDITION).
//
// Errors are absl::Status with the call's gRPC code and the server's message
// (the status table above the region messages in dgmm.proto); problems of
// local memory (memfd_create, ftruncate, mmap) are the errno's code with the
// call named.
#ifndef DGMM_CLIENT_CPP_INCLUDE_DGMM_REGIONS_H_
#define DGMM_CLIENT_CPP_INCLUDE_DGMM_REGIONS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dgmm/client.h"
#include "dgmm/v1/dgmm.pb.h"

namespace dgmm {

// A session on the server's local socket (docs/protocol.md "The local
// socket"): the connection, its hello, and the requests that pass memory.
// Thread-safe. Closing it (destroying it) ends the session: the server
// unregisters the regions registered through it.
class LocalSession {
 public:
  // Connects to `path`, says hello and checks that the socket belongs to
  // the server with GetServerInfo's `instance_id` (when not empty).
  // FAILED_PRECONDITION when the path cannot be reached (the server is on
  // another host, or its socket is not mounted here) or another server
  // listens there.
  //
  // With `process_memory`, the hello also asks that this session's jobs may
  // name this process's own memory (ProcessMemoryRef, RegionRef
  // .process_address); process_memory() says whether the server granted it
  // and hello().process_memory_refused() why not.
  static absl::StatusOr<std::unique_ptr<LocalSession>> Open(const std::string& path,
                                                            const std::string& instance_id,
                                                            bool process_memory = false);
  ~LocalSession();
  LocalSession(const LocalSession&) = delete;
  LocalSession& operator=(const LocalSession&) = delete;

  // The metadata value of `dgmm-session`, and the rest of the hello (the
  // uid and pid the server saw).
  const v1::LocalHelloReply& hello() const { return hello_; }
  // False once the server has closed the connection, or this end has
  // (Close(), or a request that failed half-way and left the stream out of
  // step).
  bool open() const;
  // Ends the session now (the server drops its regions); the object stays
  // valid and open() is false from then on.
  void Close();
  // The socket's path as this process reached it.
  const std::string& path() const { return path_; }
  // Whether jobs of this session may name this process's memory.
  bool process_memory() const { return hello_.process_memory(); }

  // Passes `fd` (borrowed: the caller keeps and closes it) for a ticket.
  absl::StatusOr<v1::LocalTicket> PassFd(int fd, v1::LocalFdKind kind = v1::LOCAL_FD_KIND_MEMORY,
                                         int device = -1, int64_t allocation_bytes = 0);
  // Asks the server to open POSIX shared-memory object `key` (one this uid
  // owns and nobody else may write) for a ticket; for clients that cannot
  // pass descriptors.
  absl::StatusOr<v1::LocalTicket> OpenShm(const std::string& key);

 private:
  LocalSession(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  absl::StatusOr<v1::LocalResponse> Call(const v1::LocalRequest& request, int pass_fd);

  const int fd_;
  const std::string path_;
  v1::LocalHelloReply hello_;
  // Random bytes the server reads back (LocalHello.cookie) to prove that
  // this process is still the one at the pid it saw; in place while the
  // session lasts.
  std::array<unsigned char, 32> cookie_{};
  std::mutex mu_;  // one request at a time
};

// Registers byte_size bytes at `offset` of the host memory `fd` (a memfd or
// a POSIX shared-memory object, open for reading and writing; borrowed) as
// region `name`.
absl::StatusOr<v1::RegionStatus> RegisterFdRegion(Client& client, const std::string& name,
                                                  int fd, int64_t offset, int64_t byte_size);

// Registers byte_size bytes at `offset` of the POSIX shared-memory object
// `key` (created by the caller: shm_open, ftruncate): this process opens it
// and passes its descriptor (RegisterFdRegion).
absl::StatusOr<v1::RegionStatus> RegisterShmRegion(Client& client, const std::string& name,
                                                   const std::string& key, int64_t offset,
                                                   int64_t byte_size);

// Registers GPU memory made with cuMemCreate (requested handle type
// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) and exported with
// cuMemExportToShareableHandle as `fd` (borrowed): byte_size bytes at `offset`
// of the allocation of `allocation_bytes` on CUDA device `device`.
absl::StatusOr<v1::RegionStatus> RegisterCudaVmmRegion(Client& client, const std::string& name,
                                                       int fd, int device,
                                                       int64_t allocation_bytes, int64_t offset,
                                                       int64_t byte_size);

// Registers GPU memory: byte_size bytes at `offset` from the base of the
// allocation whose cudaIpcMemHandle_t is `handle` (its 64 raw bytes, e.g.
// std::string(reinterpret_cast<const char*>(&h), sizeof h)), on CUDA device
// `device` as the server numbers them (GetServerInfo.devices[].index).
// FAILED_PRECONDITION on a server without that GPU (a CPU server).
absl::StatusOr<v1::RegionStatus> RegisterCudaIpcRegion(Client& client, const std::string& name,
                                                       absl::string_view handle, int device,
                                                       int64_t offset, int64_t byte_size);

// Unregisters region `name`, or every region of this client when `name` is
// empty; returns how many were unregistered. A job using a region finishes
// first; the server releases its memory when the job ends.
absl::StatusOr<int> UnregisterRegion(Client& client, const std::string& name);

// This client's regions (one when `name` is given: NOT_FOUND if there is no
// such region), the bytes registered by all clients together, and the budget.
absl::StatusOr<v1::GetRegionStatusResponse> GetRegionStatus(Client& client,
                                                            const std::string& name = "");

// A place in a region.
v1::RegionRef MakeRegionRef(const std::string& name, int64_t offset = 0);

// One job on regions. The matrix is read at `matrix`, C is written at
// `result` (the same name and offset as `matrix` for in place; a result that
// partly overlaps the matrix is INVALID_ARGUMENT), both rows*cols elements
// of `dtype` in `layout` order. The diagonal is `diagonal` (inline bytes, in
// the request) unless `diagonal_ref` is set, then it is read from that
// region; it has cols elements for SIDE_RIGHT and rows for SIDE_LEFT.
struct RegionJob {
  int64_t rows = 0;
  int64_t cols = 0;
  v1::DType dtype = v1::DTYPE_FLOAT32;
  v1::Layout layout = v1::LAYOUT_ROW_MAJOR;
  v1::Side side = v1::SIDE_RIGHT;
  v1::Backend backend = v1::BACKEND_AUTO;
  v1::RegionRef matrix;
  v1::RegionRef result;
  const void* diagonal = nullptr;
  size_t diagonal_bytes = 0;
  std::optional<v1::RegionRef> diagonal_ref;
  // SIDE_BOTH: the right diagonal, inline or (with diagonal_ref) in a
  // region; and the diagonals' and the result's dtypes (Job's).
  const void* right_diagonal = nullptr;
  size_t right_diagonal_bytes = 0;
  std::optional<v1::RegionRef> right_diagonal_ref;
  v1::DType diagonal_dtype = v1::DTYPE_UNSPECIFIED;
  v1::DType result_dtype = v1::DTYPE_UNSPECIFIED;
  // The job's own deadline (Job::deadline); the earlier of it and
  // ClientOptions.deadline applies.
  absl::Time deadline = absl::InfiniteFuture();
  // Cancels the call (and any wait between its attempts); may be null.
  CancelToken* cancel = nullptr;
  // W3C trace context for the call (Job's): empty, a new traceparent.
  std::string traceparent;
  std::string tracestate;
};

// A place in this process's own memory, for a session granted process
// memory (LocalSession::process_memory()): the server reads the matrix from
// there, or writes the result there, itself.
v1::RegionRef ProcessMemoryRef(const void* address);

// The RegionJob of `job` (its shape, dtype, layout, side, backend and
// inline diagonal) with the matrix read at `matrix` and C written at `result`;
// `cancel` (may be null) ends its call.
RegionJob RegionJobOf(const Job& job, v1::RegionRef matrix, v1::RegionRef result,
                      CancelToken* cancel = nullptr);

// Runs `job` (MultiplyRegion). The result's stats count the region bytes
// read and written (bytes_in, bytes_out); its mode is kUnary (one unary
// call). Each attempt first waits for the client's connection
// (Client::AwaitChannel). Retried, within ClientOptions.deadline, only when
// the server's admission queue was full (RESOURCE_EXHAUSTED with
// grpc-retry-pushback-ms): the job never started, so even an in-place job is
// safe to send again. UNAVAILABLE is final here, unlike for
// Client::Multiply: a call the transport cut off may have started (and may
// still be writing C, or have scaled part of A in place), and a region
// lives on one server, which another replica or a restarted server does not
// know.
absl::StatusOr<JobResult> MultiplyRegion(Client& client, const RegionJob& job);

// Host memory of this process, mapped here and registered with a Client as
// one region (offset 0, its whole size). Write the matrix (and diagonal) into
// bytes(), run MultiplyRegion with Ref(offset)s, read C from bytes().
//
// The memory is a memfd (memfd_create "dgmm-<pid>-<n>", nothing in
// /dev/shm), sized with ftruncate (its pages are allocated as they are first
// written), sealed with F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL (so nobody
// can shrink it under the server), mapped MAP_SHARED and passed to the
// server. Destroying the SharedMemoryRegion unregisters it (waiting at most
// 5 s, or less under ClientOptions.deadline; errors are ignored: use
// Unregister() to see them) and unmaps it. A process that dies without that
// leaves nothing behind: its session closes and the server drops the region.
//
// Client::Multiply recognises this memory: a job whose matrix (and output)
// lie in SharedMemoryRegions of the same Client runs there with
// MultiplyRegion, with no copy (JobResult::mode kRegion); so a region is
// also the C++ buffer type of the same-host path.
//
// The Client must outlive the region. Not thread-safe to destroy while
// another thread uses it; jobs on it may run from several threads.
class SharedMemoryRegion {
 public:
  // Creates, maps and registers `byte_size` (> 0) bytes as region `name`
  // (empty: the memfd's name, "dgmm-<pid>-<n>"). On any error nothing is
  // left behind: the memfd is unmapped and closed.
  static absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> Create(Client& client,
                                                                    size_t byte_size,
                                                                    const std::string& name = "");

  ~SharedMemoryRegion();
  SharedMemoryRegion(const SharedMemoryRegion&) = delete;
  SharedMemoryRegion& operator=(const SharedMemoryRegion&) = delete;

  // The mapped bytes, shared with the server.
  char* bytes() { return static_cast<char*>(data_); }
  const char* bytes() const { return static_cast<const char*>(data_); }
  size_t size() const { return size_; }
  // The region's name on the server, and the memfd's name.
  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  // The memfd (owned; valid while the region lives).
  int fd() const { return fd_; }
  // What RegisterRegion answered (register_ns, pinned, ...).
  const v1::RegionStatus& registration() const { return registration_; }
  // A RegionRef `offset` bytes into this region.
  v1::RegionRef Ref(int64_t offset = 0) const { return MakeRegionRef(name_, offset); }

  // Unregisters the region now and returns the server's answer; the mapping
  // and the object stay until destruction. Later calls (and the destructor)
  // do not unregister again.
  absl::Status Unregister();
  // Forgets the registration without a call (the destructor then only
  // unmaps): for a region whose session is known to have closed, where the
  // server has dropped it already.
  void Abandon() {
    Forget();
    registered_ = false;
  }

 private:
  SharedMemoryRegion(Client* client, std::string name, std::string key, int fd, void* data,
                     size_t size);
  // Takes it off the client's list of its regions (Client::Multiply no
  // longer runs jobs in it).
  void Forget();

  Client* client_;
  std::string name_;
  std::string key_;
  int fd_;
  void* data_;
  size_t size_;
  bool registered_ = false;
  v1::RegionStatus registration_;
};

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_INCLUDE_DGMM_REGIONS_H_
