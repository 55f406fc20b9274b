// `dgmm-cli multiply`: from .npy files or random operands, with an optional
// check against a float64 reference.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "cli/commands.h"
#include "cli/progress_bar.h"
#include "cli/reference.h"
#include "dgmm/host_memory.h"
#include "dgmm/npy.h"
#include "dgmm/regions.h"

ABSL_FLAG(std::string, matrix, "",
          "The matrix A: a 2-D .npy file, C or Fortran order, of float16 ('<f2'), bfloat16 "
          "(ml_dtypes.bfloat16, saved by NumPy as '<V2'), float32, float64, complex64 or "
          "complex128.");
ABSL_FLAG(std::string, diag, "",
          "The diagonal d (--side right or left): a 1-D .npy file of A's dtype or one the server "
          "promotes into it (e.g. float32 d for a float64 A).");
ABSL_FLAG(std::string, left, "",
          "With --side both: the left diagonal l (len rows), a 1-D .npy file.");
ABSL_FLAG(std::string, right, "",
          "With --side both: the right diagonal r (len cols), a 1-D .npy file of l's dtype.");
ABSL_FLAG(std::string, out, "",
          "Where to write C as .npy (A's shape and order; the result dtype: NumPy's result type "
          "of A and d, or --result_dtype).");
ABSL_FLAG(std::string, side, "right",
          "right: C = A·diag(d), len(d) = cols; left: C = diag(d)·A, len(d) = rows; both: "
          "C = diag(l)·A·diag(r) in one pass (--left and --right).");
ABSL_FLAG(std::string, backend, "auto",
          "auto, cpu, cuda-kernel or cublas, or BACKEND_AUTO etc. (a hint; auto is the "
          "server's best).");
ABSL_FLAG(int, stripes, 0,
          "Parts the job is striped into, each on its own connection; 0 (default): auto, "
          "min(8, matrix bytes / 32 MiB), so jobs under 64 MiB go whole.");
ABSL_FLAG(std::string, mode, "auto",
          "auto (one message when it fits, else streamed), unary or stream.");
ABSL_FLAG(int64_t, random, 0,
          "Instead of files: a random N-row matrix and diagonal, values in [0.5, 2).");
ABSL_FLAG(int64_t, cols, 0, "With --random: columns (default N).");
ABSL_FLAG(std::string, dtype, "f32",
          "With --random: f16, bf16, f32, f64, c64 or c128 (float16, bfloat16, float32, "
          "float64, complex64, complex128).");
ABSL_FLAG(std::string, result_dtype, "",
          "C's dtype: f16, bf16, f32, f64, c64 or c128; empty (default): NumPy's result type of "
          "A and d (float32 A with a float64 d gives float64). A stated one must be that or a "
          "type it widens to exactly (f32 into f64, c64 or c128).");
ABSL_FLAG(std::string, layout, "row", "With --random: row (C order) or col (Fortran order).");
ABSL_FLAG(uint64_t, seed, 1, "With --random: the random seed.");
ABSL_FLAG(bool, check, false,
          "Compare C with a float64 reference computed locally; exit 3 if the largest "
          "relative error exceeds --tolerance.");
ABSL_FLAG(std::string, shm, "auto",
          "Move A and C through memory instead of the gRPC socket when the server is on this "
          "host and runs with --allow_regions (a staging region: a sealed memfd passed to the "
          "server over its local socket): auto (default: when it can, for matrices of 1 MiB "
          "and more, else the socket; the report's path line says which and why); on (always, "
          "else fail); off (the socket). --mode=unary|stream forces the socket.");
ABSL_FLAG(bool, process_memory, true,
          "With --shm (auto or on): let the server read A from, and write C into, this "
          "process's own memory when it grants it (a server of this user, on this host): with "
          "--matrix and --out, the .npy files are mapped and the server copies straight "
          "between them and the GPU; no staging region, no copy here. false: a staging "
          "region.");
ABSL_FLAG(double, tolerance, 0,
          "Largest relative error --check accepts; 0 means 1e-6 for f32 and c64, 1e-14 for f64 "
          "and c128, 2e-3 for f16, 1.6e-2 for bf16.");

