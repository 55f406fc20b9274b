#include "dgmm/regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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
#include "dgmm/grpc_status.h"
#include "src/retry.h"

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

// "/dgmm-<pid>-<n>-<random>": unique among this process's regions (n) and
// unlikely to meet a stale object of an earlier process with the same pid.
std::string UniqueKey() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("/dgmm-%d-%d-%08x", static_cast<int>(getpid()), counter.fetch_add(1),
                         static_cast<uint32_t>(rng()));
}

// The destructor of a SharedMemoryRegion waits at most this long for its
// UnregisterRegion call (a server that is gone must not hang it).
constexpr absl::Duration kDestructorUnregisterWait = absl::Seconds(5);

absl::StatusOr<int> Unregister(Client& client, const std::string& name, absl::Time deadline) {
  grpc::ClientContext context;
  if (absl::Status ok = client.PrepareCall(&context, deadline); !ok.ok()) return ok;
  v1::UnregisterRegionRequest request;
  request.set_name(name);
  v1::UnregisterRegionResponse response;
  grpc::Status status = client.stub()->UnregisterRegion(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response.unregistered();
}

absl::StatusOr<v1::RegionStatus> Register(Client& client, const v1::RegisterRegionRequest& request) {
  grpc::ClientContext context;
  if (absl::Status ok = client.PrepareCall(&context, DeadlineFromNow(client)); !ok.ok()) return ok;
  v1::RegisterRegionResponse response;
  grpc::Status status = client.stub()->RegisterRegion(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return std::move(*response.mutable_region());
}

}  // namespace

absl::StatusOr<v1::RegionStatus> RegisterShmRegion(Client& client, const std::string& name,
                                                   const std::string& key, int64_t offset,
                                                   int64_t byte_size) {
  v1::RegisterRegionRequest request;
  request.set_name(name);
  v1::SystemShmRegion* shm = request.mutable_system_shm();
  shm->set_key(key);
  shm->set_offset(offset);
  shm->set_byte_size(byte_size);
  return Register(client, request);
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
  if (absl::Status ok = client.PrepareCall(&context, DeadlineFromNow(client)); !ok.ok()) return ok;
  v1::GetRegionStatusRequest request;
  request.set_name(name);
  v1::GetRegionStatusResponse response;
  grpc::Status status = client.stub()->GetRegionStatus(&context, request, &response);
  if (!status.ok()) return FromGrpcStatus(status);
  return response;
}

v1::RegionRef MakeRegionRef(const std::string& name, int64_t offset) {
  v1::RegionRef ref;
  ref.set_name(name);
  ref.set_offset(offset);
  return ref;
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
  *request.mutable_matrix() = job.matrix;
  *request.mutable_result() = job.result;
  if (job.diagonal_ref.has_value()) *request.mutable_diagonal() = *job.diagonal_ref;

  const RetryPolicy& policy = client.options().retry;
  const absl::Time deadline = DeadlineFromNow(client);
  for (int made = 1;; ++made) {
    grpc::ClientContext context;
    if (absl::Status ok = client.PrepareCall(&context, deadline); !ok.ok()) return ok;
    v1::MultiplyRegionResponse response;
    grpc::Status status = client.stub()->MultiplyRegion(&context, request, &response);
    if (status.ok()) {
      JobResult result;
      result.stats = std::move(*response.mutable_stats());
      result.mode = TransferMode::kUnary;
      result.attempts = made;
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
      if (made == 1) return failure;
      return absl::Status(failure.code(),
                          absl::StrCat(failure.message(), " (after ", made, " attempts)"));
    }
    absl::SleepFor(*wait);
  }
}

absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> SharedMemoryRegion::Create(
    Client& client, size_t byte_size, const std::string& name) {
  if (byte_size == 0 || byte_size > static_cast<size_t>(std::numeric_limits<int64_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("a shared-memory region needs 1 to 2^63-1 bytes, not ", byte_size));
  }
  const std::string key = UniqueKey();
  const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("shm_open(", key, ")"));
  // From here on every failure unlinks the object.
  if (ftruncate(fd, static_cast<off_t>(byte_size)) != 0) {
    const int error = errno;
    close(fd);
    shm_unlink(key.c_str());
    return ErrnoStatus(error, absl::StrCat("ftruncate(", key, ", ", byte_size, ")"));
  }
  void* data = mmap(nullptr, byte_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int mmap_error = errno;
  close(fd);  // the mapping keeps the object open
  if (data == MAP_FAILED) {
    shm_unlink(key.c_str());
    return ErrnoStatus(mmap_error, absl::StrCat("mmap(", key, ", ", byte_size, ")"));
  }
  const std::string region_name = name.empty() ? key.substr(1) : name;
  // Owns the mapping and the object from here (the destructor unlinks them).
  std::unique_ptr<SharedMemoryRegion> region(
      new SharedMemoryRegion(&client, region_name, key, data, byte_size));
  absl::StatusOr<v1::RegionStatus> registered =
      RegisterShmRegion(client, region_name, key, 0, static_cast<int64_t>(byte_size));
  if (!registered.ok()) return registered.status();
  region->registered_ = true;
  region->registration_ = *std::move(registered);
  return region;
}

SharedMemoryRegion::SharedMemoryRegion(Client* client, std::string name, std::string key,
                                       void* data, size_t size)
    : client_(client), name_(std::move(name)), key_(std::move(key)), data_(data), size_(size) {}

SharedMemoryRegion::~SharedMemoryRegion() {
  // Unregister before unlinking: the server also drops a region whose object
  // is unlinked, but only at its next sweep.
  if (registered_) {
    registered_ = false;
    (void)dgmm::Unregister(*client_, name_,
                           std::min(DeadlineFromNow(*client_),
                                    absl::Now() + kDestructorUnregisterWait));
  }
  munmap(data_, size_);
  shm_unlink(key_.c_str());
}

absl::Status SharedMemoryRegion::Unregister() {
  if (!registered_) return absl::OkStatus();
  registered_ = false;
  absl::StatusOr<int> unregistered = UnregisterRegion(*client_, name_);
  return unregistered.ok() ? absl::OkStatus() : unregistered.status();
}

}  // namespace dgmm
