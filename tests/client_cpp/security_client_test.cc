// dgmm::Client's and dgmm-cli's TLS, mutual TLS and bearer-token options
// against the real dgmm-server (--tls_cert, --tls_key, --tls_client_ca,
// --auth_token_file), with certificates openssl makes for this run.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "dgmm/client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::ServerProcess;

// A CA that signs the server's certificate (issued to dgmm.test and
// 127.0.0.1) and a client certificate; a second CA that signs nothing the
// server trusts. Plus a bearer-token file.
class TestPki {
 public:
  TestPki() {
    char dir[] = "/tmp/dgmm-cli-pki-XXXXXX";
    dir_ = mkdtemp(dir);
    const std::string script = "set -e; cd '" + dir_ + R"(';
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
for ca in ca other; do
  key $ca.key
  openssl req -x509 -new -key $ca.key -out $ca.pem -days 2 -subj "/CN=dgmm test $ca" 2>/dev/null
done
sign() {  # name subject extensions
  key $1.key
  openssl req -new -key $1.key -out $1.csr -subj "$2" 2>/dev/null
  printf '%s\n' "$3" > $1.ext
  openssl x509 -req -in $1.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
    -extfile $1.ext -out $1.pem 2>/dev/null
}
sign server /CN=dgmm.test 'subjectAltName=DNS:dgmm.test,IP:127.0.0.1'
sign named /CN=dgmm.test 'subjectAltName=DNS:dgmm.test'
sign client '/CN=dgmm client' 'extendedKeyUsage=clientAuth'
printf '  tok-%s-%s \n' $$ $RANDOM > token
)";
    std::string output;
    if (RunCommand(script, &output) != 0) ADD_FAILURE() << "openssl failed:\n" << output;
  }
  ~TestPki() {
    std::string output;
    RunCommand("rm -rf '" + dir_ + "'", &output);
  }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }

 private:
  std::string dir_;
};

TestPki& Pki() {
  static TestPki pki;
  return pki;
}

// A server that speaks mutual TLS with Pki's CA and wants its bearer token.
ServerProcess& SecureServer() {
  static ServerProcess server({"--threads=1", "--tls_cert=" + Pki().path("server.pem"),
                               "--tls_key=" + Pki().path("server.key"),
                               "--tls_client_ca=" + Pki().path("ca.pem"),
                               "--auth_token_file=" + Pki().path("token")});
  return server;
}

// Options with the CA, the client certificate and the token, as given.
ClientOptions Options(bool client_cert, bool token, const std::string& ca = "ca.pem") {
  absl::StatusOr<TlsOptions> tls =
      LoadTlsFiles(Pki().path(ca), client_cert ? Pki().path("client.pem") : "",
                   client_cert ? Pki().path("client.key") : "");
  EXPECT_TRUE(tls.ok()) << tls.status();
  ClientOptions options;
  options.deadline = absl::Seconds(20);
  options.retry.max_attempts = 2;
  options.retry.initial_backoff = absl::Milliseconds(10);
  options.tls = *tls;
  if (token) options.bearer_token = LoadBearerToken(Pki().path("token")).value();
  return options;
}

absl::Status RunJob(Client& client) {
  std::vector<float> a(8 * 5, 1.5f), d(5, 2.0f), c(a.size());
  Job job;
  job.matrix = {a.data(), 8, 5, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR};
  job.diagonal = d.data();
  job.diagonal_bytes = d.size() * sizeof(float);
  absl::StatusOr<JobResult> r = client.Multiply(job, c.data(), c.size() * sizeof(float));
  if (!r.ok()) return r.status();
  for (float x : c) {
    if (x != 3.0f) return absl::InternalError("wrong result");
  }
  return absl::OkStatus();
}

TEST(SecurityClientTest, MutualTlsWithTheTokenRunsJobsInBothModes) {
  Client client(SecureServer().address(), Options(true, true));
  EXPECT_TRUE(RunJob(client).ok());
  std::vector<double> a(300 * 200, 0.25), d(200, 4.0), c(a.size());
  Job job;
  job.matrix = {a.data(), 300, 200, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR};
  job.diagonal = d.data();
  job.diagonal_bytes = d.size() * sizeof(double);
  absl::StatusOr<JobResult> streamed = client.MultiplyStream(job, c.data(), c.size() * 8);
  ASSERT_TRUE(streamed.ok()) << streamed.status();
  EXPECT_EQ(c.front(), 1.0);
  EXPECT_EQ(c.back(), 1.0);
  absl::StatusOr<v1::GetServerInfoResponse> info = client.GetServerInfo();
  EXPECT_TRUE(info.ok()) << info.status();
}

