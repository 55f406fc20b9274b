// MultiplyBatch through the real dgmm-server on loopback: each
// job's own status (a bad job fails alone, with the code and words a
// Multiply call of it gets), the numbers of every valid job against a
// float64 reference computed here from fresh random operands into
// NaN-poisoned outputs, both dtypes, sides and layouts, and the call's own
// limits: an empty batch, the job count, the message size, the memory
// budget. Both with the generated stub (so that bad jobs can be sent as they
// are) and with dgmm::Client::MultiplyBatch.
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "dgmm/client.h"
#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/operands.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using testing::MakeJob;
using testing::MaxRelError;
using testing::RandomJob;
using testing::ServerProcess;

ServerProcess& SharedServer() {
  static ServerProcess server({"--backend=cpu", "--threads=2"});
  return server;
}

// A float32 job's result is one rounding of the float64 product.
double Tolerance(v1::DType dtype) {
  return dtype == v1::DTYPE_FLOAT32 ? std::numeric_limits<float>::epsilon()
                                    : std::numeric_limits<double>::epsilon();
}

v1::MultiplyRequest AsRequest(const RandomJob& job) {
  v1::MultiplyRequest r;
  *r.mutable_header() = job.header;
  r.set_matrix(job.matrix);
  return r;
}

grpc::Status Batch(v1::Dgmm::Stub* stub, const std::vector<v1::MultiplyRequest>& jobs,
                   v1::MultiplyBatchResponse* response) {
  v1::MultiplyBatchRequest request;
  for (const v1::MultiplyRequest& j : jobs) *request.add_jobs() = j;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  return stub->MultiplyBatch(&context, request, response);
}

// The status a Multiply call of `job` ends with.
grpc::Status Unary(v1::Dgmm::Stub* stub, const v1::MultiplyRequest& job) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::MultiplyResponse response;
  return stub->Multiply(&context, job, &response);
}

// The result's rows x cols, poisoned with NaN where it is missing.
std::string ResultOrNan(const RandomJob& job, const v1::MultiplyBatchResult& r) {
  if (r.result().size() == job.matrix.size()) return r.result();
  const size_t elem = job.header.dtype() == v1::DTYPE_FLOAT32 ? 4 : 8;
  std::string nan(job.matrix.size(), '\0');
  for (size_t i = 0; i + elem <= nan.size(); i += elem) {
    if (elem == 4) {
      const float f = std::numeric_limits<float>::quiet_NaN();
      std::memcpy(&nan[i], &f, 4);
    } else {
      const double d = std::numeric_limits<double>::quiet_NaN();
      std::memcpy(&nan[i], &d, 8);
    }
  }
  return nan;
}

