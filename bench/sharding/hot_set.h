// The sharding benches' keys: id i of a Zipf draw is key Mix64(i), and after
// a rotation of the hot set the ids below `rotated` (the hottest) take a
// second name, so their rows are new rows in other buckets.
#pragma once

#include <cstdint>

#include "common/hash.h"

namespace hetps::bench {

inline uint64_t KeyOf(uint64_t id, uint64_t rotated) {
  return Mix64(id < rotated ? id ^ 0x5bd1e995ULL << 32 : id);
}

}  // namespace hetps::bench
