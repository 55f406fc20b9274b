// dgmm-server started with bad flags: every one ends the process at once with
// exit status 2 and a message naming the flag, before it listens, whatever
// the backend (a bad CUDA flag included, under --backend=auto on a host
// without a GPU too).
#include <ostream>
#include <regex>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/support/server_process.h"

namespace dgmm {
namespace {

using testing::RunCommand;
using testing::ServerBinary;

struct ServerRun {
  int exit_code = -1;
  std::string output;
};

// Runs the server with `flags` (and the environment assignments in `env`),
// bounded by a timeout so that a server that starts after all fails the test
// instead of hanging it (timeout(1) exits 124 then).
ServerRun StartServer(const std::string& flags, const std::string& env = "") {
  ServerRun run;
  run.exit_code = RunCommand(
      env + " timeout 30 " + ServerBinary() + " --listen=127.0.0.1:0 " + flags, &run.output);
  return run;
}

struct BadFlag {
  const char* flags;
  const char* names;  // what the message must contain
};

// Names the parameterized tests after their flags in gtest's and ctest's output.
void PrintTo(const BadFlag& bad, std::ostream* os) { *os << bad.flags; }

class BadFlagTest : public ::testing::TestWithParam<BadFlag> {};

TEST_P(BadFlagTest, ExitsWithStatus2AndAMessageNamingTheFlag) {
  const ServerRun run = StartServer(GetParam().flags);
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find(GetParam().names), std::string::npos) << run.output;
  EXPECT_EQ(run.output.find("listening on"), std::string::npos) << run.output;
}

INSTANTIATE_TEST_SUITE_P(
    Flags, BadFlagTest,
    ::testing::Values(BadFlag{"--max_block_bytes=12XB", "--max_block_bytes"},
                      BadFlag{"--max-block-bytes 12XB", "--max_block_bytes"},
                      BadFlag{"--max_block_bytes=0", "--max_block_bytes=0 is out of range"},
                      BadFlag{"--max_unary_message_bytes=lots", "--max_unary_message_bytes"},
                      BadFlag{"--cuda_tile_bytes=8QB", "--cuda_tile_bytes"},
                      BadFlag{"--host_memory_budget=150%", "--host_memory_budget"},
                      BadFlag{"--gpu_memory_budget=0", "--gpu_memory_budget"},
                      BadFlag{"--cuda_streams=0", "--cuda_streams=0 is out of range"},
                      BadFlag{"--backend=auto --cuda_streams=0", "--cuda_streams"},
                      BadFlag{"--cuda_pieces_in_flight=-1", "--cuda_pieces_in_flight"},
                      BadFlag{"--max_queue=0", "--max_queue=0 is out of range"},
                      BadFlag{"--threads=-1", "--threads"},
                      BadFlag{"--stream_header_timeout_s=0", "--stream_header_timeout_s"},
                      BadFlag{"--stream_idle_timeout_s=0", "--stream_idle_timeout_s"},
                      BadFlag{"--keepalive_time_s=0", "--keepalive_time_s"},
                      BadFlag{"--max_concurrent_streams=0", "--max_concurrent_streams"},
                      BadFlag{"--max_queue=many", "--max_queue"},
                      BadFlag{"--backend=gpu", "--backend"}),
    [](const ::testing::TestParamInfo<BadFlag>& info) { return std::to_string(info.index); });

TEST(BadFlagTest, ABadBackendIsRefusedAtParseListingTheChoices) {
  const ServerRun run = StartServer("--backend=gpu");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(
      run.output.find("dgmm-server: --backend=gpu: 'gpu' is not a backend; expected auto, cpu, "
                      "cuda, cuda-kernel or cublas"),
      std::string::npos)
      << run.output;
}

TEST(BadFlagTest, BadValuesFromTheEnvironmentExitWithStatus2Too) {
  ServerRun run = StartServer("", "DGMM_MAX_BLOCK_BYTES=12XB");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("DGMM_MAX_BLOCK_BYTES"), std::string::npos) << run.output;
  run = StartServer("", "DGMM_MAX_QUEUE=0");
  EXPECT_EQ(run.exit_code, 2) << run.output;
  EXPECT_NE(run.output.find("--max_queue=0"), std::string::npos) << run.output;
}

// The default --helpfull shows for `flag`: the text after "default: " in its
// entry, up to the ';'.
std::string HelpDefault(const std::string& help, const std::string& flag) {
  const size_t entry = help.find("--" + flag + " (");
  if (entry == std::string::npos) return "(no entry for --" + flag + ")";
  const size_t start = help.find("default: ", entry);
  if (start == std::string::npos) return "(no default for --" + flag + ")";
  const size_t value = start + std::string("default: ").size();
  return help.substr(value, help.find(';', value) - value);
}

TEST(BadFlagTest, HelpShowsTheTypedDefaultsAsTheyAreWritten) {
  const ServerRun run = StartServer("--helpfull");
  // Whatever the defaults are, they are written as a user writes them.
  EXPECT_TRUE(std::regex_match(HelpDefault(run.output, "max_unary_message_bytes"),
                               std::regex("[0-9]+(KiB|MiB|GiB)")))
      << run.output;
  EXPECT_TRUE(std::regex_match(HelpDefault(run.output, "max_block_bytes"),
                               std::regex("[0-9]+(KiB|MiB|GiB)")))
      << run.output;
  EXPECT_TRUE(
      std::regex_match(HelpDefault(run.output, "host_memory_budget"), std::regex("[0-9.]+%")))
      << run.output;
  EXPECT_EQ(HelpDefault(run.output, "backend"), "auto") << run.output;
}

}  // namespace
}  // namespace dgmm
