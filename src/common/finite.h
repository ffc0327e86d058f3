// The NaN/Inf check of gradient values, on both sides of a push: the client
// refuses a bad push before any server sees a part of it (so none applies a
// half), and every server checks again what a peer sends.
#pragma once

#include <bit>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace hetps {

// Index of the first non-finite value, or -1. Tests the exponent bits so the
// loop vectorises; NaN and ±Inf are exactly the floats with all ones there.
inline int64_t FirstNonFinite(std::span<const float> values) {
  constexpr uint32_t kExp = 0x7f800000u;
  bool any = false;
  for (float v : values) any |= (std::bit_cast<uint32_t>(v) & kExp) == kExp;
  if (!any) return -1;
  for (size_t i = 0; i < values.size(); ++i) {
    if ((std::bit_cast<uint32_t>(values[i]) & kExp) == kExp) {
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

// INVALID_ARGUMENT naming the table, the value and its index.
inline absl::Status CheckFinite(const std::string& table,
                                std::span<const float> values) {
  const int64_t bad = FirstNonFinite(values);
  if (bad < 0) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("table '", table, "': non-finite gradient value ",
                   values[bad], " at index ", bad, "; push refused"));
}

}  // namespace hetps