namespace dgmm::cli {
namespace {

enum class Mode { kAuto, kUnary, kStream };
enum class Shm { kOff, kAuto, kOn };

// The flags that shape a job, parsed.
struct Choices {
  v1::Side side = v1::SIDE_RIGHT;
  v1::Backend backend = v1::BACKEND_AUTO;
  Mode mode = Mode::kAuto;
  Shm shm = Shm::kOff;
  v1::DType result_dtype = v1::DTYPE_UNSPECIFIED;  // --result_dtype
};

absl::StatusOr<v1::DType> ParseDTypeFlag(const std::string& dtype,
                                         absl::string_view flag = "dtype");

absl::Status BadFlag(absl::string_view name, absl::string_view value, absl::string_view expected) {
  return absl::InvalidArgumentError(
      absl::StrCat("--", name, "=", value, " is not valid; expected ", expected));
}

absl::StatusOr<Choices> ParseChoices() {
  Choices c;
  const std::string side = absl::GetFlag(FLAGS_side);
  if (side == "right") {
    c.side = v1::SIDE_RIGHT;
  } else if (side == "left") {
    c.side = v1::SIDE_LEFT;
  } else if (side == "both") {
    c.side = v1::SIDE_BOTH;
  } else {
    return BadFlag("side", side, "right, left or both");
  }
  const std::string backend = absl::GetFlag(FLAGS_backend);
  absl::StatusOr<v1::Backend> parsed = ParseBackendName(backend);
  if (!parsed.ok()) return BadFlag("backend", backend, "auto, cpu, cuda-kernel or cublas");
  c.backend = *parsed;
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "auto") {
    c.mode = Mode::kAuto;
  } else if (mode == "unary") {
    c.mode = Mode::kUnary;
  } else if (mode == "stream") {
    c.mode = Mode::kStream;
  } else {
    return BadFlag("mode", mode, "auto, unary or stream");
  }
  if (const std::string result = absl::GetFlag(FLAGS_result_dtype); !result.empty()) {
    absl::StatusOr<v1::DType> parsed_result = ParseDTypeFlag(result, "result_dtype");
    if (!parsed_result.ok()) return parsed_result.status();
    c.result_dtype = *parsed_result;
  }
  const std::string shm = absl::GetFlag(FLAGS_shm);
  if (shm == "off") {
    c.shm = Shm::kOff;
  } else if (shm == "auto") {
    c.shm = Shm::kAuto;
  } else if (shm == "on") {
    c.shm = Shm::kOn;
  } else {
    return BadFlag("shm", shm, "off, auto or on");
  }
  return c;
}

// The operands, owned here; the Job points into them.
// `diagonal` is the one diagonal, or SIDE_BOTH's left one; `right` SIDE_BOTH's
// right one.
struct Operands {
  std::optional<NpyArray> matrix;
  std::optional<NpyArray> diagonal;
  std::optional<NpyArray> right;
};

// A 1-D .npy file for --`flag`.
absl::StatusOr<NpyArray> ReadDiagonal(const std::string& path, absl::string_view flag) {
  absl::StatusOr<NpyArray> diagonal = ReadNpy(path);
  if (!diagonal.ok()) return diagonal.status();
  if (diagonal->header().shape.size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds a 2-D array; --", flag, " needs a 1-D array"));
  }
  return diagonal;
}

absl::StatusOr<Operands> ReadOperands(v1::Side side) {
  const std::string matrix_path = absl::GetFlag(FLAGS_matrix);
  const bool both = side == v1::SIDE_BOTH;
  const std::string diag_path = absl::GetFlag(both ? FLAGS_left : FLAGS_diag);
  const std::string right_path = absl::GetFlag(FLAGS_right);
  if (matrix_path.empty() || diag_path.empty() || (both && right_path.empty()) ||
      absl::GetFlag(FLAGS_out).empty()) {
    return absl::InvalidArgumentError(
        both ? "multiply --side both needs --matrix, --left, --right and --out (or --random=N); "
               "run 'dgmm-cli --help'"
             : "multiply needs --matrix, --diag and --out (or --random=N); run 'dgmm-cli --help'");
  }
  if (!both && (!absl::GetFlag(FLAGS_left).empty() || !right_path.empty())) {
    return absl::InvalidArgumentError("--left and --right go with --side both; use --diag");
  }
  if (both && !absl::GetFlag(FLAGS_diag).empty()) {
    return absl::InvalidArgumentError("--side both takes --left and --right, not --diag");
  }
  Operands ops;
  absl::StatusOr<NpyArray> matrix = ReadNpy(matrix_path);
  if (!matrix.ok()) return matrix.status();
  if (matrix->header().shape.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(matrix_path, " holds a 1-D array; --matrix needs a 2-D array"));
  }
  absl::StatusOr<NpyArray> diagonal = ReadDiagonal(diag_path, both ? "left" : "diag");
  if (!diagonal.ok()) return diagonal.status();
  if (both) {
    absl::StatusOr<NpyArray> right = ReadDiagonal(right_path, "right");
    if (!right.ok()) return right.status();
    if (right->header().dtype != diagonal->header().dtype) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the left diagonal is ", DTypeName(diagonal->header().dtype), " but the right one is ",
          DTypeName(right->header().dtype), "; save both diagonals with one dtype"));
    }
    ops.right.emplace(*std::move(right));
  }
  // A diagonal of another dtype than A's is the server's to promote (or to
  // refuse, saying why).
  ops.matrix.emplace(*std::move(matrix));
  ops.diagonal.emplace(*std::move(diagonal));
  return ops;
}

