// Limits a hostile or broken client cannot get around, each broken on
// purpose by a client: the header deadline of streams, concurrent streams per
// connection, idle connections, and clients that freeze mid-job (keepalive).
// (Message size and max_dim are in server_test.cc.)
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "gtest/gtest.h"
#include "tests/integration/rpc_util.h"
#include "tests/support/server_process.h"

namespace dgmm::testing {
namespace {

using Clock = std::chrono::steady_clock;

int64_t Running(v1::Dgmm::Stub* stub) {
  int64_t n = 0;
  const v1::GetServerInfoResponse info = Info(stub);
  for (const auto& d : info.devices()) n += d.running_jobs();
  return n;
}

TEST(Limits, StreamThatSendsNoHeaderIsEndedAfterTheHeaderTimeout) {
  ServerProcess server({"--backend=cpu", "--stream_header_timeout_s=1"});
  auto stub = Connect(server.address());
  grpc::ClientContext ctx;
  const auto start = Clock::now();
  auto stream = stub->MultiplyStream(&ctx);
  v1::MultiplyStreamResponse resp;
  EXPECT_FALSE(stream->Read(&resp));
  grpc::Status s = stream->Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_NE(s.error_message().find("no header within 1s"), std::string::npos) << s.error_message();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
}

TEST(Limits, AdmittedStreamThatGoesQuietIsEndedAndGivesItsMemoryBack) {
  ServerProcess server({"--backend=cpu", "--stream_idle_timeout_s=1"});
  auto stub = Connect(server.address());
  HeldStream quiet(stub.get(), 4, 4);  // header sent, admitted, then nothing
  ASSERT_TRUE(quiet.accepted());
  EXPECT_GT(Reserved(stub.get()), 0);
  EXPECT_TRUE(WaitUntil([&] { return Reserved(stub.get()) == 0; }, 5000))
      << "a stream that sends nothing kept its reservation";
  grpc::Status s = quiet.Finish();
  EXPECT_EQ(s.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED) << s.error_message();
  EXPECT_NE(s.error_message().find("--stream_idle_timeout_s"), std::string::npos)
      << s.error_message();
  // A stream that keeps sending is not cut, however long it takes overall.
  RandomJob job = MakeJob(60, 50, v1::DTYPE_FLOAT32, v1::LAYOUT_ROW_MAJOR, v1::SIDE_RIGHT, 3);
  grpc::ClientContext ctx;
  auto stream = stub->MultiplyStream(&ctx);
  v1::MultiplyStreamRequest h;
  *h.mutable_header() = job.header;
  ASSERT_TRUE(stream->Write(h));
  for (int64_t first = 0; first < 60; first += 20) {
    std::this_thread::sleep_for(std::chrono::milliseconds(600));
    v1::MultiplyStreamRequest b;
    b.mutable_block()->set_first_line(first);
    b.mutable_block()->set_data(job.matrix.substr(first * 200, 20 * 200));
    ASSERT_TRUE(stream->Write(b));
  }
  stream->WritesDone();
  v1::MultiplyStreamResponse resp;
  while (stream->Read(&resp)) {
  }
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(Limits, ConcurrentStreamsPerConnectionAreCapped) {
  ServerProcess server({"--backend=cpu", "--max_concurrent_streams=2"});
  auto stub = Connect(server.address());  // one connection for the three
  // Another connection, to watch: channels with the same arguments would
  // share the first one (gRPC's global subchannel pool).
  grpc::ChannelArguments own;
  own.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  auto observer = v1::Dgmm::NewStub(
      grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), own));
  HeldStream a(stub.get(), 4, 4), b(stub.get(), 4, 4);
  ASSERT_TRUE(a.accepted() && b.accepted());
  // The third stream on the same connection is held back by HTTP/2 until a
  // slot frees: the server never sees it meanwhile.
  std::atomic<bool> third_accepted{false};
  std::thread third([&] {
    HeldStream c(stub.get(), 4, 4);
    third_accepted = c.accepted();
    EXPECT_TRUE(c.Finish().ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  EXPECT_FALSE(third_accepted.load());
  EXPECT_EQ(Running(observer.get()), 2);
  ASSERT_TRUE(a.Finish().ok());
  EXPECT_TRUE(WaitUntil([&] { return third_accepted.load(); }, 5000));
  ASSERT_TRUE(b.Finish().ok());
  third.join();
  EXPECT_TRUE(WaitUntil([&] { return Reserved(observer.get()) == 0; }, 5000));
}

TEST(Limits, IdleConnectionsAreClosedByTheServer) {
  ServerProcess server({"--backend=cpu", "--max_connection_idle_s=1"});
  auto channel = grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials());
  auto stub = v1::Dgmm::NewStub(channel);
  Info(stub.get());
  EXPECT_EQ(channel->GetState(false), GRPC_CHANNEL_READY);
  // gRPC 1.51 checks idleness on a coarse timer: 4-5 s here for a 1 s limit.
  const auto idle_start = Clock::now();
  EXPECT_TRUE(WaitUntil([&] { return channel->GetState(false) != GRPC_CHANNEL_READY; }, 15000))
      << "the server kept an idle connection open";
  std::printf("idle connection closed after %.1f s\n",
              std::chrono::duration<double>(Clock::now() - idle_start).count());
  // And the client reconnects on demand.
  EXPECT_GT(Info(stub.get()).devices_size(), 0);
}

TEST(Limits, FrozenClientIsDroppedByKeepaliveAndItsJobEnds) {
  ServerProcess server({"--backend=cpu", "--keepalive_time_s=1", "--keepalive_timeout_s=1"});
  auto stub = Connect(server.address());
  // A real client process streaming a large job, frozen mid-job.
  const pid_t cli = fork();
  if (cli == 0) {
    // One stream (--stripes=1): the test is about one frozen connection.
    execl(CliBinary().c_str(), CliBinary().c_str(), "multiply", "--random=10000", "--mode=stream",
          "--stripes=1",
          "--quiet", ("--server=" + server.address()).c_str(), nullptr);
    _exit(127);
  }
  ASSERT_TRUE(WaitUntil([&] { return Running(stub.get()) == 1; }, 20000));
  kill(cli, SIGSTOP);
  // Keepalive pings go unanswered; the server drops the connection and the
  // job returns its reservation while the client is still frozen.
  const bool freed = WaitUntil([&] { return Running(stub.get()) == 0 && Reserved(stub.get()) == 0; },
                               30000);
  kill(cli, SIGKILL);
  waitpid(cli, nullptr, 0);
  EXPECT_TRUE(freed) << "a frozen client kept its job and reservation";
  const v1::GetServerInfoResponse info = Info(stub.get());
  EXPECT_GE(info.devices(0).rejected_jobs().count("cancelled"), 1u);
}

}  // namespace
}  // namespace dgmm::testing
