// client/cpp/examples/multiply_example.cc against the real server, and
// docs/protocol.md quoting it word for word.
#include <string>

#include "absl/strings/ascii.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/files.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using ::testing::HasSubstr;
using testing::RunCommand;
using testing::ServerProcess;

std::string ReadSource(const std::string& relative) {
  return testing::ReadFile(std::string(DGMM_SOURCE_DIR) + "/" + relative).value_or("");
}

TEST(MultiplyExampleTest, RunsAgainstTheServerAndReportsTheRefusedJob) {
  ServerProcess server({"--threads=1"});
  std::string output;
  ASSERT_EQ(RunCommand(std::string(DGMM_EXAMPLE_BIN) + " " + server.address(), &output), 0)
      << output;
  EXPECT_THAT(output, HasSubstr("C = A·diag(d) checked: 500x300 float32, unary on cpu"));
  EXPECT_THAT(output, HasSubstr("refused: INVALID_ARGUMENT"));
}

TEST(MultiplyExampleTest, SpreadsOverAListOfServers) {
  ServerProcess first({"--threads=1"}), second({"--threads=1"});
  std::string output;
  const std::string target = "ipv4:" + first.address() + "," + second.address();
  ASSERT_EQ(RunCommand(std::string(DGMM_EXAMPLE_BIN) + " " + target, &output), 0) << output;
  EXPECT_THAT(output, HasSubstr("checked"));
}

TEST(MultiplyExampleTest, NothingListeningFailsWithUnavailable) {
  std::string output;
  EXPECT_EQ(RunCommand(std::string(DGMM_EXAMPLE_BIN) + " 127.0.0.1:1", &output), 1) << output;
  EXPECT_THAT(output, HasSubstr("UNAVAILABLE"));
}

TEST(MultiplyExampleTest, ProtocolDocQuotesTheExampleVerbatim) {
  const std::string example(
      absl::StripAsciiWhitespace(ReadSource("client/cpp/examples/multiply_example.cc")));
  ASSERT_FALSE(example.empty());
  EXPECT_THAT(ReadSource("docs/protocol.md"), HasSubstr("```cpp\n" + example + "\n```"))
      << "docs/protocol.md must quote client/cpp/examples/multiply_example.cc verbatim";
}

}  // namespace
}  // namespace dgmm