absl::StatusOr<v1::DType> ParseDTypeFlag(const std::string& dtype, absl::string_view flag) {
  const std::pair<const char*, v1::DType> names[] = {
      {"f16", v1::DTYPE_FLOAT16},     {"float16", v1::DTYPE_FLOAT16},
      {"bf16", v1::DTYPE_BFLOAT16},   {"bfloat16", v1::DTYPE_BFLOAT16},
      {"f32", v1::DTYPE_FLOAT32},     {"float32", v1::DTYPE_FLOAT32},
      {"f64", v1::DTYPE_FLOAT64},     {"float64", v1::DTYPE_FLOAT64},
      {"c64", v1::DTYPE_COMPLEX64},   {"complex64", v1::DTYPE_COMPLEX64},
      {"c128", v1::DTYPE_COMPLEX128}, {"complex128", v1::DTYPE_COMPLEX128}};
  for (const auto& [name, type] : names) {
    if (dtype == name) return type;
  }
  return BadFlag(flag, dtype, "f16, bf16, f32, f64, c64 or c128");
}

// The matrix header --random, --cols, --dtype and --layout ask for.
absl::StatusOr<NpyHeader> RandomHeader() {
  const int64_t rows = absl::GetFlag(FLAGS_random);
  const int64_t cols = absl::GetFlag(FLAGS_cols) > 0 ? absl::GetFlag(FLAGS_cols) : rows;
  if (rows < 1 || absl::GetFlag(FLAGS_cols) < 0) {
    return absl::InvalidArgumentError("--random and --cols must be positive");
  }
  NpyHeader header;
  absl::StatusOr<v1::DType> dtype = ParseDTypeFlag(absl::GetFlag(FLAGS_dtype));
  if (!dtype.ok()) return dtype.status();
  header.dtype = *dtype;
  const std::string layout = absl::GetFlag(FLAGS_layout);
  if (layout != "row" && layout != "col") return BadFlag("layout", layout, "row or col");
  header.fortran_order = layout == "col";
  header.shape = {rows, cols};
  return header;
}

absl::StatusOr<Operands> RandomOperands(v1::Side side) {
  absl::StatusOr<NpyHeader> made = RandomHeader();
  if (!made.ok()) return made.status();
  const NpyHeader& header = *made;
  const int64_t rows = header.shape[0];
  const int64_t cols = header.shape[1];
  NpyHeader diag_header = header;
  diag_header.fortran_order = false;
  diag_header.shape = {side == v1::SIDE_RIGHT ? cols : rows};

  Operands ops;
  ops.matrix.emplace(header);
  ops.diagonal.emplace(diag_header);
  // On every core; each operand from its own seed, so the values depend on
  // --seed alone.
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  FillUniform(header.dtype, ops.matrix->data(), header.num_elements(), seed);
  FillUniform(header.dtype, ops.diagonal->data(), diag_header.num_elements(),
              seed + 0x100000001ULL);
  if (side == v1::SIDE_BOTH) {
    NpyHeader right_header = diag_header;
    right_header.shape = {cols};
    ops.right.emplace(right_header);
    FillUniform(header.dtype, ops.right->data(), right_header.num_elements(),
                seed + 0x200000002ULL);
  }
  return ops;
}

// Writes a zero into every page of [p, p + bytes) with a few threads: a new
// array's pages are made by the kernel on first touch, which would
// otherwise happen while the result arrives.
void TouchPages(char* p, size_t bytes) {
  constexpr size_t kPage = 4096;
  const size_t parts = std::clamp<size_t>(bytes >> 26, 1, 4);  // a thread per 64 MiB, up to 4
  const size_t slice = (bytes / parts + kPage - 1) / kPage * kPage;
  std::vector<std::thread> threads;
  for (size_t t = 0; t < parts && t * slice < bytes; ++t) {
    threads.emplace_back([=] {
      const size_t end = std::min(bytes, (t + 1) * slice);
      for (size_t at = t * slice; at < end; at += kPage) p[at] = 0;
    });
  }
  for (std::thread& t : threads) t.join();
}

// The matrix's header before its data: from --random's flags or the .npy
// file's header (an error here is reported later, by the code that reads
// the operands).
absl::StatusOr<NpyHeader> PlannedHeader(bool random) {
  if (random) return RandomHeader();
  size_t offset = 0;
  return ReadNpyHeader(absl::GetFlag(FLAGS_matrix), &offset);
}

