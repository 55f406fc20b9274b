// ClientKeys: who a call comes from, for the fair share (docs/admission.md),
// and x-forwarded-for from trusted proxies only (--trusted_proxies).
#include "service/rpc/call_context.h"

#include <thread>

#include "gtest/gtest.h"
#include "service/rpc/inline_reactions.h"

namespace dgmm {
namespace {

CallInfo Keys(absl::string_view peer, int token, const std::vector<std::string>& trusted,
              std::optional<absl::string_view> forwarded = std::nullopt) {
  CallInfo info;
  ClientKeys(peer, token, trusted, forwarded, &info);
  return info;
}

TEST(ClientKeysTest, ThePeersAddressIsTheClientWithItsPortTheConnection) {
  CallInfo v4 = Keys("ipv4:10.1.2.3:5555", 0, {});
  EXPECT_EQ(v4.client, "10.1.2.3");
  EXPECT_EQ(v4.connection, "10.1.2.3:5555");
  EXPECT_EQ(v4.token, "");
  CallInfo v6 = Keys("ipv6:[::1]:4444", 0, {});
  EXPECT_EQ(v6.client, "::1");
  EXPECT_EQ(v6.connection, "[::1]:4444");
  CallInfo unix_peer = Keys("unix:/run/x.sock", 0, {});
  EXPECT_EQ(unix_peer.client, "unix:/run/x.sock");
}

TEST(ClientKeysTest, SeveralTokensNameTheirClients) {
  CallInfo info = Keys("ipv4:10.1.2.3:5555", 2, {});
  EXPECT_EQ(info.token, "token2");
  EXPECT_EQ(info.client, "token2@10.1.2.3");
  EXPECT_EQ(info.connection, "token2@10.1.2.3:5555");
}

TEST(ClientKeysTest, ForwardedForCountsOnlyFromATrustedProxy) {
  const std::vector<std::string> trusted = {"127.0.0.1", "::1"};
  CallInfo proxied = Keys("ipv4:127.0.0.1:3000", 0, trusted, " 10.0.0.1 , 192.168.0.1");
  EXPECT_EQ(proxied.client, "10.0.0.1");
  EXPECT_EQ(proxied.connection, "10.0.0.1");
  EXPECT_EQ(Keys("ipv6:[::1]:3000", 0, trusted, "10.0.0.2").client, "10.0.0.2");
  // From anyone else the header is ignored.
  CallInfo direct = Keys("ipv4:10.9.9.9:3000", 0, trusted, "10.0.0.1");
  EXPECT_EQ(direct.client, "10.9.9.9");
  EXPECT_EQ(direct.connection, "10.9.9.9:3000");
  // An empty or oversized header is ignored too.
  EXPECT_EQ(Keys("ipv4:127.0.0.1:3000", 0, trusted, " , x").client, "127.0.0.1");
  EXPECT_EQ(Keys("ipv4:127.0.0.1:3000", 0, trusted, std::string(65, 'a')).client, "127.0.0.1");
  EXPECT_EQ(Keys("ipv4:127.0.0.1:3000", 0, trusted).client, "127.0.0.1");
}

// Where unary reactors' OnDone may run (inline_reactions.h): gRPC asks
// InternalInlineable() on the thread that would run it. A plain gRPC unary
// reactor says no (the executor hop dgmm's reactors avoid); dgmm's say yes,
// but not on a thread inside a GrpcOpScope, however nested, and a scope on
// one thread does not reach another.
TEST(InlineReactionsTest, InlineExceptInsideAGrpcOperationOfOurs) {
  struct Plain : grpc::ServerUnaryReactor {
    void OnDone() override {}
  } plain;
  struct Ours : InlineUnaryReactor {
    void OnDone() override {}
  } ours;
  EXPECT_FALSE(plain.InternalInlineable());
  EXPECT_TRUE(ours.InternalInlineable());
  {
    GrpcOpScope op;
    EXPECT_FALSE(ours.InternalInlineable());
    {
      GrpcOpScope nested;
      EXPECT_FALSE(ours.InternalInlineable());
    }
    EXPECT_FALSE(ours.InternalInlineable());
    bool elsewhere = false;
    std::thread([&] { elsewhere = ours.InternalInlineable(); }).join();
    EXPECT_TRUE(elsewhere);
  }
  EXPECT_TRUE(ours.InternalInlineable());
}

}  // namespace
}  // namespace dgmm
