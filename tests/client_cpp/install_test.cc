// `cmake --install --component dgmm_client_dev` into a fresh prefix, then a
// project outside the tree (install_consumer/) that only does
// find_package(dgmm CONFIG) and links dgmm::client, built and run against the
// real server.
#include <cstdlib>
#include <filesystem>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::ServerProcess;

std::string Quote(const std::string& s) { return "'" + s + "'"; }

class TempDir {
 public:
  TempDir() {
    char dir[] = "/tmp/dgmm-install-XXXXXX";
    path_ = mkdtemp(dir);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(InstallTest, InstalledPackageBuildsAConsumerThatRunsJobs) {
  TempDir tmp;
  const std::string prefix = tmp.path() + "/prefix";
  const std::string build = tmp.path() + "/build";
  std::string output;
  ASSERT_EQ(RunCommand(std::string(DGMM_CMAKE) + " --install " + Quote(DGMM_BUILD_DIR) +
                           " --prefix " + Quote(prefix) + " --component dgmm_client_dev",
                       &output),
            0)
      << output;
  for (const char* file : {"include/dgmm/client.h", "include/dgmm/credentials.h",
                           "include/dgmm/v1/dgmm.pb.h", "include/grpc/health/v1/health.pb.h",
                           "lib/cmake/dgmm/dgmmConfig.cmake", "lib/libdgmm_client.a"}) {
    EXPECT_TRUE(std::filesystem::exists(prefix + "/" + file)) << file << " not installed";
  }
  // The component holds the library only: no private headers, no programs.
  EXPECT_FALSE(std::filesystem::exists(prefix + "/include/dgmm/src"));
  EXPECT_FALSE(std::filesystem::exists(prefix + "/bin"));

  ASSERT_EQ(RunCommand(std::string(DGMM_CMAKE) + " -S " + Quote(DGMM_CONSUMER_DIR) + " -B " +
                           Quote(build) + " -DCMAKE_BUILD_TYPE=Release" + " -DCMAKE_CXX_COMPILER=" +
                           Quote(DGMM_CXX) + " -DCMAKE_PREFIX_PATH=" + Quote(prefix),
                       &output),
            0)
      << output;
  ASSERT_EQ(RunCommand(std::string(DGMM_CMAKE) + " --build " + Quote(build), &output), 0) << output;

  ServerProcess server({"--threads=1"});
  ASSERT_EQ(RunCommand(Quote(build + "/consumer") + " " + server.address(), &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("consumer ok"));
}

}  // namespace
}  // namespace dgmm