Job MakeJob(const Operands& ops, const Choices& choices) {
  const NpyHeader& h = ops.matrix->header();
  Job job;
  job.matrix.data = ops.matrix->data();
  job.matrix.rows = h.shape[0];
  job.matrix.cols = h.shape[1];
  job.matrix.dtype = h.dtype;
  job.matrix.layout = h.fortran_order ? v1::LAYOUT_COL_MAJOR : v1::LAYOUT_ROW_MAJOR;
  job.diagonal = ops.diagonal->data();
  job.diagonal_bytes = ops.diagonal->size_bytes();
  job.diagonal_dtype = ops.diagonal->header().dtype;
  if (ops.right.has_value()) {
    job.right_diagonal = ops.right->data();
    job.right_diagonal_bytes = ops.right->size_bytes();
  }
  job.side = choices.side;
  job.backend = choices.backend;
  job.result_dtype = choices.result_dtype;
  return job;
}

// C's .npy header: A's shape and order, the job's result dtype.
NpyHeader ResultHeader(const NpyHeader& matrix, const Job& job) {
  NpyHeader c = matrix;
  c.dtype = ResultDType(job);
  return c;
}

double Ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

void PrintReport(const Job& job, const JobResult& result, const char* mode, absl::Duration wall) {
  const v1::JobStats& s = result.stats;
  const int64_t bytes =
      static_cast<int64_t>(ElementSize(job.matrix.dtype)) * job.matrix.rows * job.matrix.cols;
  // C's dtype when it is not A's (a promoted result).
  const std::string result_dtype = ResultDType(job) == job.matrix.dtype
                                       ? std::string()
                                       : absl::StrCat(" (C ", DTypeName(ResultDType(job)), ")");
  std::printf("job %llu: %lldx%lld %s%s %s, side %s, %s\n",
              static_cast<unsigned long long>(s.job_id()), static_cast<long long>(job.matrix.rows),
              static_cast<long long>(job.matrix.cols), DTypeName(job.matrix.dtype).c_str(),
              result_dtype.c_str(),
              job.matrix.layout == v1::LAYOUT_COL_MAJOR ? "col-major" : "row-major",
              job.side == v1::SIDE_LEFT   ? "left"
              : job.side == v1::SIDE_BOTH ? "both"
                                          : "right",
              FormatBytes(bytes).c_str());
  std::printf("mode:       %s, %d stripe%s, %d attempt%s\n", mode, result.stripes,
              result.stripes == 1 ? "" : "s", result.attempts, result.attempts == 1 ? "" : "s");
  std::printf("backend:    %s on %s\n", BackendName(s.backend()).c_str(), s.device().c_str());
  std::printf(
      "timings:    queue wait %.3f ms, h2d %.3f ms, compute %.3f ms, d2h %.3f ms, "
      "total %.3f ms (server); %.3f ms wall (client)\n",
      Ms(s.queue_wait_ns()), Ms(s.h2d_ns()), Ms(s.compute_ns()), Ms(s.d2h_ns()), Ms(s.total_ns()),
      absl::ToDoubleMilliseconds(wall));
  const double seconds = absl::ToDoubleSeconds(wall);
  // A sent and C received (C's bytes: more than A's for a promoted result).
  const double moved =
      static_cast<double>(bytes) + static_cast<double>(ResultBytes(job).value_or(0));
  std::printf("throughput: %.3f GB/s (A sent + C received over client wall time)\n",
              seconds > 0 ? moved / seconds / 1e9 : 0.0);
}

// The striping and mode chosen for `job` (Client::Plan, as the job will run
// it), printed before it runs; nothing for a job the client will refuse.
void PrintPlan(const Client& client, const Job& job, Mode mode) {
  absl::StatusOr<Client::JobPlan> plan =
      client.Plan(job, mode == Mode::kUnary    ? std::optional(TransferMode::kUnary)
                       : mode == Mode::kStream ? std::optional(TransferMode::kStream)
                                               : std::nullopt);
  if (!plan.ok()) return;
  std::printf("stripes:    %d (%s), mode %s\n", plan->stripes,
              client.options().stripes == 0 ? "auto" : "--stripes", TransferModeName(plan->mode));
  std::fflush(stdout);
}

absl::StatusOr<JobResult> Run(Client& client, const Job& job, Mode mode, void* out,
                              size_t out_bytes) {
  ProgressBar bar(!absl::GetFlag(FLAGS_quiet) && ProgressBar::StderrIsTerminal());
  ProgressCallback progress = [&bar](int64_t sent, int64_t received, int64_t total) {
    bar.Update(sent, received, total);
  };
  switch (mode) {
    case Mode::kUnary:
      return client.MultiplyUnary(job, out, out_bytes, progress);
    case Mode::kStream:
      return client.MultiplyStream(job, out, out_bytes, progress);
    case Mode::kAuto:
      break;
  }
  return client.Multiply(job, out, out_bytes, progress);
}

