#include "tests/integration/rpc_util.h"

#include <chrono>

#include <cmath>
#include <cstring>
#include <limits>
#include <thread>

namespace dgmm::testing {
namespace {

int64_t ElemSize(v1::DType t) { return t == v1::DTYPE_FLOAT64 ? 8 : 4; }

void Store(std::string* bytes, int64_t index, v1::DType t, double v) {
  if (t == v1::DTYPE_FLOAT64) {
    std::memcpy(bytes->data() + index * 8, &v, 8);
  } else {
    const float f = static_cast<float>(v);
    std::memcpy(bytes->data() + index * 4, &f, 4);
  }
}

}  // namespace

double LoadElement(const std::string& bytes, int64_t index, v1::DType t) {
  if (t == v1::DTYPE_FLOAT64) {
    double v;
    std::memcpy(&v, bytes.data() + index * 8, 8);
    return v;
  }
  float v;
  std::memcpy(&v, bytes.data() + index * 4, 4);
  return v;
}

RandomJob MakeJob(int64_t rows, int64_t cols, v1::DType dtype, v1::Layout layout, v1::Side side,
                  uint64_t seed) {
  RandomJob job;
  v1::JobHeader& h = job.header;
  h.set_rows(rows);
  h.set_cols(cols);
  h.set_dtype(dtype);
  h.set_layout(layout);
  h.set_side(side);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(0.5, 2.0);
  const int64_t es = ElemSize(dtype);
  const int64_t dn = side == v1::SIDE_LEFT ? rows : cols;
  std::string diag(static_cast<std::size_t>(dn * es), '\0');
  for (int64_t i = 0; i < dn; ++i) Store(&diag, i, dtype, dist(rng));
  h.set_diagonal(std::move(diag));
  job.matrix.resize(static_cast<std::size_t>(rows * cols * es));
  for (int64_t i = 0; i < rows * cols; ++i) Store(&job.matrix, i, dtype, dist(rng));
  return job;
}

double MaxRelError(const RandomJob& job, const std::string& result) {
  const v1::JobHeader& h = job.header;
  if (result.size() != job.matrix.size()) return std::numeric_limits<double>::infinity();
  const bool row_major = h.layout() != v1::LAYOUT_COL_MAJOR;
  double worst = 0;
  for (int64_t i = 0; i < h.rows(); ++i) {
    for (int64_t j = 0; j < h.cols(); ++j) {
      const int64_t at = row_major ? i * h.cols() + j : j * h.rows() + i;
      const double d = LoadElement(h.diagonal(), h.side() == v1::SIDE_LEFT ? i : j, h.dtype());
      const double want = LoadElement(job.matrix, at, h.dtype()) * d;
      const double got = LoadElement(result, at, h.dtype());
      if (std::isnan(got)) return std::numeric_limits<double>::infinity();
      worst = std::max(worst, std::abs(got - want) / std::abs(want));
    }
  }
  return worst;
}

std::unique_ptr<v1::Dgmm::Stub> Connect(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return v1::Dgmm::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

grpc::Status StreamJob(v1::Dgmm::Stub* stub, const RandomJob& job, int64_t block_lines,
                       std::string* result, v1::JobStats* stats, grpc::ClientContext* context) {
  grpc::ClientContext local;
  grpc::ClientContext* ctx = context != nullptr ? context : &local;
  auto stream = stub->MultiplyStream(ctx);
  const v1::JobHeader& h = job.header;
  const bool row_major = h.layout() != v1::LAYOUT_COL_MAJOR;
  const int64_t line_bytes = (row_major ? h.cols() : h.rows()) * ElemSize(h.dtype());
  if (result != nullptr) {
    result->assign(job.matrix.size(), '\0');
    for (int64_t i = 0; i < static_cast<int64_t>(job.matrix.size()) / ElemSize(h.dtype()); ++i) {
      Store(result, i, h.dtype(), std::numeric_limits<double>::quiet_NaN());
    }
  }
  // Writer thread so that sending and receiving overlap, as a real client does.
  std::thread writer([&] { WriteJob(stream.get(), job, block_lines); });
  v1::MultiplyStreamResponse resp;
  while (stream->Read(&resp)) {
    if (resp.has_block() && result != nullptr) {
      const auto& b = resp.block();
      if (b.first_line() >= 0 && b.first_line() * line_bytes + static_cast<int64_t>(b.data().size()) <=
                                     static_cast<int64_t>(result->size())) {
        std::memcpy(result->data() + b.first_line() * line_bytes, b.data().data(), b.data().size());
      }
    } else if (resp.has_stats() && stats != nullptr) {
      *stats = resp.stats();
    }
  }
  writer.join();
  return stream->Finish();
}

void WriteJob(
    grpc::ClientReaderWriter<v1::MultiplyStreamRequest, v1::MultiplyStreamResponse>* stream,
    const RandomJob& job, int64_t block_lines) {
  const v1::JobHeader& h = job.header;
  const int64_t lines = h.layout() != v1::LAYOUT_COL_MAJOR ? h.rows() : h.cols();
  const int64_t line_bytes = static_cast<int64_t>(job.matrix.size()) / lines;
  v1::MultiplyStreamRequest req;
  *req.mutable_header() = h;
  if (!stream->Write(req)) return;
  for (int64_t first = 0; first < lines; first += block_lines) {
    const int64_t n = std::min(block_lines, lines - first);
    v1::MultiplyStreamRequest b;
    b.mutable_block()->set_first_line(first);
    b.mutable_block()->set_data(job.matrix.data() + first * line_bytes,
                                static_cast<std::size_t>(n * line_bytes));
    if (!stream->Write(b)) return;
  }
  stream->WritesDone();
}

v1::MultiplyRequest RequestOf(const RandomJob& job) {
  v1::MultiplyRequest req;
  *req.mutable_header() = job.header;
  req.set_matrix(job.matrix);
  return req;
}

grpc::Status UnaryJob(v1::Dgmm::Stub* stub, const RandomJob& job, v1::MultiplyResponse* response,
                      grpc::ClientContext* context) {
  grpc::ClientContext local;
  return stub->Multiply(context != nullptr ? context : &local, RequestOf(job), response);
}

grpc::Status SmallJob(v1::Dgmm::Stub* stub, const RandomJob& job, v1::MultiplyResponse* response,
                      grpc::ClientContext* context) {
  grpc::ClientContext local;
  return stub->MultiplySmall(context != nullptr ? context : &local, RequestOf(job), response);
}

v1::GetServerInfoResponse Info(v1::Dgmm::Stub* stub) {
  grpc::ClientContext ctx;
  v1::GetServerInfoResponse info;
  grpc::Status s = stub->GetServerInfo(&ctx, {}, &info);
  if (!s.ok()) std::abort();
  return info;
}

int64_t Reserved(v1::Dgmm::Stub* stub) {
  int64_t sum = 0;
  const v1::GetServerInfoResponse info = Info(stub);
  for (const auto& d : info.devices()) sum += d.reserved_bytes();
  return sum;
}

HeldStream::HeldStream(v1::Dgmm::Stub* stub, int64_t rows, int64_t cols)
    : job_(MakeJob(rows, cols, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 99)) {
  stream_ = stub->MultiplyStream(&ctx_);
  v1::MultiplyStreamRequest h;
  *h.mutable_header() = job_.header;
  if (!stream_->Write(h)) return;
  v1::MultiplyStreamResponse resp;
  accepted_ = stream_->Read(&resp) && resp.has_accepted();
}

grpc::Status HeldStream::Finish() {
  v1::MultiplyStreamRequest b;
  b.mutable_block()->set_first_line(0);
  b.mutable_block()->set_data(job_.matrix);
  stream_->Write(b);
  stream_->WritesDone();
  v1::MultiplyStreamResponse resp;
  while (stream_->Read(&resp)) {
  }
  return stream_->Finish();
}

int64_t Queued(v1::Dgmm::Stub* stub) {
  int64_t n = 0;
  const v1::GetServerInfoResponse info = Info(stub);
  for (const auto& d : info.devices()) n += d.queued_jobs();
  return n;
}

int64_t Rejected(v1::Dgmm::Stub* stub, const std::string& reason) {
  int64_t n = 0;
  const v1::GetServerInfoResponse info = Info(stub);
  for (const auto& d : info.devices()) {
    auto it = d.rejected_jobs().find(reason);
    if (it != d.rejected_jobs().end()) n += it->second;
  }
  return n;
}

bool WaitUntil(const std::function<bool()>& pred, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

}  // namespace dgmm::testing