TEST(BatchTest, MixedValidAndInvalidJobsEachGetTheirOwnStatus) {
  auto stub = testing::Connect(SharedServer().address());
  std::vector<RandomJob> jobs;
  std::vector<v1::MultiplyRequest> requests;
  std::vector<bool> valid;
  auto add = [&](RandomJob job, v1::MultiplyRequest request, bool ok) {
    jobs.push_back(std::move(job));
    requests.push_back(std::move(request));
    valid.push_back(ok);
  };
  auto add_valid = [&](RandomJob job) {
    v1::MultiplyRequest r = AsRequest(job);
    add(std::move(job), std::move(r), true);
  };
  add_valid(MakeJob(37, 53, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1));
  {  // a diagonal of the wrong length for its side
    RandomJob j = MakeJob(5, 7, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 2);
    j.header.set_diagonal(j.header.diagonal().substr(4));
    v1::MultiplyRequest r = AsRequest(j);
    add(std::move(j), std::move(r), false);
  }
  add_valid(MakeJob(41, 29, v1::DTYPE_FLOAT64, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT, 3));
  {  // no rows
    RandomJob j = MakeJob(3, 3, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 4);
    v1::MultiplyRequest r = AsRequest(j);
    r.mutable_header()->set_rows(0);
    add(std::move(j), std::move(r), false);
  }
  {  // no dtype
    RandomJob j = MakeJob(3, 3, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 5);
    v1::MultiplyRequest r = AsRequest(j);
    r.mutable_header()->set_dtype(v1::DTYPE_UNSPECIFIED);
    add(std::move(j), std::move(r), false);
  }
  {  // a matrix one element short
    RandomJob j = MakeJob(4, 4, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 6);
    v1::MultiplyRequest r = AsRequest(j);
    r.set_matrix(j.matrix.substr(8));
    add(std::move(j), std::move(r), false);
  }
  {  // over --max_dim: RESOURCE_EXHAUSTED for that job alone
    RandomJob j = MakeJob(1, 1, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 7);
    v1::MultiplyRequest r = AsRequest(j);
    r.mutable_header()->set_cols(int64_t{1} << 40);
    add(std::move(j), std::move(r), false);
  }
  {  // an unknown backend value
    RandomJob j = MakeJob(2, 2, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 8);
    v1::MultiplyRequest r = AsRequest(j);
    r.mutable_header()->set_backend(static_cast<v1::Backend>(77));
    add(std::move(j), std::move(r), false);
  }
  add_valid(MakeJob(1, 1, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 9));
  add_valid(MakeJob(100, 100, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 10));

  const int64_t invalid_before = testing::Rejected(stub.get(), "invalid");
  v1::MultiplyBatchResponse response;
  grpc::Status status = Batch(stub.get(), requests, &response);
  ASSERT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  ASSERT_EQ(response.results_size(), static_cast<int>(requests.size()));
  int invalid = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const v1::MultiplyBatchResult& r = response.results(static_cast<int>(i));
    if (valid[i]) {
      EXPECT_EQ(r.status().code(), 0) << i << ": " << r.status().message();
      EXPECT_LE(MaxRelError(jobs[i], ResultOrNan(jobs[i], r)), Tolerance(jobs[i].header.dtype()))
          << i;
      EXPECT_EQ(r.stats().bytes_in(), static_cast<int64_t>(jobs[i].matrix.size())) << i;
      EXPECT_EQ(r.stats().bytes_out(), static_cast<int64_t>(jobs[i].matrix.size())) << i;
      EXPECT_EQ(r.stats().backend(), v1::BACKEND_CPU) << i;
      EXPECT_GT(r.stats().job_id(), 0u) << i;
      continue;
    }
    // Exactly what a Multiply call of the same request gets.
    const grpc::Status unary = Unary(stub.get(), requests[i]);
    ASSERT_FALSE(unary.ok()) << i;
    EXPECT_EQ(r.status().code(), static_cast<int>(unary.error_code())) << i;
    EXPECT_EQ(r.status().message(), unary.error_message()) << i;
    EXPECT_TRUE(r.result().empty()) << i;
    EXPECT_FALSE(r.has_stats()) << i;
    if (unary.error_code() == grpc::StatusCode::INVALID_ARGUMENT) ++invalid;
  }
  EXPECT_EQ(invalid, 5);
  // Each invalid job counted once by the batch, once by its unary twin.
  EXPECT_EQ(testing::Rejected(stub.get(), "invalid") - invalid_before, 2 * invalid);
  // Every job gave its reservation back.
  EXPECT_TRUE(testing::WaitUntil([&] { return testing::Reserved(stub.get()) == 0; }));
}

TEST(BatchTest, BothDtypesSidesAndLayoutsMatchTheReference) {
  auto stub = testing::Connect(SharedServer().address());
  std::vector<RandomJob> jobs;
  std::vector<v1::MultiplyRequest> requests;
  uint64_t seed = 100;
  for (v1::DType dtype : {v1::DTYPE_FLOAT32, v1::DTYPE_FLOAT64}) {
    for (v1::Side side : {v1::SIDE_LEFT, v1::SIDE_RIGHT}) {
      for (v1::Layout layout : {v1::LAYOUT_ROW_MAJOR, v1::LAYOUT_COL_MAJOR}) {
        for (auto [rows, cols] : std::vector<std::pair<int64_t, int64_t>>{
                 {1, 1}, {1, 17}, {19, 1}, {64, 33}, {128, 128}, {129, 130}}) {
          jobs.push_back(MakeJob(rows, cols, dtype, layout, side, seed++));
          requests.push_back(AsRequest(jobs.back()));
        }
      }
    }
  }
  v1::MultiplyBatchResponse response;
  grpc::Status status = Batch(stub.get(), requests, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.results_size(), static_cast<int>(jobs.size()));
  for (size_t i = 0; i < jobs.size(); ++i) {
    const v1::MultiplyBatchResult& r = response.results(static_cast<int>(i));
    EXPECT_EQ(r.status().code(), 0) << r.status().message();
    EXPECT_LE(MaxRelError(jobs[i], ResultOrNan(jobs[i], r)), Tolerance(jobs[i].header.dtype()))
        << i << ": " << jobs[i].header.ShortDebugString().substr(0, 80);
  }
}

