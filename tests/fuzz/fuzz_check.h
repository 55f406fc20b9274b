// Invariant checks for the libFuzzer harnesses: a failed check aborts, which
// libFuzzer records as a crash with its input.
#ifndef DGMM_TESTS_FUZZ_FUZZ_CHECK_H_
#define DGMM_TESTS_FUZZ_FUZZ_CHECK_H_

#include <cstdio>
#include <cstdlib>

#define FUZZ_CHECK(cond)                                                            \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                                 \
    }                                                                               \
  } while (0)

#endif  // DGMM_TESTS_FUZZ_FUZZ_CHECK_H_