// --shm=on (with --random): A is copied into a fresh region, C is computed
// there in place and copied to `out`; a region that cannot be set up is the
// job's error.
absl::StatusOr<JobResult> RunShm(Client& client, const Job& job, void* out, size_t out_bytes) {
  absl::StatusOr<size_t> bytes = MatrixBytes(job.matrix);
  if (!bytes.ok()) return bytes.status();
  // In place, or (C wider than A) C after A.
  const size_t c_at = out_bytes == *bytes ? 0 : (*bytes + 255) / 256 * 256;
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
      SharedMemoryRegion::Create(client, c_at + out_bytes);
  if (!region.ok()) {
    return absl::Status(region.status().code(), absl::StrCat("--shm: ", region.status().message()));
  }
  SharedMemoryRegion& shm = **region;
  std::memcpy(shm.bytes(), job.matrix.data, *bytes);
  absl::StatusOr<JobResult> result =
      MultiplyRegion(client, RegionJobOf(job, shm.Ref(), shm.Ref(static_cast<int64_t>(c_at))));
  if (result.ok()) std::memcpy(out, shm.bytes() + c_at, out_bytes);
  return result;
}

// A .npy file mapped into memory, unmapped and closed when destroyed; the
// array's data at data().
class MappedNpy {
 public:
  // A's file, read-only.
  static absl::StatusOr<std::unique_ptr<MappedNpy>> Open(const std::string& path, size_t offset,
                                                         size_t bytes) {
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(absl::StrCat(path, ": ", std::strerror(errno)));
    return Map(fd, path, offset, bytes, PROT_READ);
  }
  // The existing file `path` when it already holds an array of exactly
  // `header`'s shape, dtype and order (a job run again into the same
  // output): its data mapped to be overwritten in place, which spares the
  // page cache freeing the old file's pages and allocating new ones.
  // NOT_FOUND otherwise.
  static absl::StatusOr<std::unique_ptr<MappedNpy>> Reuse(const std::string& path,
                                                          const NpyHeader& header) {
    const std::string head = EncodeNpyHeader(header);
    const int fd = open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return absl::NotFoundError(path);
    struct stat st;
    std::string seen(head.size(), '\0');
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<size_t>(st.st_size) != head.size() + header.data_bytes() ||
        pread(fd, seen.data(), seen.size(), 0) != static_cast<ssize_t>(seen.size()) ||
        seen != head) {
      close(fd);
      return absl::NotFoundError(path);
    }
    return Map(fd, path, head.size(), header.data_bytes(), PROT_READ | PROT_WRITE);
  }
  ~MappedNpy() {
    munmap(base_, length_);
    close(fd_);
  }
  char* data() const { return base_ + offset_; }

 private:
  static absl::StatusOr<std::unique_ptr<MappedNpy>> Map(int fd, const std::string& path,
                                                        size_t offset, size_t bytes, int prot) {
    void* base = mmap(nullptr, offset + bytes, prot, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) {
      const int error = errno;
      close(fd);
      return absl::UnavailableError(absl::StrCat("mmap ", path, ": ", std::strerror(error)));
    }
    auto m = std::unique_ptr<MappedNpy>(new MappedNpy());
    m->fd_ = fd;
    m->base_ = static_cast<char*>(base);
    m->length_ = offset + bytes;
    m->offset_ = offset;
    return m;
  }
  MappedNpy() = default;
  int fd_ = -1;
  char* base_ = nullptr;
  size_t length_ = 0;
  size_t offset_ = 0;
};

bool SameFile(const std::string& a, const std::string& b) {
  struct stat sa, sb;
  return stat(a.c_str(), &sa) == 0 && stat(b.c_str(), &sb) == 0 && sa.st_dev == sb.st_dev &&
         sa.st_ino == sb.st_ino;
}

