// stream_bench: end-to-end timing of streamed jobs against a running
// dgmm-server, next to an echo of the same bytes through the same RPC shape.
//
// For each N it streams an N×N float32 matrix (row-major, side right) over
// dgmm.v1.Dgmm/MultiplyStream ("multiply") and over dgmm.bench.v1.Echo/Echo
// ("echo", needs the server's --enable_bench_echo), `--reps` times each,
// alternating, and prints one CSV row per call:
//
//   mode,n,bytes_each_way,block_bytes,wall_s,server_total_s,backend,device,bad_blocks
//
// The client never holds the matrix: a block of lines is cut from a small
// ring of pre-generated blocks (block k sends ring[k % kRing]), so the client
// stays a few MiB at any N, and every result block is checked against the
// expected block computed here, independently of the server, in float32
// (a*d is one correctly rounded product on every backend, so results must be
// bit-identical). Requests are sent from the ring without copies and result
// blocks are decoded straight from gRPC's buffers, the way dgmm::Client does
// (client/cpp/src/wire.h), so the client side costs what the real client's
// stream path costs.
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/channel_arguments.h>
#include <grpcpp/support/client_callback.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "dgmm/grpc_status.h"
#include "proto/wire.h"

ABSL_FLAG(std::string, target, "127.0.0.1:50051", "dgmm-server address HOST:PORT.");
ABSL_FLAG(std::string, sizes, "1000,4000,10000,20000", "Comma-separated N (N×N float32 jobs).");
ABSL_FLAG(std::string, modes, "echo,multiply",
          "Comma-separated modes, run in this order within each repetition: echo, multiply.");
ABSL_FLAG(int, reps, 3, "Calls per (N, mode).");
ABSL_FLAG(int64_t, block_bytes, int64_t{4} << 20,
          "Block payload size (whole rows); at most the server's --max_block_bytes.");
ABSL_FLAG(std::string, backend, "auto",
          "Backend hint for multiply: auto, cpu, cuda-kernel, cublas.");
ABSL_FLAG(bool, verify, true, "Compare every returned block with the expected bytes.");
ABSL_FLAG(bool, warmup, true, "Run one small echo/multiply first (not reported).");
ABSL_FLAG(bool, header, true, "Print the CSV header line.");

namespace dgmm::bench {
namespace {

constexpr int kRing = 4;
constexpr char kMultiplyMethod[] = "/dgmm.v1.Dgmm/MultiplyStream";
constexpr char kEchoMethod[] = "/dgmm.bench.v1.Echo/Echo";

// The bytes of one N: kRing input blocks and, for multiply, the results
// they must come back as.
struct Workload {
  int64_t n = 0;
  int64_t lines_per_block = 0;
  size_t line_bytes = 0;
  std::vector<float> diagonal;
  std::vector<std::vector<float>> in;        // kRing blocks of lines_per_block lines
  std::vector<std::vector<float>> expected;  // in[r][i][j] * diagonal[j]

  size_t block_bytes(int64_t lines) const { return static_cast<size_t>(lines) * line_bytes; }
};

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Multiples of 2^-23 in [-1, 1): exact in float32, never subnormal once scaled.
float Value(uint64_t seed) {
  return static_cast<float>(static_cast<int64_t>(Mix(seed) >> 40) - (int64_t{1} << 23)) /
         static_cast<float>(int64_t{1} << 23);
}

Workload MakeWorkload(int64_t n, int64_t block_bytes) {
  Workload w;
  w.n = n;
  w.line_bytes = static_cast<size_t>(n) * sizeof(float);
  w.lines_per_block = std::clamp<int64_t>(block_bytes / static_cast<int64_t>(w.line_bytes), 1, n);
  w.diagonal.resize(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    w.diagonal[static_cast<size_t>(j)] = 0.5f + 1.5f * (Value(~static_cast<uint64_t>(j)) + 1) / 2;
  }
  const size_t elems = static_cast<size_t>(w.lines_per_block * n);
  for (int r = 0; r < kRing; ++r) {
    std::vector<float> in(elems), out(elems);
    for (size_t e = 0; e < elems; ++e) {
      in[e] = Value((static_cast<uint64_t>(r) << 48) ^ e);
      out[e] = in[e] * w.diagonal[e % static_cast<size_t>(n)];
    }
    w.in.push_back(std::move(in));
    w.expected.push_back(std::move(out));
  }
  return w;
}

struct CallResult {
  absl::Status status;
  double wall_s = 0;
  v1::JobStats stats;
  int64_t bad_blocks = 0;
};

// One streamed call over the generic stub: header, then blocks from the
// workload's ring, one write and one read in flight.
class BenchCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  BenchCall(const Workload& w, bool echo, bool verify, v1::Backend backend)
      : w_(w), echo_(echo), verify_(verify), scratch_(w.block_bytes(w.lines_per_block)) {
    header_.set_rows(w.n);
    header_.set_cols(w.n);
    header_.set_dtype(v1::DTYPE_FLOAT32);
    header_.set_layout(v1::LAYOUT_ROW_MAJOR);
    header_.set_side(v1::SIDE_RIGHT);
    header_.set_backend(backend);
    header_.set_diagonal(w.diagonal.data(), w.diagonal.size() * sizeof(float));
  }

