// Small file helpers shared by the C++ tests (and the conformance runner).
#ifndef DGMM_TESTS_SUPPORT_FILES_H_
#define DGMM_TESTS_SUPPORT_FILES_H_

#include <optional>
#include <string>

namespace dgmm::testing {

// The whole contents of the file at `path`, byte for byte; nullopt when it
// cannot be opened or read.
std::optional<std::string> ReadFile(const std::string& path);

}  // namespace dgmm::testing

#endif  // DGMM_TESTS_SUPPORT_FILES_H_
