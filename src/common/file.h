// Reading a whole file, the one way hetps does it.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace hetps {

// The content of `path`. Errors (NOT_FOUND when it does not exist, a
// directory included) read "cannot read '<path>' (<reason>)"; callers put
// the field or file role in front.
absl::StatusOr<std::string> ReadFile(const std::string& path);

}  // namespace hetps
