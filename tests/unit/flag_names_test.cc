#include "util/flag_names.h"

#include "gtest/gtest.h"

namespace dgmm {
namespace {

TEST(NormalizeFlagNames, TurnsDashesInNamesIntoUnderscoresOnly) {
  const char* argv[] = {"prog", "--max-queue=3", "--gpu-memory-budget", "80%", "--x=a-b",
                        "--", "--not-a-flag"};
  auto out = NormalizeFlagNames(7, const_cast<char**>(argv));
  EXPECT_EQ(out[1], "--max_queue=3");
  EXPECT_EQ(out[2], "--gpu_memory_budget");
  EXPECT_EQ(out[3], "80%");
  EXPECT_EQ(out[4], "--x=a-b");
  EXPECT_EQ(out[6], "--not-a-flag");
}

TEST(ParseBytes, AcceptsBinaryAndDecimalUnits) {
  EXPECT_EQ(*ParseBytes("1024"), 1024);
  EXPECT_EQ(*ParseBytes("1GiB"), int64_t{1} << 30);
  EXPECT_EQ(*ParseBytes("512MiB"), int64_t{512} << 20);
  EXPECT_EQ(*ParseBytes("2GB"), 2000000000);
  EXPECT_EQ(*ParseBytes("1.5KiB"), 1536);
  EXPECT_FALSE(ParseBytes("lots").ok());
  EXPECT_FALSE(ParseBytes("12 parsecs").ok());
}

TEST(ParseBudget, AcceptsPercentOfBase) {
  EXPECT_EQ(*ParseBudget("50%", 1000), 500);
  EXPECT_EQ(*ParseBudget("1GiB", 1000), int64_t{1} << 30);
  EXPECT_FALSE(ParseBudget("0%", 1000).ok());
  EXPECT_FALSE(ParseBudget("150%", 1000).ok());
}

}  // namespace
}  // namespace dgmm