TEST(BatchTest, EmptyBatchIsOkWithNoResults) {
  auto stub = testing::Connect(SharedServer().address());
  v1::MultiplyBatchResponse response;
  grpc::Status status = Batch(stub.get(), {}, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.results_size(), 0);
}

TEST(BatchTest, AllJobsInvalidIsOkWithEveryStatus) {
  auto stub = testing::Connect(SharedServer().address());
  RandomJob j = MakeJob(3, 3, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 11);
  v1::MultiplyRequest bad = AsRequest(j);
  bad.mutable_header()->set_cols(-1);
  v1::MultiplyBatchResponse response;
  grpc::Status status = Batch(stub.get(), {bad, bad, bad}, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.results_size(), 3);
  for (const v1::MultiplyBatchResult& r : response.results()) {
    EXPECT_EQ(r.status().code(), static_cast<int>(grpc::StatusCode::INVALID_ARGUMENT));
  }
}

TEST(BatchTest, MalformedBatchFramingIsInvalidArgumentForTheCall) {
  auto stub = testing::Connect(SharedServer().address());
  // Field 1 (a job) claiming 100 bytes with 3 there.
  grpc::GenericStub generic(
      grpc::CreateChannel(SharedServer().address(), grpc::InsecureChannelCredentials()));
  const std::string bytes("\x0a\x64\x01\x02\x03", 5);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::ClientContext context;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  grpc::Status status;
  generic.UnaryCall(&context, "/dgmm.v1.Dgmm/MultiplyBatch", grpc::StubOptions(), &request,
                    &response, [&](grpc::Status s) {
                      std::lock_guard lock(mu);
                      status = s;
                      done = true;
                      cv.notify_all();
                    });
  std::unique_lock lock(mu);
  cv.wait(lock, [&] { return done; });
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("malformed MultiplyBatchRequest"), std::string::npos)
      << status.error_message();
}

TEST(BatchTest, OverTheJobCountLimitIsResourceExhausted) {
  ServerProcess server({"--backend=cpu", "--threads=2", "--max_batch_jobs=8"});
  auto stub = testing::Connect(server.address());
  EXPECT_EQ(testing::Info(stub.get()).limits().max_batch_jobs(), 8);
  std::vector<v1::MultiplyRequest> requests;
  for (int i = 0; i < 9; ++i) {
    requests.push_back(
        AsRequest(MakeJob(2, 2, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 20 + i)));
  }
  v1::MultiplyBatchResponse response;
  grpc::Status status = Batch(stub.get(), requests, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("MultiplyBatch of 9 jobs exceeds this server's 8 jobs "
                                        "per batch (--max_batch_jobs)"),
            std::string::npos)
      << status.error_message();
  requests.pop_back();
  status = Batch(stub.get(), requests, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.results_size(), 8);
}