// The same-host path with files in process memory: A's .npy is mapped, and
// the server copies from it itself. C: an existing file of the same array
// is mapped and overwritten in place (removed if the job fails); else the
// server writes C into memory of this process on huge pages, which is then
// written to a new file under a temporary name and renamed (writing a new
// file is 2-4x faster than having its pages made one fault at a time
// through a mapping: 67 against 100-250 ms for 256 MiB on the 2-core
// machine's ext4). nullopt when that cannot be set up (the region path
// follows); else the job's outcome, with the times of its phases.
struct MappedRun {
  absl::StatusOr<JobResult> result;
  absl::Duration map, job, close;
  bool new_file = false;
  double error = 0;  // --check
};
std::optional<MappedRun> RunMappedFiles(Client& client, const Job& like, const NpyHeader& header,
                                        size_t offset, const std::string& matrix_path,
                                        const std::string& out_path, bool check) {
  if (SameFile(matrix_path, out_path)) return std::nullopt;  // C would overwrite A
  absl::StatusOr<std::shared_ptr<LocalSession>> session = client.RegionSession();
  if (!session.ok() || !(*session)->process_memory()) return std::nullopt;
  const absl::Time start = absl::Now();
  const size_t bytes = header.data_bytes();
  absl::StatusOr<std::unique_ptr<MappedNpy>> a = MappedNpy::Open(matrix_path, offset, bytes);
  if (!a.ok()) return std::nullopt;
  absl::StatusOr<std::unique_ptr<MappedNpy>> c = MappedNpy::Reuse(out_path, header);
  const bool in_place = c.ok();
  HostMemoryPtr fresh;  // C of a new file: on huge pages, written out after the job
  if (!in_place) {
    fresh = HostMemoryPtr(AllocateHostMemory(bytes), HostMemoryDeleter{bytes});
    if (fresh == nullptr) return std::nullopt;
  }
  char* const c_data = in_place ? (*c)->data() : static_cast<char*>(fresh.get());
  MappedRun run;
  run.new_file = !in_place;
  const absl::Time mapped = absl::Now();
  run.map = mapped - start;
  Job job = like;
  job.matrix.data = (*a)->data();
  run.result = MultiplyRegion(
      client, RegionJobOf(job, ProcessMemoryRef((*a)->data()), ProcessMemoryRef(c_data)));
  const absl::Time ran = absl::Now();
  run.job = ran - mapped;
  if (run.result.ok() && check) run.error = MaxRelativeError(job, c_data);
  a->reset();
  if (in_place) {
    c->reset();
    if (!run.result.ok()) unlink(out_path.c_str());
  } else if (run.result.ok()) {
    const std::string temporary = absl::StrCat(out_path, ".dgmm-", getpid(), ".tmp");
    absl::Status written = WriteNpy(temporary, header, c_data, bytes);
    if (written.ok() && rename(temporary.c_str(), out_path.c_str()) != 0) {
      written = absl::UnavailableError(
          absl::StrCat("rename ", temporary, " to ", out_path, ": ", std::strerror(errno)));
    }
    if (!written.ok()) {
      unlink(temporary.c_str());
      run.result = written;
    }
  }
  run.close = absl::Now() - ran;
  return run;
}

// The job of the files: A's shape, dtype and order from its header, the
// diagonal read, the side and backend chosen; A at `matrix`.
Job JobOfFiles(const NpyHeader& header, const NpyArray& diagonal, const Choices& choices,
               const void* matrix) {
  Job job;
  job.matrix.data = matrix;
  job.matrix.rows = header.shape[0];
  job.matrix.cols = header.shape[1];
  job.matrix.dtype = header.dtype;
  job.matrix.layout = header.fortran_order ? v1::LAYOUT_COL_MAJOR : v1::LAYOUT_ROW_MAJOR;
  job.diagonal = diagonal.data();
  job.diagonal_bytes = diagonal.size_bytes();
  job.diagonal_dtype = diagonal.header().dtype;
  job.side = choices.side;
  job.backend = choices.backend;
  return job;
}

// --check's verdict on C's largest relative error `error` against
// --tolerance (or the dtype's default): printed (when `print_ok`, or when it
// failed), and the exit code.
int CheckExit(v1::DType dtype, double error, bool print_ok) {
  const double tolerance =
      absl::GetFlag(FLAGS_tolerance) > 0 ? absl::GetFlag(FLAGS_tolerance) : DefaultTolerance(dtype);
  const bool passed = error <= tolerance;
  if (print_ok || !passed) {
    std::printf("max relative error: %.3g (tolerance %.3g): %s\n", error, tolerance,
                passed ? "OK" : "FAILED");
  }
  return passed ? kExitOk : kExitCheckFailed;
}

