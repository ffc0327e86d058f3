#include "table/initializer.h"

#include <xxhash.h>

#include <cmath>
#include <cstdint>

namespace hetps {
namespace {

// 2^-53: turns the top 53 bits of a hash into a double in [0, 1).
constexpr double kTwoPowMinus53 = 1.0 / 9007199254740992.0;
constexpr double kTwoPi = 6.283185307179586476925286766559;

// Hashes (key, column) under `seed`. XXH3 is used rather than a home-made mix
// so that structured inputs (consecutive keys, column 0..dim-1) still give
// independent-looking bits, and the 128-bit variant gives Box-Muller its two
// uniforms from one call.
XXH128_hash_t HashCell(uint64_t seed, uint64_t key, uint64_t column) {
  const uint64_t cell[2] = {key, column};
  return XXH3_128bits_withSeed(cell, sizeof(cell), seed);
}

// Uniform double in [0, 1).
double UnitInterval(uint64_t bits) {
  return static_cast<double>(bits >> 11) * kTwoPowMinus53;
}

}  // namespace

float InitialValue(const InitializerConfig& init, uint64_t key,
                   uint64_t column) {
  const double scale = init.scale;
  if (init.type == "uniform") {
    const XXH128_hash_t h = HashCell(init.seed, key, column);
    // [0, 1) → [-1, 1); rounding to float may reach +scale, which the
    // contract ([-scale, scale]) allows.
    return static_cast<float>((2.0 * UnitInterval(h.low64) - 1.0) * scale);
  }
  if (init.type == "normal") {
    const XXH128_hash_t h = HashCell(init.seed, key, column);
    // u1 in (0, 1] so the log is finite.
    const double u1 = 1.0 - UnitInterval(h.low64);
    const double u2 = UnitInterval(h.high64);
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(kTwoPi * u2);
    return static_cast<float>(z * scale);
  }
  // "zero", and any type config validation should already have rejected:
  // zero is the one start that is safe for every optimizer.
  return 0.0f;
}

}  // namespace hetps
