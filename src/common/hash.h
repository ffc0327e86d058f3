// The one 64-bit mixing function hetps uses to spread keys (shard buckets).
#pragma once

#include <cstdint>

namespace hetps {

// A bijective finaliser (splitmix64's): every input bit affects every output
// bit, so structured keys (slot in the high bits) spread evenly.
constexpr uint64_t Mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

// Maps a uniform 64-bit hash onto [0, n) without a division.
constexpr uint32_t ScaleToRange(uint64_t hash, uint32_t n) {
  return static_cast<uint32_t>((static_cast<unsigned __int128>(hash) * n) >> 64);
}

}  // namespace hetps
