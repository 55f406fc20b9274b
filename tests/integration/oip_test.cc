// The Open Inference Protocol against the real dgmm-server over loopback,
// from a C++ client of the stubs generated from proto/inference (what
// Triton's C++ client sends): live, ready, metadata, ModelInfer checked
// against a float64 reference, the errors with their status codes, and the
// job path it shares with Multiply: a ModelInfer job queued behind a held
// stream is ended by its deadline or its cancellation and counted as such.
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <random>
#include <string>
#include <vector>

#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "inference/grpc_predict_v2.grpc.pb.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

using inference::GRPCInferenceService;
using inference::ModelInferRequest;
using inference::ModelInferResponse;

std::unique_ptr<GRPCInferenceService::Stub> OipConnect(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return GRPCInferenceService::NewStub(
      grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args));
}

// Values in [0.5, 2) with either sign, as `T`'s bytes; *values as doubles.
template <typename T>
std::string RandomTensor(int64_t n, std::mt19937_64* rng, std::vector<double>* values) {
  std::uniform_real_distribution<double> u(0.5, 2.0);
  std::string bytes(static_cast<size_t>(n) * sizeof(T), '\0');
  values->resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const T v = static_cast<T>((*rng)() % 2 ? u(*rng) : -u(*rng));
    (*values)[i] = v;
    std::memcpy(bytes.data() + i * sizeof(T), &v, sizeof(T));
  }
  return bytes;
}

struct Job {
  ModelInferRequest request;
  std::vector<double> reference;  // C, row-major
};

// A rows x cols job of `T` ("FP32" or "FP64") for `side`, and its float64
// reference computed from the definition.
template <typename T>
Job MakeOipJob(const std::string& datatype, const std::string& side, int64_t rows, int64_t cols,
               uint64_t seed) {
  std::mt19937_64 rng(seed);
  Job job;
  ModelInferRequest& r = job.request;
  r.set_model_name("dgmm");
  r.set_id("cpp-" + std::to_string(seed));
  (*r.mutable_parameters())["side"].set_string_param(side);
  std::vector<double> a, l, rr;
  const auto add = [&](const char* name, std::vector<int64_t> shape, std::vector<double>* values) {
    auto* t = r.add_inputs();
    t->set_name(name);
    t->set_datatype(datatype);
    int64_t n = 1;
    for (int64_t d : shape) {
      t->add_shape(d);
      n *= d;
    }
    *r.add_raw_input_contents() = RandomTensor<T>(n, &rng, values);
  };
  add("A", {rows, cols}, &a);
  if (side == "both") {
    add("l", {rows}, &l);
    add("r", {cols}, &rr);
  } else {
    add("d", {side == "left" ? rows : cols}, &l);
  }
  job.reference.resize(a.size());
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double x = a[i * cols + j];
      job.reference[i * cols + j] = side == "right" ? x * l[j]
                                    : side == "left" ? l[i] * x
                                                     : l[i] * x * rr[j];
    }
  }
  return job;
}

// Max relative error of the response's C against the reference.
template <typename T>
double MaxRelError(const Job& job, const ModelInferResponse& response) {
  if (response.raw_output_contents_size() != 1) return INFINITY;
  const std::string& raw = response.raw_output_contents(0);
  if (raw.size() != job.reference.size() * sizeof(T)) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < job.reference.size(); ++i) {
    T v;
    std::memcpy(&v, raw.data() + i * sizeof(T), sizeof(T));
    const double err = std::fabs(static_cast<double>(v) - job.reference[i]) /
                       std::fabs(job.reference[i]);
    worst = std::isnan(err) ? INFINITY : std::max(worst, err);
  }
  return worst;
}

class OipTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new ServerProcess({"--backend=cpu", "--threads=2"}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { stub_ = OipConnect(server_->address()); }

  static ServerProcess* server_;
  std::unique_ptr<GRPCInferenceService::Stub> stub_;
};
ServerProcess* OipTest::server_ = nullptr;

