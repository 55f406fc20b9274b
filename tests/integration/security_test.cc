// TLS, mutual TLS and bearer tokens through the real server, with
// certificates made by openssl for this test run.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include "dgmm/bench/v1/echo.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

std::string Slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Two CAs; a server certificate for localhost/127.0.0.1 and a client
// certificate from the first, a client certificate from the second.
class Pki {
 public:
  Pki() {
    char tmpl[] = "/tmp/dgmm-pki-XXXXXX";
    dir_ = mkdtemp(tmpl);
    const std::string script = R"(set -e
cd ")" + dir_ + R"("
ossl() { openssl "$@" >/dev/null 2>&1; }
for ca in ca other; do
  ossl req -x509 -newkey rsa:2048 -nodes -keyout $ca.key -out $ca.pem -days 2 -subj "/CN=dgmm test $ca"
done
printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > server.ext
ossl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=localhost"
ossl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile server.ext
for c in ca other; do
  ossl req -newkey rsa:2048 -nodes -keyout client-$c.key -out client-$c.csr -subj "/CN=client of $c"
  ossl x509 -req -in client-$c.csr -CA $c.pem -CAkey $c.key -CAcreateserial -out client-$c.pem -days 2
done
printf 's3cret-token-%s\n' "$RANDOM$RANDOM" > token
)";
    std::string out;
    ok_ = RunCommand(script, &out) == 0;
    if (!ok_) std::fprintf(stderr, "openssl failed:\n%s\n", out.c_str());
  }
  ~Pki() {
    std::string out;
    RunCommand("rm -rf '" + dir_ + "'", &out);
  }
  bool ok() const { return ok_; }
  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  std::string read(const std::string& name) const { return Slurp(path(name)); }

 private:
  std::string dir_;
  bool ok_ = false;
};

std::shared_ptr<grpc::Channel> TlsChannel(const std::string& address, const Pki& pki,
                                          const std::string& client = "") {
  grpc::SslCredentialsOptions o;
  o.pem_root_certs = pki.read("ca.pem");
  if (!client.empty()) {
    o.pem_private_key = pki.read("client-" + client + ".key");
    o.pem_cert_chain = pki.read("client-" + client + ".pem");
  }
  return grpc::CreateChannel(address, grpc::SslCredentials(o));
}

grpc::Status TryJob(const std::shared_ptr<grpc::Channel>& channel, const std::string& token = "") {
  auto stub = v1::Dgmm::NewStub(channel);
  RandomJob job = MakeJob(20, 30, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 1);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  if (!token.empty()) ctx.AddMetadata("authorization", "Bearer " + token);
  v1::MultiplyResponse resp;
  grpc::Status s = UnaryJob(stub.get(), job, &resp, &ctx);
  if (s.ok() && MaxRelError(job, resp.result()) > 1.2e-7) {
    return grpc::Status(grpc::StatusCode::DATA_LOSS, "wrong result");
  }
  return s;
}