TEST(BatchTest, OverTheMessageLimitIsResourceExhausted) {
  ServerProcess server({"--backend=cpu", "--threads=2", "--max_unary_message_bytes=1MiB"});
  auto stub = testing::Connect(server.address());
  std::vector<v1::MultiplyRequest> requests;
  for (int i = 0; i < 3; ++i) {  // 3 x 400 KiB, each under the limit alone
    requests.push_back(AsRequest(
        MakeJob(320, 320, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 30 + i)));
  }
  v1::MultiplyBatchResponse response;
  grpc::Status status = Batch(stub.get(), requests, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(status.error_message().find("exceeds this server's max unary message of 1048576 "
                                        "bytes (--max_unary_message_bytes)"),
            std::string::npos)
      << status.error_message();
  EXPECT_GE(testing::Rejected(stub.get(), "message_too_large"), 1);
  requests.pop_back();
  status = Batch(stub.get(), requests, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.results_size(), 2);
  EXPECT_EQ(response.results(1).status().code(), 0);
}

TEST(BatchTest, BatchOverTheMemoryBudgetIsResourceExhaustedWithBytesAndBudget) {
  // 4 MiB of host budget: one 512x512 float32 job (2 x 1 MiB + 2 KiB) fits,
  // four together do not.
  ServerProcess server({"--backend=cpu", "--threads=2", "--host_memory_budget=4MiB",
                        "--max_unary_message_bytes=16MiB", "--transport_memory_budget=64MiB"});
  auto stub = testing::Connect(server.address());
  std::vector<RandomJob> jobs;
  std::vector<v1::MultiplyRequest> requests;
  for (int i = 0; i < 4; ++i) {
    jobs.push_back(
        MakeJob(512, 512, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 40 + i));
    requests.push_back(AsRequest(jobs.back()));
  }
  v1::MultiplyBatchResponse response;
  grpc::Status status = Batch(stub.get(), requests, &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  // The bytes needed: each job's 2 x 1 MiB + 2 KiB diagonal + 256 B.
  const int64_t need = 4 * (2 * (int64_t{1} << 20) + 2048 + 256);
  EXPECT_NE(status.error_message().find("batch of 4 jobs needs " + std::to_string(need) +
                                        " bytes of host memory"),
            std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("capacity is 4194304 bytes (--host_memory_budget)"),
            std::string::npos)
      << status.error_message();
  // One of them alone runs, in a batch too.
  requests.resize(1);
  status = Batch(stub.get(), requests, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_LE(MaxRelError(jobs[0], ResultOrNan(jobs[0], response.results(0))),
            Tolerance(v1::DTYPE_FLOAT32));
  // A job that could never fit alone gets its own RESOURCE_EXHAUSTED, as
  // from Multiply, and the small one next to it runs.
  RandomJob big = MakeJob(1100, 1100, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 50);
  RandomJob small = MakeJob(3, 3, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 51);
  status = Batch(stub.get(), {AsRequest(big), AsRequest(small)}, &response);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(response.results_size(), 2);
  const grpc::Status unary = Unary(stub.get(), AsRequest(big));
  EXPECT_EQ(unary.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(response.results(0).status().code(), static_cast<int>(unary.error_code()));
  EXPECT_EQ(response.results(0).status().message(), unary.error_message());
  EXPECT_EQ(response.results(1).status().code(), 0);
  EXPECT_LE(MaxRelError(small, ResultOrNan(small, response.results(1))),
            Tolerance(v1::DTYPE_FLOAT32));
  EXPECT_TRUE(testing::WaitUntil([&] { return testing::Reserved(stub.get()) == 0; }));
}

TEST(BatchTest, ManyBatchesFromSeveralThreadsMatchTheReference) {
  const std::string address = SharedServer().address();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&address, t] {
      auto stub = testing::Connect(address);
      for (int b = 0; b < 10; ++b) {
        std::vector<RandomJob> jobs;
        std::vector<v1::MultiplyRequest> requests;
        for (int i = 0; i < 16; ++i) {
          const uint64_t seed = static_cast<uint64_t>(10000 * t + 100 * b + i);
          const int64_t n = std::vector<int64_t>{1, 2, 10, 100}[i % 4];
          jobs.push_back(MakeJob(n, n + i % 3, i % 2 ? v1::DTYPE_FLOAT64 : v1::DTYPE_FLOAT32,
                                 v1::LAYOUT_ROW_MAJOR, i % 3 ? v1::SIDE_RIGHT : v1::SIDE_LEFT,
                                 seed));
          requests.push_back(AsRequest(jobs.back()));
        }
        v1::MultiplyBatchResponse response;
        grpc::Status status = Batch(stub.get(), requests, &response);
        ASSERT_TRUE(status.ok()) << status.error_message();
        ASSERT_EQ(response.results_size(), 16);
        for (size_t i = 0; i < jobs.size(); ++i) {
          const v1::MultiplyBatchResult& r = response.results(static_cast<int>(i));
          EXPECT_LE(MaxRelError(jobs[i], ResultOrNan(jobs[i], r)),
                    Tolerance(jobs[i].header.dtype()));
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
}

// dgmm::Client::MultiplyBatch.

template <typename T>
BatchItem Item(const testing::Operands<T>& ops, std::vector<T>* out) {
  *out = ops.NanOutput();
  return {ops.MakeJob(), out->data(), out->size() * sizeof(T)};
}

TEST(BatchClientTest, ResultsInPlaceAndEachJobsOwnError) {
  Client client(SharedServer().address());
  testing::Operands<float> a(37, 53, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 61);
  testing::Operands<double> b(41, 29, v1::LAYOUT_COL_MAJOR, v1::SIDE_LEFT, 62);
  testing::Operands<float> c(1, 1, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 63);
  testing::Operands<float> bad(4, 5, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 64);
  testing::Operands<double> d(300, 200, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 65);
  std::vector<float> ca, cc, cbad, cwrong;
  std::vector<double> cb, cd;
  std::vector<BatchItem> items = {Item(a, &ca), Item(b, &cb), Item(bad, &cbad), Item(c, &cc),
                                  Item(d, &cd)};
  items[2].job.diagonal_bytes -= 4;  // one element short: the server's INVALID_ARGUMENT
  BatchItem wrong = Item(a, &cwrong);
  wrong.out_bytes -= 4;  // the client's own INVALID_ARGUMENT: not sent
  items.push_back(wrong);
  absl::StatusOr<BatchResult> r = client.MultiplyBatch(items);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->jobs.size(), items.size());
  EXPECT_EQ(r->attempts, 1);
  ASSERT_TRUE(r->jobs[0].ok()) << r->jobs[0].status();
  ASSERT_TRUE(r->jobs[1].ok()) << r->jobs[1].status();
  ASSERT_TRUE(r->jobs[3].ok()) << r->jobs[3].status();
  ASSERT_TRUE(r->jobs[4].ok()) << r->jobs[4].status();
  EXPECT_LE(a.MaxRelativeError(ca), std::numeric_limits<float>::epsilon());
  EXPECT_LE(b.MaxRelativeError(cb), std::numeric_limits<double>::epsilon());
  EXPECT_LE(c.MaxRelativeError(cc), std::numeric_limits<float>::epsilon());
  EXPECT_LE(d.MaxRelativeError(cd), std::numeric_limits<double>::epsilon());
  EXPECT_EQ(r->jobs[4]->bytes_out(), static_cast<int64_t>(cd.size() * 8));
  EXPECT_EQ(r->jobs[2].status().code(), absl::StatusCode::kInvalidArgument);
  // The same words as Multiply's.
  std::vector<float> unary_out = bad.NanOutput();
  Job bad_job = items[2].job;
  absl::StatusOr<JobResult> unary =
      client.MultiplyUnary(bad_job, unary_out.data(), unary_out.size() * sizeof(float));
  ASSERT_FALSE(unary.ok());
  EXPECT_EQ(r->jobs[2].status().message(), unary.status().message());
  EXPECT_EQ(r->jobs[5].status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r->jobs[5].status().message().find("output buffer"), std::string::npos);
}

TEST(BatchClientTest, EmptyBatchAndCallErrorsAsStatus) {
  Client client(SharedServer().address());
  absl::StatusOr<BatchResult> r = client.MultiplyBatch({});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->jobs.empty());
  // A batch over the server's message limit is the call's RESOURCE_EXHAUSTED,
  // final (not retried).
  ServerProcess small({"--backend=cpu", "--threads=2", "--max_unary_message_bytes=64KiB"});
  Client to_small(small.address());
  testing::Operands<float> ops(100, 100, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 70);
  std::vector<float> out1, out2;
  absl::StatusOr<BatchResult> over = to_small.MultiplyBatch({Item(ops, &out1), Item(ops, &out2)});
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted) << over.status();
}

TEST(BatchClientTest, RetriesTheWholeBatchOnUnavailable) {
  // Nothing listens yet: the first attempt fails UNAVAILABLE, the retry
  // waits for the connection and reaches the server started meanwhile.
  const int port = testing::FreeLoopbackPort();
  const std::string address = "127.0.0.1:" + std::to_string(port);
  ClientOptions options;
  options.retry.max_reconnect_wait = absl::Seconds(20);
  Client client(address, options);
  testing::Operands<float> ops(10, 10, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 80);
  std::vector<float> out;
  std::vector<BatchItem> items = {Item(ops, &out)};
  absl::StatusOr<BatchResult> r;
  std::thread call([&] { r = client.MultiplyBatch(items); });
  absl::SleepFor(absl::Milliseconds(300));
  ServerProcess server({"--listen=" + address, "--backend=cpu", "--threads=2"});
  call.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_GE(r->attempts, 2);
  ASSERT_TRUE(r->jobs[0].ok()) << r->jobs[0].status();
  EXPECT_LE(ops.MaxRelativeError(out), std::numeric_limits<float>::epsilon());
}

}  // namespace
}  // namespace dgmm
