// Names of enum values, one table per enum: the name of a value (for logs,
// metrics labels and messages) and the value of a name.
#ifndef DGMM_SERVICE_CORE_ENUM_NAMES_H_
#define DGMM_SERVICE_CORE_ENUM_NAMES_H_

#include <cstddef>
#include <optional>

#include "absl/strings/string_view.h"

namespace dgmm {

template <typename E>
struct EnumName {
  E value;
  const char* name;
};

// `unknown` for a value the table lacks.
template <typename E, std::size_t N>
constexpr const char* NameOf(const EnumName<E> (&table)[N], E value, const char* unknown = "?") {
  for (const EnumName<E>& n : table) {
    if (n.value == value) return n.name;
  }
  return unknown;
}

template <typename E, std::size_t N>
std::optional<E> ValueOf(const EnumName<E> (&table)[N], absl::string_view name) {
  for (const EnumName<E>& n : table) {
    if (name == n.name) return n.value;
  }
  return std::nullopt;
}

}  // namespace dgmm

#endif  // DGMM_SERVICE_CORE_ENUM_NAMES_H_
