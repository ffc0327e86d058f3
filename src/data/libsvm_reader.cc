// libsvm ("label idx:val ...") and libfm ("label slot:idx:val ...") lines →
// samples. Both treat features as binary: a feature is present when its
// value is non-zero, and the value itself is not kept.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "data/feature_key.h"
#include "data/text_reader.h"

namespace hetps {
namespace {

bool IsBlank(char c) { return c == ' ' || c == '\t'; }

// Calls `fn(token)` for each blank-separated token of `line`; stops at the
// first error `fn` returns.
template <typename Fn>
absl::Status ForEachToken(std::string_view line, Fn fn) {
  size_t i = 0;
  while (i < line.size()) {
    while (i < line.size() && IsBlank(line[i])) ++i;
    const size_t start = i;
    while (i < line.size() && !IsBlank(line[i])) ++i;
    if (i > start) {
      if (absl::Status s = fn(line.substr(start, i - start)); !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status BadToken(std::string_view token, std::string_view expected) {
  constexpr size_t kMax = 32;
  return absl::InvalidArgumentError(absl::StrCat(
      "token '", std::string(token.substr(0, kMax)),
      token.size() > kMax ? "...'" : "'", " is not ", std::string(expected)));
}

absl::Status BadLabel(std::string_view token) {
  return BadToken(token, "a label (0, 1, -1 or +1)");
}

class LibsvmParser final : public LineParser {
 public:
  int num_slots() const override { return 1; }
  int num_dense() const override { return 0; }

  absl::Status Parse(std::string_view line, Batch* batch) override {
    bool first = true;
    absl::Status s = ForEachToken(line, [&](std::string_view token) {
      if (first) {
        first = false;
        float label = 0;
        if (!ParseBinaryLabel(token, &label)) return BadLabel(token);
        batch->BeginSample(label);
        return absl::OkStatus();
      }
      const size_t colon = token.find(':');
      uint64_t index = 0;
      double value = 0;
      if (colon == std::string_view::npos ||
          !ParseUint64(token.substr(0, colon), &index) ||
          !ParseDouble(token.substr(colon + 1), &value)) {
        return BadToken(token, "index:value");
      }
      if (value != 0) batch->AddKey(FeatureKey(0, index));
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    if (first) return absl::InvalidArgumentError("no label");
    batch->EndSlot();
    return absl::OkStatus();
  }
};

class LibfmParser final : public LineParser {
 public:
  explicit LibfmParser(int slots) : slots_(slots) {}

  int num_slots() const override { return slots_; }
  int num_dense() const override { return 0; }

  absl::Status Parse(std::string_view line, Batch* batch) override {
    features_.clear();
    bool first = true;
    float label = 0;
    absl::Status s = ForEachToken(line, [&](std::string_view token) {
      if (first) {
        first = false;
        if (!ParseBinaryLabel(token, &label)) return BadLabel(token);
        return absl::OkStatus();
      }
      const size_t c1 = token.find(':');
      const size_t c2 = c1 == std::string_view::npos ? std::string_view::npos
                                                     : token.find(':', c1 + 1);
      uint64_t slot = 0;
      uint64_t index = 0;
      double value = 0;
      if (c2 == std::string_view::npos ||
          !ParseUint64(token.substr(0, c1), &slot) ||
          !ParseUint64(token.substr(c1 + 1, c2 - c1 - 1), &index) ||
          !ParseDouble(token.substr(c2 + 1), &value)) {
        return BadToken(token, "slot:index:value");
      }
      if (slot >= static_cast<uint64_t>(slots_)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "slot ", slot, " out of range (data.libfm_slots = ", slots_, ")"));
      }
      if (value != 0) {
        features_.emplace_back(static_cast<uint32_t>(slot),
                               FeatureKey(static_cast<uint32_t>(slot), index));
      }
      return absl::OkStatus();
    });
    if (!s.ok()) return s;
    if (first) return absl::InvalidArgumentError("no label");

    // A line may list its slots in any order; a Batch wants them in slot
    // order. Stable, so keys within a slot keep the line's order.
    std::stable_sort(
        features_.begin(), features_.end(),
        [](const auto& a, const auto& b) { return a.first < b.first; });
    batch->BeginSample(label);
    size_t next = 0;
    for (int slot = 0; slot < slots_; ++slot) {
      while (next < features_.size() &&
             features_[next].first == static_cast<uint32_t>(slot)) {
        batch->AddKey(features_[next++].second);
      }
      batch->EndSlot();
    }
    return absl::OkStatus();
  }

 private:
  const int slots_;
  std::vector<std::pair<uint32_t, uint64_t>> features_;  // scratch
};

}  // namespace

std::unique_ptr<LineParser> MakeLibsvmParser() {
  return std::make_unique<LibsvmParser>();
}

std::unique_ptr<LineParser> MakeLibfmParser(int slots) {
  return std::make_unique<LibfmParser>(slots);
}

}  // namespace hetps
