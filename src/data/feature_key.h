// Feature keys: one 64-bit key space for every table. The slot (feature
// field) sits in the top kSlotBits bits, a hash of the feature's value in the
// rest, so fields never collide with each other and tables stay one space.
#pragma once

#include <cstdint>

#include "common/hash.h"

namespace hetps {

inline constexpr int kSlotBits = 16;
inline constexpr int kValueBits = 64 - kSlotBits;

constexpr uint64_t FeatureKey(uint32_t slot, uint64_t value) {
  return (static_cast<uint64_t>(slot) << kValueBits) |
         (Mix64(value) & ((uint64_t{1} << kValueBits) - 1));
}

constexpr uint32_t SlotOf(uint64_t key) {
  return static_cast<uint32_t>(key >> kValueBits);
}

}  // namespace hetps
