// The flag types of util/flag_types.h and service/engine/server_backend.h: what they
// accept, what they refuse (at parse, with a message), and that what they
// write parses back to the same value. Plus the parse-before-absl pass of
// util/flag_names.h that lets dgmm-server exit 2 on a bad value.
#include "util/flag_types.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/marshalling.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "service/engine/server_backend.h"
#include "util/flag_names.h"

ABSL_FLAG(dgmm::ByteSize, test_size, dgmm::ByteSize::MiB(4), "for CheckFlagValues");
ABSL_FLAG(int, test_count, 7, "for CheckFlagValues");
ABSL_FLAG(bool, test_switch, false, "for CheckFlagValues");

namespace dgmm {
namespace {

using ::testing::HasSubstr;

template <typename T>
absl::StatusOr<T> Parse(absl::string_view text) {
  T value;
  std::string error;
  if (!absl::ParseFlag(text, &value, &error)) return absl::InvalidArgumentError(error);
  return value;
}

TEST(ByteSizeFlag, ParsesUnitsAndUnparsesInTheLargestExactUnit) {
  EXPECT_EQ(Parse<ByteSize>("64MiB")->bytes, int64_t{64} << 20);
  EXPECT_EQ(Parse<ByteSize>("4MiB")->bytes, int64_t{4} << 20);
  EXPECT_EQ(Parse<ByteSize>("8GiB")->bytes, int64_t{8} << 30);
  EXPECT_EQ(Parse<ByteSize>("1536")->bytes, 1536);
  EXPECT_EQ(Parse<ByteSize>("2GB")->bytes, 2000000000);
  EXPECT_EQ(absl::UnparseFlag(ByteSize::MiB(64)), "64MiB");
  EXPECT_EQ(absl::UnparseFlag(ByteSize::GiB(8)), "8GiB");
  EXPECT_EQ(absl::UnparseFlag(ByteSize{1536}), "1536");
  EXPECT_EQ(absl::UnparseFlag(ByteSize{0}), "0");
  EXPECT_EQ(absl::UnparseFlag(ByteSize{int64_t{3} << 40}), "3TiB");
}

TEST(ByteSizeFlag, RoundTripsThroughUnparse) {
  for (int64_t bytes : {int64_t{0}, int64_t{1}, int64_t{1023}, int64_t{1024}, int64_t{1536},
                        int64_t{4} << 20, (int64_t{5} << 30) + 1, int64_t{2000000000}}) {
    absl::StatusOr<ByteSize> back = Parse<ByteSize>(absl::UnparseFlag(ByteSize{bytes}));
    ASSERT_TRUE(back.ok()) << bytes;
    EXPECT_EQ(back->bytes, bytes);
  }
}

TEST(ByteSizeFlag, RefusesWhatIsNotAByteCountWithAMessage) {
  EXPECT_THAT(std::string(Parse<ByteSize>("12XB").status().message()),
              HasSubstr("unknown unit 'xb'"));
  EXPECT_THAT(std::string(Parse<ByteSize>("lots").status().message()),
              HasSubstr("not a byte count"));
  EXPECT_FALSE(Parse<ByteSize>("-4MiB").ok());
  EXPECT_FALSE(Parse<ByteSize>("").ok());
  EXPECT_FALSE(Parse<ByteSize>("99999999TiB").ok());  // past int64
}

TEST(BudgetFlag, ParsesBytesOrAPercentage) {
  absl::StatusOr<Budget> pct = Parse<Budget>("80%");
  ASSERT_TRUE(pct.ok());
  EXPECT_TRUE(pct->is_percent());
  EXPECT_EQ(pct->Of(1000), 800);
  absl::StatusOr<Budget> bytes = Parse<Budget>("16GiB");
  ASSERT_TRUE(bytes.ok());
  EXPECT_FALSE(bytes->is_percent());
  EXPECT_EQ(bytes->Of(1000), int64_t{16} << 30);
  EXPECT_EQ(Parse<Budget>("12.5%")->Of(1000), 125);
}

TEST(BudgetFlag, UnparsesToWhatParsesBackAndWhatParseBudgetReads) {
  for (const Budget& b : {Budget::Percent(50), Budget::Percent(12.5), Budget::Percent(100),
                          Budget::Bytes(48 << 10), Budget::Bytes(1000)}) {
    const std::string text = absl::UnparseFlag(b);
    absl::StatusOr<Budget> back = Parse<Budget>(text);
    ASSERT_TRUE(back.ok()) << text;
    EXPECT_EQ(*back, b) << text;
    // The text form agrees with ParseBudget (util/flag_names.h), which reads
    // budgets given as text.
    EXPECT_EQ(*ParseBudget(text, 4096), b.Of(4096)) << text;
  }
  EXPECT_EQ(absl::UnparseFlag(Budget::Percent(80)), "80%");
  EXPECT_EQ(absl::UnparseFlag(Budget::Bytes(int64_t{8} << 30)), "8GiB");
}

TEST(BudgetFlag, RefusesBadPercentagesAndEmptyBudgets) {
  for (const char* bad : {"0%", "150%", "-5%", "x%", "%", "0", "12XB", "nan%"}) {
    absl::StatusOr<Budget> b = Parse<Budget>(bad);
    EXPECT_FALSE(b.ok()) << bad;
  }
  EXPECT_THAT(std::string(Parse<Budget>("150%").status().message()),
              HasSubstr("not a percentage in (0, 100]"));
  EXPECT_THAT(std::string(Parse<Budget>("12XB").status().message()),
              HasSubstr("or give a percentage"));
}

TEST(ServerBackendFlag, AcceptsTheEngineNamesOnly) {
  EXPECT_EQ(*Parse<ServerBackend>("auto"), ServerBackend::kAuto);
  EXPECT_EQ(*Parse<ServerBackend>("cpu"), ServerBackend::kCpu);
  EXPECT_EQ(*Parse<ServerBackend>("cuda"), ServerBackend::kCuda);
  EXPECT_EQ(*Parse<ServerBackend>("cuda-kernel"), ServerBackend::kCudaKernel);
  EXPECT_EQ(*Parse<ServerBackend>("cublas"), ServerBackend::kCublas);
  for (ServerBackend b : {ServerBackend::kAuto, ServerBackend::kCpu, ServerBackend::kCuda,
                          ServerBackend::kCudaKernel, ServerBackend::kCublas}) {
    EXPECT_EQ(*Parse<ServerBackend>(absl::UnparseFlag(b)), b);
  }
  EXPECT_EQ(absl::UnparseFlag(ServerBackend::kCudaKernel), "cuda-kernel");
  absl::StatusOr<ServerBackend> gpu = Parse<ServerBackend>("gpu");
  ASSERT_FALSE(gpu.ok());
  EXPECT_THAT(std::string(gpu.status().message()),
              HasSubstr("'gpu' is not a backend; expected auto, cpu, cuda, cuda-kernel or cublas"));
  EXPECT_FALSE(Parse<ServerBackend>("CPU").ok());
}

TEST(CheckFlagRange, NamesTheFlagTheValueAndTheRange) {
  EXPECT_TRUE(CheckFlagRange("max_queue", 1, 1).ok());
  EXPECT_TRUE(CheckFlagRange("cuda_streams", 64, 1, 64).ok());
  absl::Status low = CheckFlagRange("max_queue", 0, 1);
  EXPECT_EQ(low.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(low.message(), "--max_queue=0 is out of range: at least 1");
  EXPECT_EQ(CheckFlagRange("cuda_streams", 65, 1, 64).message(),
            "--cuda_streams=65 is out of range: 1 to 64");
}

std::vector<std::string> Args(std::vector<std::string> args) {
  args.insert(args.begin(), "prog");
  return args;
}

TEST(CheckFlagValues, ParsesEveryValueFormAndNamesTheFirstBadOne) {
  ASSERT_TRUE(
      CheckFlagValues(Args({"--test_size=1GiB", "--test_count", "9", "--test_switch"})).ok());
  EXPECT_EQ(absl::GetFlag(FLAGS_test_size).bytes, int64_t{1} << 30);
  EXPECT_EQ(absl::GetFlag(FLAGS_test_count), 9);

  absl::Status bad = CheckFlagValues(Args({"--test_count=3", "--test_size=12XB"}));
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("--test_size=12XB: '12XB': unknown unit 'xb'"));
  bad = CheckFlagValues(Args({"-test_count", "many"}));
  EXPECT_EQ(bad.message(), "--test_count=many: not a valid value for this flag");
}

TEST(CheckFlagValues, LeavesUnknownFlagsBareBoolsAndArgumentsAfterDoubleDashAlone) {
  EXPECT_TRUE(CheckFlagValues(Args({"--no_such_flag=x", "--test_switch", "positional"})).ok());
  EXPECT_TRUE(CheckFlagValues(Args({"--", "--test_size=12XB"})).ok());
}

}  // namespace
}  // namespace dgmm