// The same-host path with files: A is read from its .npy file
// straight into a region the server maps, the job runs there (in place, or
// into the region's second half with --check, which then reads A and C from
// the region), and C is written to --out from the region: no heap copy of
// either. nullopt when the path cannot be used and `required` is false (the
// caller then reads the files and runs the job as usual; the client says
// why); else the exit code.
std::optional<int> RunFilesSameHost(Client& client, const Choices& choices, bool required) {
  const std::string matrix_path = absl::GetFlag(FLAGS_matrix);
  const std::string diag_path = absl::GetFlag(FLAGS_diag);
  const std::string out_path = absl::GetFlag(FLAGS_out);
  // SIDE_BOTH's two files take the usual path (which takes the same host
  // too, through a staging region or process memory).
  if (choices.side == v1::SIDE_BOTH) return std::nullopt;
  if (matrix_path.empty() || diag_path.empty() || out_path.empty()) return std::nullopt;
  size_t offset = 0;
  absl::StatusOr<NpyHeader> header = ReadNpyHeader(matrix_path, &offset);
  absl::StatusOr<NpyArray> diagonal = ReadNpy(diag_path);
  if (!header.ok() || !diagonal.ok() || header->shape.size() != 2 ||
      diagonal->header().shape.size() != 1 || header->dtype != diagonal->header().dtype ||
      (choices.result_dtype != v1::DTYPE_UNSPECIFIED && choices.result_dtype != header->dtype) ||
      header->data_bytes() == 0) {
    return std::nullopt;  // the usual path reads them again and names the problem
  }
  const bool check = absl::GetFlag(FLAGS_check);
  const size_t bytes = header->data_bytes();
  if (!required && static_cast<int64_t>(bytes) < client.options().same_host_min_bytes) {
    return std::nullopt;  // small: one message costs less
  }
  if (client.options().process_memory) {
    const Job like = JobOfFiles(*header, *diagonal, choices, nullptr);
    const absl::Time start = absl::Now();
    if (std::optional<MappedRun> run =
            RunMappedFiles(client, like, *header, offset, matrix_path, out_path, check)) {
      if (!run->result.ok()) return ReportError(run->result.status(), kExitRpcError);
      const absl::Duration wall = absl::Now() - start;
      run->result->mode = TransferMode::kRegion;
      run->result->process_memory = true;
      if (!absl::GetFlag(FLAGS_quiet)) {
        PrintReport(like, *run->result, "shm", wall);
        const auto ms = [](absl::Duration d) { return absl::ToDoubleMilliseconds(d); };
        if (run->new_file) {
          std::printf(
              "path:       same host, process memory (the server read A from %s, "
              "mapped here, and wrote C into this process's memory, written to a new "
              "%s)\n",
              matrix_path.c_str(), out_path.c_str());
          std::printf("phases:     map %.1f ms, job %.1f ms, write C %.1f ms\n", ms(run->map),
                      ms(run->job), ms(run->close));
        } else {
          std::printf(
              "path:       same host, process memory (the server read A from %s and "
              "wrote C into %s, both mapped here; no copy in this process)\n",
              matrix_path.c_str(), out_path.c_str());
          std::printf("phases:     map %.1f ms, job %.1f ms, close %.1f ms\n", ms(run->map),
                      ms(run->job), ms(run->close));
        }
      }
      return check ? CheckExit(like.matrix.dtype, run->error, /*print_ok=*/true) : kExitOk;
    }
  }
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<SharedMemoryRegion>> region =
      SharedMemoryRegion::Create(client, check ? 2 * bytes : bytes);
  const absl::Time made = absl::Now();
  if (!region.ok()) {
    if (!required) return std::nullopt;
    return ReportError(
        absl::Status(region.status().code(), absl::StrCat("--shm: ", region.status().message())),
        kExitRpcError);
  }
  SharedMemoryRegion& shm = **region;
  if (absl::Status read = ReadNpyData(matrix_path, *header, offset, shm.bytes()); !read.ok()) {
    return ReportError(read, kExitUsage);
  }
  const absl::Time read_in = absl::Now();
  const Job job = JobOfFiles(*header, *diagonal, choices, shm.bytes());
  absl::StatusOr<JobResult> result = MultiplyRegion(
      client, RegionJobOf(job, shm.Ref(), shm.Ref(check ? static_cast<int64_t>(bytes) : 0)));
  if (!result.ok()) {
    const absl::StatusCode code = result.status().code();
    if (!required && code != absl::StatusCode::kInvalidArgument &&
        code != absl::StatusCode::kDeadlineExceeded && code != absl::StatusCode::kCancelled) {
      return std::nullopt;  // the socket path runs it from the files again
    }
    return ReportError(result.status(), kExitRpcError);
  }
  const absl::Time ran = absl::Now();
  const char* c = shm.bytes() + (check ? bytes : 0);
  if (absl::Status written = WriteNpy(out_path, *header, c, bytes); !written.ok()) {
    return ReportError(written, kExitRpcError);
  }
  const absl::Duration wall = absl::Now() - start;
  result->mode = TransferMode::kRegion;
  if (!absl::GetFlag(FLAGS_quiet)) {
    PrintReport(job, *result, "shm", wall);
    std::printf(
        "path:       same host (A read from %s into a region the server maps, C "
        "written to %s from it)\n",
        matrix_path.c_str(), out_path.c_str());
    const auto ms = [](absl::Duration d) { return absl::ToDoubleMilliseconds(d); };
    std::printf("phases:     region %.1f ms, read A %.1f ms, job %.1f ms, write C %.1f ms\n",
                ms(made - start), ms(read_in - made), ms(ran - read_in), ms(start + wall - ran));
  }
  return check ? CheckExit(job.matrix.dtype, MaxRelativeError(job, c), /*print_ok=*/true) : kExitOk;
}

}  // namespace

