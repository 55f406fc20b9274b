// Regions: the same-host data plane of dgmm (proto/dgmm/v1/dgmm.proto,
// "regions"; docs/protocol.md "Regions").
//
// A client on the server's host puts its matrix in memory the server can
// reach, registers that memory once under a name, and then runs jobs whose
// matrix, result and (optionally) diagonal live there: requests and responses
// carry only the header and the stats, no payload bytes.
//
//  - SharedMemoryRegion (host memory): creates a POSIX shared-memory object
//    under a unique key, sizes and maps it, and registers it with a Client;
//    its destructor unregisters it, unmaps it and unlinks the object.
//  - RegisterCudaIpcRegion (GPU memory): registers the 64 bytes of a
//    cudaIpcMemHandle_t the caller got from cudaIpcGetMemHandle. The handle is
//    opaque here: this library does not use CUDA.
//  - MultiplyRegion: one job on registered regions.
//
// The server must run with --allow_regions (else every region RPC is
// FAILED_PRECONDITION) and see this host's /dev/shm (else RegisterRegion is
// NOT_FOUND: the server is remote, or in another IPC namespace). Regions
// belong to the client that registered them: its bearer token when the server
// has tokens, else its address.
//
// Errors are absl::Status with the call's gRPC code and the server's message
// (the status table above the region messages in dgmm.proto); problems of the
// local shared-memory object (shm_open, ftruncate, mmap) are the errno's
// code with the call named.
#ifndef DGMM_CLIENT_CPP_INCLUDE_DGMM_REGIONS_H_
#define DGMM_CLIENT_CPP_INCLUDE_DGMM_REGIONS_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "dgmm/client.h"
#include "dgmm/v1/dgmm.pb.h"

namespace dgmm {

// Registers byte_size bytes at `offset` of the shared-memory object `key`
// (created by the caller: shm_open, ftruncate) as region `name`.
absl::StatusOr<v1::RegionStatus> RegisterShmRegion(Client& client, const std::string& name,
                                                   const std::string& key, int64_t offset,
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
};

// Runs `job` (MultiplyRegion). The result's stats count the region bytes
// read and written (bytes_in, bytes_out); its mode is kUnary (one unary
// call). Retried, within ClientOptions.deadline, only when the server's
// admission queue was full (RESOURCE_EXHAUSTED with grpc-retry-pushback-ms):
// the job never started, so even an in-place job is safe to send again.
// UNAVAILABLE is final here, unlike for Client::Multiply: a region lives on
// one server, which another replica or a restarted server does not know.
absl::StatusOr<JobResult> MultiplyRegion(Client& client, const RegionJob& job);

// A POSIX shared-memory object of this process, mapped here and registered
// with a Client as one region (offset 0, its whole size). Write the matrix
// (and diagonal) into bytes(), run MultiplyRegion with Ref(offset)s, read C
// from bytes().
//
// The object is created with shm_open(key, O_CREAT | O_EXCL | O_RDWR, 0600)
// under a key unique to this process ("/dgmm-<pid>-<n>-<random>"), sized with
// ftruncate (its pages are allocated as they are first written) and mapped
// MAP_SHARED. Destroying the SharedMemoryRegion unregisters it (waiting at
// most 5 s, or less under ClientOptions.deadline; errors are ignored: use
// Unregister() to see them), unmaps it and unlinks the object.
// A process that dies without that leaves the object in /dev/shm; the server
// drops the region once the object is unlinked or after
// --region_idle_timeout_s.
//
// The Client must outlive the region. Not thread-safe to destroy while
// another thread uses it; jobs on it may run from several threads.
class SharedMemoryRegion {
 public:
  // Creates, maps and registers `byte_size` (> 0) bytes as region `name`
  // (empty: the key without its leading "/", which is a valid name). On any
  // error nothing is left behind: the object is unlinked and unmapped.
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
  // The region's name on the server and the object's shm_open key.
  const std::string& name() const { return name_; }
  const std::string& key() const { return key_; }
  // What RegisterRegion answered (register_ns, pinned, ...).
  const v1::RegionStatus& registration() const { return registration_; }
  // A RegionRef `offset` bytes into this region.
  v1::RegionRef Ref(int64_t offset = 0) const { return MakeRegionRef(name_, offset); }

  // Unregisters the region now and returns the server's answer; the mapping
  // and the object stay until destruction. Later calls (and the destructor)
  // do not unregister again.
  absl::Status Unregister();

 private:
  SharedMemoryRegion(Client* client, std::string name, std::string key, void* data, size_t size);

  Client* client_;
  std::string name_;
  std::string key_;
  void* data_;
  size_t size_;
  bool registered_ = false;
  v1::RegionStatus registration_;
};

}  // namespace dgmm

#endif  // DGMM_CLIENT_CPP_INCLUDE_DGMM_REGIONS_H_
