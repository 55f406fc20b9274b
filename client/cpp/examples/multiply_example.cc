// Scales the columns of a matrix on a dgmm server, checks the result, and
// shows how a rejected job reads.
//
// Usage: multiply_example [TARGET]
//   TARGET: 127.0.0.1:50051 (the default), dns:///dgmm.example:50051, or
//   ipv4:127.0.0.1:50051,127.0.0.1:50052 to spread jobs over two servers.
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "dgmm/client.h"

int main(int argc, char** argv) {
  dgmm::ConfigureGrpcForQuickExit();  // a short-lived program (client.h says why)
  const std::string target = argc > 1 ? argv[1] : "127.0.0.1:50051";

  dgmm::ClientOptions options;
  options.deadline = absl::Seconds(30);           // per job, retries included
  options.load_balancing_policy = "round_robin";  // every address of the target takes jobs
  options.retry.max_attempts = 4;                 // UNAVAILABLE or a full queue: try again
  // For a server started with --tls_cert/--tls_key (and --auth_token_file):
  //   options.tls = dgmm::LoadTlsFiles("ca.pem", "", "").value();
  //   options.bearer_token = dgmm::LoadBearerToken("token").value();
  absl::StatusOr<std::unique_ptr<dgmm::Client>> client = dgmm::Client::Create(target, options);
  if (!client.ok()) {
    std::fprintf(stderr, "%s\n", client.status().ToString().c_str());
    return 2;
  }

  const int64_t rows = 500, cols = 300;
  std::vector<float> a(rows * cols), d(cols), c(rows * cols);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) - 3.0f;
  for (size_t j = 0; j < d.size(); ++j) d[j] = 0.5f * static_cast<float>(j);

  dgmm::Job job;
  job.matrix = {a.data(), rows, cols, dgmm::v1::DTYPE_FLOAT32, dgmm::v1::LAYOUT_ROW_MAJOR};
  job.diagonal = d.data();
  job.diagonal_bytes = d.size() * sizeof(float);
  job.side = dgmm::v1::SIDE_RIGHT;  // C = A·diag(d): column j scaled by d[j]
  absl::StatusOr<dgmm::JobResult> done =
      (*client)->Multiply(job, c.data(), c.size() * sizeof(float));
  if (!done.ok()) {  // done.status().code() is the gRPC code, .message() the server's
    std::fprintf(stderr, "multiply failed: %s\n", done.status().ToString().c_str());
    return 1;
  }
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < cols; ++j) {
      const double expected = static_cast<double>(a[i * cols + j]) * d[j];
      if (std::fabs(c[i * cols + j] - expected) > 1e-6 * std::fabs(expected)) {
        std::fprintf(stderr, "wrong C[%lld][%lld]\n", static_cast<long long>(i),
                     static_cast<long long>(j));
        return 1;
      }
    }
  }
  std::printf("C = A·diag(d) checked: %lldx%lld float32, %s on %s, %.3f ms on the server\n",
              static_cast<long long>(rows), static_cast<long long>(cols),
              dgmm::TransferModeName(done->mode), done->stats.device().c_str(),
              static_cast<double>(done->stats.total_ns()) / 1e6);

  job.diagonal_bytes = 10 * sizeof(float);  // the wrong length: the server refuses the job
  absl::Status refused = (*client)->Multiply(job, c.data(), c.size() * sizeof(float)).status();
  std::printf("refused: %s\n", refused.ToString().c_str());
  return refused.code() == absl::StatusCode::kInvalidArgument ? 0 : 1;
}