TEST(SecurityClientTest, WithoutTheTokenJobsAreUnauthenticated) {
  Client client(SecureServer().address(), Options(true, false));
  EXPECT_EQ(RunJob(client).code(), absl::StatusCode::kUnauthenticated);
  ClientOptions wrong = Options(true, false);
  wrong.bearer_token = "not-the-token";
  Client wrong_client(SecureServer().address(), wrong);
  EXPECT_EQ(RunJob(wrong_client).code(), absl::StatusCode::kUnauthenticated);
}

TEST(SecurityClientTest, WithoutAClientCertificateTheHandshakeFails) {
  Client client(SecureServer().address(), Options(false, true));
  EXPECT_EQ(RunJob(client).code(), absl::StatusCode::kUnavailable);
}

TEST(SecurityClientTest, AServerCertificateFromAnUntrustedCaIsRefused) {
  Client client(SecureServer().address(), Options(true, true, "other.pem"));
  EXPECT_EQ(RunJob(client).code(), absl::StatusCode::kUnavailable);
}

TEST(SecurityClientTest, PlaintextToATlsServerFails) {
  ClientOptions options;
  options.retry.max_attempts = 1;
  options.deadline = absl::Seconds(10);
  Client client(SecureServer().address(), options);
  EXPECT_EQ(RunJob(client).code(), absl::StatusCode::kUnavailable);
}

TEST(SecurityClientTest, ServerNameOverrideAcceptsACertificateIssuedToADnsName) {
  // A TLS-only server whose certificate names dgmm.test but not 127.0.0.1.
  ServerProcess named({"--threads=1", "--tls_cert=" + Pki().path("named.pem"),
                       "--tls_key=" + Pki().path("named.key")});
  ClientOptions options;
  options.deadline = absl::Seconds(20);
  options.retry.max_attempts = 1;
  options.tls = LoadTlsFiles(Pki().path("ca.pem"), "", "").value();
  Client by_ip(named.address(), options);
  EXPECT_EQ(RunJob(by_ip).code(), absl::StatusCode::kUnavailable);
  options.tls->server_name_override = "dgmm.test";
  Client by_name(named.address(), options);
  EXPECT_TRUE(RunJob(by_name).ok());
}

TEST(SecurityClientTest, CliFlagsCarryTlsClientCertificateAndToken) {
  const std::string common =
      " --server=" + SecureServer().address() + " --tls_ca=" + Pki().path("ca.pem") +
      " --tls_cert=" + Pki().path("client.pem") + " --tls_key=" + Pki().path("client.key");
  const std::string token = " --auth_token_file=" + Pki().path("token");
  std::string output;
  EXPECT_EQ(
      RunCommand(testing::CliBinary() + " multiply --random=64 --check" + common + token, &output),
      0)
      << output;
  EXPECT_THAT(output, HasSubstr("OK"));
  EXPECT_EQ(RunCommand(testing::CliBinary() + " info" + common + token, &output), 0) << output;
  EXPECT_EQ(RunCommand(testing::CliBinary() + " info" + common, &output), 1) << output;
  EXPECT_THAT(output, HasSubstr("UNAUTHENTICATED"));
  EXPECT_EQ(RunCommand(testing::CliBinary() + " info --tls_cert=" + Pki().path("client.pem") +
                           " --server=" + SecureServer().address(),
                       &output),
            2)
      << output;
  EXPECT_THAT(output, HasSubstr("--tls_key"));
}

TEST(SecurityClientTest, TokenAndTlsFilesAreCheckedWhenLoaded) {
  EXPECT_THAT(LoadBearerToken(Pki().path("token")).value(), ::testing::StartsWith("tok-"));
  EXPECT_EQ(LoadBearerToken(Pki().path("missing")).status().code(),
            absl::StatusCode::kInvalidArgument);
  absl::StatusOr<TlsOptions> half = LoadTlsFiles("", Pki().path("client.pem"), "");
  EXPECT_EQ(half.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(LoadTlsFiles(Pki().path("nope.pem"), "", "").status().message(),
              HasSubstr("nope.pem"));
}

}  // namespace
}  // namespace dgmm