int RunMultiply() {
  absl::StatusOr<Choices> choices = ParseChoices();
  if (!choices.ok()) return ReportError(choices.status(), kExitUsage);
  const bool random = absl::GetFlag(FLAGS_random) != 0;
  if (random && !absl::GetFlag(FLAGS_matrix).empty()) {
    return ReportError(absl::InvalidArgumentError("give either --random or --matrix, not both"),
                       kExitUsage);
  }
  absl::StatusOr<std::unique_ptr<Client>> client =
      MakeClient(absl::GetFlag(FLAGS_stripes), /*same_host=*/choices->shm == Shm::kAuto,
                 absl::GetFlag(FLAGS_process_memory));
  if (!client.ok()) return ReportError(client.status(), kExitUsage);
  if (!random && choices->shm != Shm::kOff && choices->mode == Mode::kAuto) {
    if (std::optional<int> done = RunFilesSameHost(**client, *choices, choices->shm == Shm::kOn);
        done.has_value()) {
      return *done;
    }
  }
  // While A is read or made, the job's connections open and C's pages are
  // touched, so that the RPC waits for neither (each dgmm-cli is a new
  // client: bench/results/wire, the CLI against a warm client's figure).
  std::optional<NpyArray> out;
  std::thread touch;
  if (absl::StatusOr<NpyHeader> planned = PlannedHeader(random);
      planned.ok() && planned->shape.size() == 2 && planned->data_bytes() > 0) {
    const int64_t lines = planned->fortran_order ? planned->shape[1] : planned->shape[0];
    const bool socket_only = choices->shm == Shm::kOff && choices->mode == Mode::kAuto;
    (*client)->Connect(socket_only ? ChooseStripes(static_cast<int64_t>(planned->data_bytes()),
                                                   lines, (*client)->options().stripes)
                                   : 1);
    // C's dtype where the flags say it (--result_dtype); otherwise A's, and
    // a promoted C is made again below.
    if (choices->result_dtype != v1::DTYPE_UNSPECIFIED) planned->dtype = choices->result_dtype;
    out.emplace(*planned);
    // Not for a C that takes a large share of this host's memory: a job the
    // server refuses would then have committed it for nothing.
    const double host_bytes =
        static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGESIZE));
    if (static_cast<double>(out->size_bytes()) <= host_bytes / 8) {
      touch = std::thread(TouchPages, static_cast<char*>(out->data()), out->size_bytes());
    }
  }
  absl::StatusOr<Operands> ops =
      random ? RandomOperands(choices->side) : ReadOperands(choices->side);
  if (touch.joinable()) touch.join();
  if (!ops.ok()) return ReportError(ops.status(), kExitUsage);
  const Job job = MakeJob(*ops, *choices);
  // C: A's shape and order, the result dtype (A's unless promoted).
  const NpyHeader result_header = ResultHeader(ops->matrix->header(), job);
  if (!out.has_value() || out->header().shape != result_header.shape ||
      out->header().dtype != result_header.dtype ||
      out->header().fortran_order != result_header.fortran_order) {
    out.emplace(result_header);
  }
  if (!absl::GetFlag(FLAGS_quiet) && choices->shm != Shm::kOn) {  // --shm=on never stripes
    PrintPlan(**client, job, choices->mode);
  }
  const absl::Time start = absl::Now();
  std::optional<absl::StatusOr<JobResult>> shm_result;
  if (choices->shm == Shm::kOn) {
    shm_result = RunShm(**client, job, out->data(), out->size_bytes());
  }
  absl::StatusOr<JobResult> result =
      shm_result.has_value() ? *std::move(shm_result)
                             : Run(**client, job, choices->mode, out->data(), out->size_bytes());
  const absl::Duration wall = absl::Now() - start;
  if (!result.ok()) return ReportError(result.status(), kExitRpcError);
  const char* mode = shm_result.has_value() ? "shm" : TransferModeName(result->mode);

  const std::string out_path = absl::GetFlag(FLAGS_out);
  if (!out_path.empty()) {
    absl::Status written = WriteNpy(out_path, out->header(), out->data(), out->size_bytes());
    if (!written.ok()) return ReportError(written, kExitRpcError);
  }
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  if (!quiet) {
    PrintReport(job, *result, mode, wall);
    // Which path the bytes took, and why (--shm).
    if (result->process_memory) {
      std::printf(
          "path:       same host, process memory (the server read A from and wrote C "
          "into this process's memory; no payload on the socket, no copy here)\n");
    } else if (shm_result.has_value() || result->mode == TransferMode::kRegion) {
      std::printf(
          "path:       same host (a staging region the server maps; no payload on the "
          "socket)\n");
    } else if (!result->socket_reason.empty()) {
      std::printf("path:       socket: the same-host path was not usable: %s\n",
                  result->socket_reason.c_str());
    } else {
      std::printf("path:       socket (%s)\n", choices->shm == Shm::kOff ? "--shm=off"
                                               : choices->mode != Mode::kAuto
                                                   ? "--mode forces the socket"
                                                   : "the matrix is under 1 MiB");
    }
  }
  if (!absl::GetFlag(FLAGS_check)) return kExitOk;
  return CheckExit(ResultDType(job), MaxRelativeError(job, out->data()), /*print_ok=*/!quiet);
}

}  // namespace dgmm::cli
