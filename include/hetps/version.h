// Versions a peer must agree on before it may exchange tensors.
#pragma once

#include <cstdint>

namespace hetps {

// Bumped whenever a message's meaning changes. Register and every PS request
// carry it; a mismatch is refused with FAILED_PRECONDITION.
inline constexpr uint32_t kProtocolVersion = 7;

inline constexpr const char* kVersionString = "0.1.0";

}  // namespace hetps
