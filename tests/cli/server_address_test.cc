// dgmm-cli's default --server: derived from the server's DGMM_LISTEN, so that
// the container image's HEALTHCHECK (dgmm-cli health, no --server) probes the
// port the container was configured with.
#include <cstdlib>
#include <string>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "cli/commands.h"
#include "gtest/gtest.h"

ABSL_DECLARE_FLAG(std::string, server);

namespace dgmm::cli {
namespace {

TEST(ServerFromListenTest, WildcardHostsBecomeLoopbackOnTheSamePort) {
  EXPECT_EQ(ServerFromListen("0.0.0.0:50061"), "127.0.0.1:50061");
  EXPECT_EQ(ServerFromListen(":7000"), "127.0.0.1:7000");
  EXPECT_EQ(ServerFromListen("[::]:50052"), "[::1]:50052");
}

TEST(ServerFromListenTest, SpecificAddressesAreKeptAndEmptyGivesTheDefault) {
  EXPECT_EQ(ServerFromListen("127.0.0.1:6000"), "127.0.0.1:6000");
  EXPECT_EQ(ServerFromListen("10.1.2.3:50051"), "10.1.2.3:50051");
  EXPECT_EQ(ServerFromListen("[::1]:50051"), "[::1]:50051");
  EXPECT_EQ(ServerFromListen(""), "127.0.0.1:50051");
  EXPECT_EQ(std::string(kDefaultServer), "127.0.0.1:50051");
}

class ServerAddressTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* old = std::getenv("DGMM_LISTEN");
    had_listen_ = old != nullptr;
    if (had_listen_) old_listen_ = old;
    saved_server_ = absl::GetFlag(FLAGS_server);
  }
  void TearDown() override {
    if (had_listen_) {
      setenv("DGMM_LISTEN", old_listen_.c_str(), 1);
    } else {
      unsetenv("DGMM_LISTEN");
    }
    absl::SetFlag(&FLAGS_server, saved_server_);
  }

 private:
  bool had_listen_ = false;
  std::string old_listen_;
  std::string saved_server_;
};

TEST_F(ServerAddressTest, FollowsDgmmListenWhenServerIsNotGiven) {
  absl::SetFlag(&FLAGS_server, "");
  unsetenv("DGMM_LISTEN");
  EXPECT_EQ(ServerAddress(), "127.0.0.1:50051");
  setenv("DGMM_LISTEN", "0.0.0.0:50061", 1);
  EXPECT_EQ(ServerAddress(), "127.0.0.1:50061");
  setenv("DGMM_LISTEN", "", 1);
  EXPECT_EQ(ServerAddress(), "127.0.0.1:50051");
}

TEST_F(ServerAddressTest, AnExplicitServerWins) {
  setenv("DGMM_LISTEN", "0.0.0.0:50061", 1);
  absl::SetFlag(&FLAGS_server, "dns:///dgmm.example:443");
  EXPECT_EQ(ServerAddress(), "dns:///dgmm.example:443");
}

}  // namespace
}  // namespace dgmm::cli
