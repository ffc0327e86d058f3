// What the two halves of the config code (parsing, validating) share: the
// paths that name a field ("train.optimizer.type", "tables[0]"),
// INVALID_ARGUMENT errors that start with one, and returning one early.
// Private to src/config/.
#pragma once

#include <cstddef>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace hetps {

// `path`.`key` (a bare `key` at the top, `path`[i] for a "[i]" key).
inline std::string JoinPath(const std::string& path, absl::string_view key) {
  if (path.empty()) return std::string(key);
  if (!key.empty() && key.front() == '[') return absl::StrCat(path, key);
  return absl::StrCat(path, ".", key);
}

inline std::string IndexPath(const std::string& path, size_t index) {
  return absl::StrCat(path, "[", index, "]");
}

// INVALID_ARGUMENT from the pieces of a message, the field's path first.
template <typename... Args>
absl::Status Invalid(const Args&... args) {
  return absl::InvalidArgumentError(absl::StrCat(args...));
}

}  // namespace hetps

#define CONFIG_RETURN_IF_ERROR(expr)               \
  do {                                             \
    absl::Status hetps_status_ = (expr);           \
    if (!hetps_status_.ok()) return hetps_status_; \
  } while (false)