  CallResult Run(grpc::GenericStub* stub) {
    grpc::ClientContext context;
    context_ = &context;
    const auto start = std::chrono::steady_clock::now();
    stub->PrepareBidiStreamingCall(&context, echo_ ? kEchoMethod : kMultiplyMethod,
                                   grpc::StubOptions(), this);
    write_buffer_ = wire::EncodeStreamHeader(header_);
    StartWrite(&write_buffer_);
    StartRead(&read_buffer_);
    StartCall();
    done_mu_.LockWhen(absl::Condition(&done_));
    done_mu_.Unlock();
    CallResult r;
    r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    write_buffer_.Clear();
    read_buffer_.Clear();
    loans_.WaitUntilReturned();
    if (!error_.ok()) {
      r.status = error_;
    } else if (!status_.ok()) {
      r.status = FromGrpcStatus(status_);
    } else if (!have_stats_ || next_line_in_ != w_.n) {
      r.status = absl::InternalError(
          absl::StrCat("the call ended after ", next_line_in_, " of ", w_.n, " result lines"));
    }
    r.stats = stats_;
    r.bad_blocks = bad_blocks_;
    return r;
  }

  void OnWriteDone(bool ok) override {
    if (!ok) return;
    if (next_line_out_ == w_.n) {
      StartWritesDone();
      return;
    }
    const int64_t lines = std::min(w_.lines_per_block, w_.n - next_line_out_);
    const auto& block = w_.in[static_cast<size_t>(next_line_out_ / w_.lines_per_block) % kRing];
    write_buffer_ =
        wire::EncodeStreamBlock(next_line_out_, block.data(), w_.block_bytes(lines), &loans_);
    next_line_out_ += lines;
    StartWrite(&write_buffer_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    absl::Status s = Handle();
    read_buffer_.Clear();
    if (!s.ok()) {
      error_ = s;
      context_->TryCancel();
      return;
    }
    StartRead(&read_buffer_);
  }

  void OnDone(const grpc::Status& status) override {
    absl::MutexLock lock(&done_mu_);
    status_ = status;
    done_ = true;
  }

 private:
  absl::Status Handle() {
    auto response = wire::DecodeStreamResponse(
        &read_buffer_, [this](int64_t first_line, size_t size) -> absl::StatusOr<void*> {
          if (first_line != next_line_in_ || size == 0 || size % w_.line_bytes != 0 ||
              size > scratch_.size()) {
            return absl::InternalError(absl::StrCat("unexpected result block at line ", first_line,
                                                    " of ", size, " bytes; expected line ",
                                                    next_line_in_));
          }
          return scratch_.data();
        });
    if (!response.ok()) return response.status();
    if (response->kind == wire::StreamResponse::Kind::kStats) {
      stats_ = response->stats;
      have_stats_ = true;
    } else if (response->kind == wire::StreamResponse::Kind::kBlock) {
      const size_t ring = static_cast<size_t>(next_line_in_ / w_.lines_per_block) % kRing;
      const auto& want = echo_ ? w_.in[ring] : w_.expected[ring];
      if (verify_ && std::memcmp(scratch_.data(), want.data(), response->size) != 0) {
        ++bad_blocks_;
      }
      next_line_in_ += static_cast<int64_t>(response->size / w_.line_bytes);
    }
    return absl::OkStatus();
  }

  const Workload& w_;
  const bool echo_;
  const bool verify_;
  v1::JobHeader header_;
  grpc::ClientContext* context_ = nullptr;
  wire::SliceLoans loans_;
  grpc::ByteBuffer write_buffer_;
  int64_t next_line_out_ = 0;
  grpc::ByteBuffer read_buffer_;
  std::vector<char> scratch_;
  int64_t next_line_in_ = 0;
  int64_t bad_blocks_ = 0;
  bool have_stats_ = false;
  v1::JobStats stats_;
  absl::Status error_;
  absl::Mutex done_mu_;
  bool done_ ABSL_GUARDED_BY(done_mu_) = false;
  grpc::Status status_;
};

absl::StatusOr<v1::Backend> ParseBackend(const std::string& name) {
  if (name == "auto") return v1::BACKEND_AUTO;
  if (name == "cpu") return v1::BACKEND_CPU;
  if (name == "cuda-kernel") return v1::BACKEND_CUDA_KERNEL;
  if (name == "cublas") return v1::BACKEND_CUBLAS;
  return absl::InvalidArgumentError(
      absl::StrCat("--backend=", name, ": use auto, cpu, cuda-kernel or cublas"));
}

const char* ShortBackend(v1::Backend b) {
  switch (b) {
    case v1::BACKEND_CPU:
      return "cpu";
    case v1::BACKEND_CUDA_KERNEL:
      return "cuda-kernel";
    case v1::BACKEND_CUBLAS:
      return "cublas";
    default:
      return "-";
  }
}

int Main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "times streamed N×N float32 jobs and an echo of the same bytes against a dgmm-server "
      "started with --enable_bench_echo; prints CSV. See bench/stream_bench.sh.");
  absl::ParseCommandLine(argc, argv);
  auto backend = ParseBackend(absl::GetFlag(FLAGS_backend));
  if (!backend.ok()) {
    std::fprintf(stderr, "stream_bench: %s\n", std::string(backend.status().message()).c_str());
    return 2;
  }
  std::vector<int64_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    int64_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n <= 0) {
      std::fprintf(stderr, "stream_bench: bad size '%s' in --sizes\n", std::string(s).c_str());
      return 2;
    }
    sizes.push_back(n);
  }
  std::vector<std::string> modes =
      absl::StrSplit(absl::GetFlag(FLAGS_modes), ',', absl::SkipEmpty());
  for (const std::string& m : modes) {
    if (m != "echo" && m != "multiply") {
      std::fprintf(stderr, "stream_bench: bad mode '%s' in --modes (echo, multiply)\n", m.c_str());
      return 2;
    }
  }

  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  auto channel = grpc::CreateCustomChannel(absl::GetFlag(FLAGS_target),
                                           grpc::InsecureChannelCredentials(), args);
  grpc::GenericStub stub(channel);
  const int64_t block_bytes = absl::GetFlag(FLAGS_block_bytes);
  const bool verify = absl::GetFlag(FLAGS_verify);

  auto run = [&](const Workload& w, const std::string& mode) {
    BenchCall call(w, mode == "echo", verify, *backend);
    return call.Run(&stub);
  };
  if (absl::GetFlag(FLAGS_warmup)) {
    const Workload w = MakeWorkload(256, block_bytes);
    for (const std::string& mode : modes) {
      CallResult r = run(w, mode);
      if (!r.status.ok()) {
        std::fprintf(stderr, "stream_bench: warm-up %s failed: %s\n", mode.c_str(),
                     r.status.ToString().c_str());
        return 1;
      }
    }
  }
  if (absl::GetFlag(FLAGS_header)) {
    std::printf(
        "mode,n,bytes_each_way,block_bytes,wall_s,server_total_s,backend,device,bad_blocks\n");
  }
  int failures = 0;
  for (int64_t n : sizes) {
    const Workload w = MakeWorkload(n, block_bytes);
    for (int rep = 0; rep < absl::GetFlag(FLAGS_reps); ++rep) {
      for (const std::string& mode : modes) {
        CallResult r = run(w, mode);
        if (!r.status.ok()) {
          std::fprintf(stderr, "stream_bench: %s N=%lld failed: %s\n", mode.c_str(),
                       static_cast<long long>(n), r.status.ToString().c_str());
          ++failures;
          continue;
        }
        if (r.bad_blocks > 0) ++failures;
        std::string device = r.stats.device().empty() ? "-" : r.stats.device();
        std::replace(device.begin(), device.end(), ',', ';');
        std::printf("%s,%lld,%lld,%lld,%.6f,%.6f,%s,%s,%lld\n", mode.c_str(),
                    static_cast<long long>(n), static_cast<long long>(n * n * 4),
                    static_cast<long long>(w.block_bytes(w.lines_per_block)), r.wall_s,
                    static_cast<double>(r.stats.total_ns()) * 1e-9,
                    mode == "echo" ? "-" : ShortBackend(r.stats.backend()), device.c_str(),
                    static_cast<long long>(r.bad_blocks));
        std::fflush(stdout);
      }
    }
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace dgmm::bench

int main(int argc, char** argv) {
  // A short-lived client: gRPC's poll poller, else the process can wait
  // ~10 s in grpc_shutdown on a many-core host (dgmm::ConfigureGrpcForQuickExit).
  setenv("GRPC_POLL_STRATEGY", "poll", /*overwrite=*/0);
  return dgmm::bench::Main(argc, argv);
}