TEST_F(OipTest, LiveReadyAndMetadata) {
  {
    grpc::ClientContext ctx;
    inference::ServerLiveResponse live;
    ASSERT_TRUE(stub_->ServerLive(&ctx, {}, &live).ok());
    EXPECT_TRUE(live.live());
  }
  {
    grpc::ClientContext ctx;
    inference::ServerReadyResponse ready;
    ASSERT_TRUE(stub_->ServerReady(&ctx, {}, &ready).ok());
    EXPECT_TRUE(ready.ready());
  }
  {
    grpc::ClientContext ctx;
    inference::ServerMetadataResponse meta;
    ASSERT_TRUE(stub_->ServerMetadata(&ctx, {}, &meta).ok());
    EXPECT_EQ(meta.name(), "dgmm");
    EXPECT_FALSE(meta.version().empty());
  }
  {
    grpc::ClientContext ctx;
    inference::ModelReadyRequest req;
    req.set_name("dgmm");
    inference::ModelReadyResponse ready;
    ASSERT_TRUE(stub_->ModelReady(&ctx, req, &ready).ok());
    EXPECT_TRUE(ready.ready());
  }
  {
    grpc::ClientContext ctx;
    inference::ModelMetadataRequest req;
    req.set_name("dgmm");
    inference::ModelMetadataResponse meta;
    ASSERT_TRUE(stub_->ModelMetadata(&ctx, req, &meta).ok());
    ASSERT_EQ(meta.inputs_size(), 2);
    EXPECT_EQ(meta.inputs(0).name(), "A");
    EXPECT_EQ(meta.inputs(0).shape_size(), 2);
    EXPECT_EQ(meta.inputs(0).shape(0), -1);
    EXPECT_EQ(meta.inputs(1).name(), "d");
    ASSERT_EQ(meta.outputs_size(), 1);
    EXPECT_EQ(meta.outputs(0).name(), "C");
  }
  {
    // The standard health service knows the service by name too.
    auto health = grpc::health::v1::Health::NewStub(
        grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials()));
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service("inference.GRPCInferenceService");
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
}

TEST_F(OipTest, InferMatchesTheReferenceOnEverySide) {
  uint64_t seed = std::random_device()();
  for (const char* side : {"right", "left", "both"}) {
    for (const auto& [rows, cols] : {std::pair{1, 1}, std::pair{17, 45}, std::pair{300, 211}}) {
      SCOPED_TRACE(std::string(side) + " " + std::to_string(rows) + "x" + std::to_string(cols));
      {
        Job job = MakeOipJob<float>("FP32", side, rows, cols, ++seed);
        grpc::ClientContext ctx;
        ModelInferResponse resp;
        grpc::Status s = stub_->ModelInfer(&ctx, job.request, &resp);
        ASSERT_TRUE(s.ok()) << s.error_message();
        EXPECT_EQ(resp.id(), job.request.id());
        ASSERT_EQ(resp.outputs_size(), 1);
        EXPECT_EQ(resp.outputs(0).name(), "C");
        EXPECT_EQ(resp.outputs(0).datatype(), "FP32");
        ASSERT_EQ(resp.outputs(0).shape_size(), 2);
        EXPECT_EQ(resp.outputs(0).shape(0), rows);
        EXPECT_EQ(resp.outputs(0).shape(1), cols);
        EXPECT_LE(MaxRelError<float>(job, resp), 2.01 * 0x1p-24);
      }
      {
        Job job = MakeOipJob<double>("FP64", side, rows, cols, ++seed);
        grpc::ClientContext ctx;
        ModelInferResponse resp;
        ASSERT_TRUE(stub_->ModelInfer(&ctx, job.request, &resp).ok());
        EXPECT_EQ(resp.outputs(0).datatype(), "FP64");
        EXPECT_LE(MaxRelError<double>(job, resp), 2.01 * 0x1p-53);
      }
    }
  }
}

