// dgmm-cli's argv parsing: both flag spellings, value forms, and usage errors
// reported as statuses (so the CLI can exit 2) instead of exit(1).
#include "cli/command_line.h"

#include <string>
#include <vector>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "util/flag_types.h"

ABSL_DECLARE_FLAG(dgmm::ByteSize, chunk_bytes);
ABSL_DECLARE_FLAG(std::string, server);
ABSL_DECLARE_FLAG(bool, quiet);
ABSL_DECLARE_FLAG(bool, check);
ABSL_DECLARE_FLAG(int64_t, random);

namespace dgmm::cli {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

absl::StatusOr<CommandLine> Parse(std::vector<std::string> args) {
  args.insert(args.begin(), "dgmm-cli");
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  return ParseCommandLine(static_cast<int>(argv.size()), argv.data());
}

TEST(CommandLineTest, AcceptsDashedAndUnderscoredNamesAndBothValueForms) {
  absl::StatusOr<CommandLine> cl =
      Parse({"multiply", "--chunk-bytes=1MiB", "--server", "host:1", "--random", "12", "-quiet"});
  ASSERT_TRUE(cl.ok()) << cl.status();
  EXPECT_THAT(cl->positional, ElementsAre("multiply"));
  EXPECT_FALSE(cl->help);
  EXPECT_EQ(absl::GetFlag(FLAGS_chunk_bytes).bytes, int64_t{1} << 20);
  EXPECT_EQ(absl::GetFlag(FLAGS_server), "host:1");
  EXPECT_EQ(absl::GetFlag(FLAGS_random), 12);
  EXPECT_TRUE(absl::GetFlag(FLAGS_quiet));

  ASSERT_TRUE(Parse({"--chunk_bytes=2MiB", "--noquiet", "--check=true"}).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_chunk_bytes).bytes, int64_t{2} << 20);
  EXPECT_FALSE(absl::GetFlag(FLAGS_quiet));
  EXPECT_TRUE(absl::GetFlag(FLAGS_check));
}

TEST(CommandLineTest, RecognizesHelpInEveryForm) {
  for (const char* help : {"--help", "-h", "help", "-help"}) {
    absl::StatusOr<CommandLine> cl = Parse({help});
    ASSERT_TRUE(cl.ok()) << help;
    EXPECT_TRUE(cl->help) << help;
  }
}

TEST(CommandLineTest, EverythingAfterDoubleDashIsPositional) {
  absl::StatusOr<CommandLine> cl = Parse({"info", "--", "--server=x"});
  ASSERT_TRUE(cl.ok());
  EXPECT_THAT(cl->positional, ElementsAre("info", "--server=x"));
}

TEST(CommandLineTest, UnknownFlagMissingValueAndBadValueAreInvalidArgument) {
  absl::StatusOr<CommandLine> cl = Parse({"multiply", "--no-such-flag"});
  EXPECT_EQ(cl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cl.status().message()), HasSubstr("unknown flag --no_such_flag"));

  cl = Parse({"multiply", "--random"});
  EXPECT_EQ(cl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cl.status().message()), HasSubstr("needs a value"));

  cl = Parse({"multiply", "--random=lots"});
  EXPECT_EQ(cl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cl.status().message()), HasSubstr("--random"));

  cl = Parse({"multiply", "--chunk_bytes=12XB"});  // refused as it is parsed
  EXPECT_EQ(cl.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(cl.status().message()), HasSubstr("--chunk_bytes"));
  EXPECT_THAT(std::string(cl.status().message()), HasSubstr("unknown unit 'xb'"));

  // --no prefix applies to booleans only.
  EXPECT_FALSE(Parse({"--norandom"}).ok());
}

}  // namespace
}  // namespace dgmm::cli