TEST(Security, TlsServerServesTlsClientsAndRefusesPlaintext) {
  Pki pki;
  ASSERT_TRUE(pki.ok());
  ServerProcess server({"--backend=cpu", "--tls_cert=" + pki.path("server.pem"),
                        "--tls_key=" + pki.path("server.key")});
  const std::string address = "localhost:" + server.address().substr(server.address().find(':') + 1);
  EXPECT_TRUE(TryJob(TlsChannel(address, pki)).ok());
  EXPECT_EQ(TryJob(grpc::CreateChannel(address, grpc::InsecureChannelCredentials())).error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST(Security, MutualTlsAdmitsOnlyClientsWithCertificatesFromTheClientCa) {
  Pki pki;
  ASSERT_TRUE(pki.ok());
  ServerProcess server({"--backend=cpu", "--tls_cert=" + pki.path("server.pem"),
                        "--tls_key=" + pki.path("server.key"),
                        "--tls_client_ca=" + pki.path("ca.pem")});
  const std::string address = "localhost:" + server.address().substr(server.address().find(':') + 1);
  EXPECT_TRUE(TryJob(TlsChannel(address, pki, "ca")).ok()) << "good client";
  EXPECT_EQ(TryJob(TlsChannel(address, pki)).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "client without a certificate";
  EXPECT_EQ(TryJob(TlsChannel(address, pki, "other")).error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "client with a certificate from another CA";
}

TEST(Security, BearerTokenIsRequiredForDgmmButNotForHealth) {
  Pki pki;
  ASSERT_TRUE(pki.ok());
  ServerProcess server({"--backend=cpu", "--auth_token_file=" + pki.path("token")});
  std::string token = pki.read("token");
  while (!token.empty() && (token.back() == '\n')) token.pop_back();
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  EXPECT_TRUE(TryJob(channel, token).ok());
  grpc::Status missing = TryJob(channel);
  EXPECT_EQ(missing.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_NE(missing.error_message().find("requires a bearer token"), std::string::npos);
  EXPECT_EQ(TryJob(channel, token + "x").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(TryJob(channel, "wrong").error_code(), grpc::StatusCode::UNAUTHENTICATED);

  // A stream without the token is refused too.
  auto stub = v1::Dgmm::NewStub(channel);
  RandomJob job = MakeJob(4, 4, v1::DTYPE_FLOAT64, v1::LAYOUT_ROW_MAJOR, v1::SIDE_LEFT, 2);
  EXPECT_EQ(StreamJob(stub.get(), job, 2, nullptr, nullptr).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  grpc::ClientContext info_ctx;
  v1::GetServerInfoResponse info;
  EXPECT_EQ(stub->GetServerInfo(&info_ctx, {}, &info).error_code(),
            grpc::StatusCode::UNAUTHENTICATED);

  auto health = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext ctx;
  grpc::health::v1::HealthCheckResponse r;
  ASSERT_TRUE(health->Check(&ctx, {}, &r).ok());
  EXPECT_EQ(r.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(Security, BenchmarkEchoNeedsTheTokenToo) {
  Pki pki;
  ASSERT_TRUE(pki.ok());
  ServerProcess server({"--backend=cpu", "--enable_bench_echo",
                        "--auth_token_file=" + pki.path("token")});
  std::string token = pki.read("token");
  while (!token.empty() && token.back() == '\n') token.pop_back();
  auto echo = bench::v1::Echo::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  RandomJob job = MakeJob(6, 5, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 3);
  // One echo of `header` and the job's matrix as one block: the call's
  // status and the bytes that came back.
  auto echo_once = [&](const v1::JobHeader& header, bool with_token, std::string* back) {
    grpc::ClientContext ctx;
    if (with_token) ctx.AddMetadata("authorization", "Bearer " + token);
    auto stream = echo->Echo(&ctx);
    v1::MultiplyStreamRequest h;
    *h.mutable_header() = header;
    stream->Write(h);
    v1::MultiplyStreamRequest b;
    b.mutable_block()->set_first_line(0);
    b.mutable_block()->set_data(job.matrix);
    stream->Write(b);
    stream->WritesDone();
    v1::MultiplyStreamResponse resp;
    while (stream->Read(&resp)) {
      if (resp.has_block()) *back += resp.block().data();
    }
    return stream->Finish();
  };
  for (bool with_token : {false, true}) {
    std::string back;
    grpc::Status s = echo_once(job.header, with_token, &back);
    if (with_token) {
      EXPECT_TRUE(s.ok()) << s.error_message();
      EXPECT_EQ(back, job.matrix);  // echoed unchanged
    } else {
      EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    }
  }
  // A promoted header (a float64 diagonal with a float32 A) is echoed as
  // A's bytes too, not refused once the stream has begun.
  v1::JobHeader promoted = job.header;
  promoted.set_diagonal_dtype(v1::DTYPE_FLOAT64);
  promoted.set_diagonal(std::string(5 * sizeof(double), '\0'));
  std::string back;
  grpc::Status s = echo_once(promoted, true, &back);
  EXPECT_TRUE(s.ok()) << s.error_code() << " " << s.error_message();
  EXPECT_EQ(back, job.matrix);
}

TEST(Security, MisconfiguredTlsFlagsStopTheServerWithAClearMessage) {
  std::string out;
  const int rc = RunCommand(ServerBinary() + " --listen=127.0.0.1:0 --tls_cert=/nonexistent.pem",
                            &out);
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("--tls_cert and --tls_key must be given together"), std::string::npos) << out;
}

}  // namespace
}  // namespace dgmm::testing