TEST_F(OipTest, ErrorsHaveTheProtocolsCodes) {
  const auto infer = [&](const ModelInferRequest& req) {
    grpc::ClientContext ctx;
    ModelInferResponse resp;
    return stub_->ModelInfer(&ctx, req, &resp);
  };
  Job job = MakeOipJob<float>("FP32", "right", 3, 4, 7);
  ModelInferRequest unknown = job.request;
  unknown.set_model_name("resnet");
  EXPECT_EQ(infer(unknown).error_code(), grpc::StatusCode::NOT_FOUND);
  ModelInferRequest shape = job.request;
  shape.mutable_inputs(1)->set_shape(0, 3);
  EXPECT_EQ(infer(shape).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  ModelInferRequest missing = job.request;
  missing.mutable_inputs()->RemoveLast();
  missing.mutable_raw_input_contents()->RemoveLast();
  grpc::Status s = infer(missing);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("missing input 'd'"), std::string::npos) << s.error_message();
  ModelInferRequest complex = job.request;
  complex.mutable_inputs(0)->set_datatype("COMPLEX64");
  s = infer(complex);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("dgmm.v1.Dgmm"), std::string::npos) << s.error_message();
  {
    grpc::ClientContext ctx;
    inference::ModelMetadataRequest req;
    req.set_name("resnet");
    inference::ModelMetadataResponse meta;
    EXPECT_EQ(stub_->ModelMetadata(&ctx, req, &meta).error_code(), grpc::StatusCode::NOT_FOUND);
  }
}

// Budget arithmetic as in admission_test.cc: with 64 KiB blocks a held
// stream holds 512 KiB and a little, a unary 200x200 float32 job 320800
// bytes; 560 KiB holds one of either.
const std::vector<std::string> kTightBudget = {"--backend=cpu", "--max_block_bytes=64KiB",
                                               "--host_memory_budget=560KiB"};

TEST(OipAdmission, DeadlinePassingInTheQueueEndsTheJobAndIsCounted) {
  ServerProcess server(kTightBudget);
  auto dgmm = Connect(server.address());
  auto oip = OipConnect(server.address());
  HeldStream holder(dgmm.get(), 4, 4);
  ASSERT_TRUE(holder.accepted());
  Job job = MakeOipJob<float>("FP32", "right", 200, 200, 11);
  auto reply = std::async(std::launch::async, [&] {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    ModelInferResponse resp;
    return oip->ModelInfer(&ctx, job.request, &resp).error_code();
  });
  ASSERT_TRUE(WaitUntil([&] { return Queued(dgmm.get()) == 1; }));
  EXPECT_EQ(reply.get(), grpc::StatusCode::DEADLINE_EXCEEDED);
  EXPECT_TRUE(WaitUntil([&] { return Rejected(dgmm.get(), "deadline") == 1; }));
  EXPECT_EQ(Queued(dgmm.get()), 0);
  ASSERT_TRUE(holder.Finish().ok());
  EXPECT_TRUE(WaitUntil([&] { return Reserved(dgmm.get()) == 0; }));
}

TEST(OipAdmission, CancellingAQueuedJobGivesItsPlaceBackAndTheNextOneRuns) {
  ServerProcess server(kTightBudget);
  auto dgmm = Connect(server.address());
  auto oip = OipConnect(server.address());
  HeldStream holder(dgmm.get(), 4, 4);
  ASSERT_TRUE(holder.accepted());
  Job job = MakeOipJob<float>("FP32", "left", 200, 200, 12);
  grpc::ClientContext ctx;
  auto reply = std::async(std::launch::async, [&] {
    ModelInferResponse resp;
    return oip->ModelInfer(&ctx, job.request, &resp).error_code();
  });
  ASSERT_TRUE(WaitUntil([&] { return Queued(dgmm.get()) == 1; }));
  ctx.TryCancel();
  EXPECT_EQ(reply.get(), grpc::StatusCode::CANCELLED);
  EXPECT_TRUE(WaitUntil([&] { return Rejected(dgmm.get(), "cancelled") == 1; }));
  ASSERT_TRUE(holder.Finish().ok());
  EXPECT_TRUE(WaitUntil([&] { return Reserved(dgmm.get()) == 0; }));
  // With the budget free, the same job runs.
  grpc::ClientContext again;
  ModelInferResponse resp;
  ASSERT_TRUE(oip->ModelInfer(&again, job.request, &resp).ok());
  EXPECT_LE(MaxRelError<float>(job, resp), 2.01 * 0x1p-24);
}

}  // namespace
}  // namespace dgmm::testing
