// Criteo TSV lines → samples (the layout is in data/criteo_format.h).
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "data/criteo_format.h"
#include "data/text_reader.h"

namespace hetps {
namespace {

// A table, not comparisons: this check runs on every categorical field and
// branchy character tests dominated the parse.
constexpr std::array<bool, 256> kHexDigit = [] {
  std::array<bool, 256> t{};
  for (int c = '0'; c <= '9'; ++c) t[c] = true;
  for (int c = 'a'; c <= 'f'; ++c) t[c] = true;
  for (int c = 'A'; c <= 'F'; ++c) t[c] = true;
  return t;
}();

bool IsHex(std::string_view s) {
  bool ok = true;
  for (char c : s) ok &= kHexDigit[static_cast<unsigned char>(c)];
  return ok;
}

// Shown in error messages, cut so a binary line does not flood the log.
std::string Quoted(std::string_view s) {
  constexpr size_t kMax = 24;
  return s.size() <= kMax
             ? absl::StrCat("'", std::string(s), "'")
             : absl::StrCat("'", std::string(s.substr(0, kMax)), "...'");
}

class CriteoParser final : public LineParser {
 public:
  int num_slots() const override { return kCriteoSlots; }
  int num_dense() const override { return kCriteoIntColumns; }

  absl::Status Parse(std::string_view line, Batch* batch) override {
    // Split first, so a wrong field count is reported as such rather than
    // as whatever field happens to be misplaced.
    size_t count = 0;
    size_t from = 0;
    for (;;) {
      const size_t tab = line.find('\t', from);
      const size_t to = tab == std::string_view::npos ? line.size() : tab;
      if (count < fields_.size()) fields_[count] = line.substr(from, to - from);
      ++count;
      if (tab == std::string_view::npos) break;
      from = tab + 1;
    }
    if (count != fields_.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "expected ", kCriteoFields, " tab-separated fields, got ", count));
    }

    float label = 0;
    if (fields_[0] == "0") {
      label = 0;
    } else if (fields_[0] == "1") {
      label = 1;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("label ", Quoted(fields_[0]), " is not 0 or 1"));
    }

    std::array<int64_t, kCriteoIntColumns> ints{};
    std::array<bool, kCriteoIntColumns> present{};
    for (int j = 0; j < kCriteoIntColumns; ++j) {
      const std::string_view f = fields_[1 + j];
      if (f.empty()) continue;
      if (!ParseInt64(f, &ints[j])) {
        return absl::InvalidArgumentError(absl::StrCat(
            "integer column I", j + 1, ": ", Quoted(f), " is not an integer"));
      }
      present[j] = true;
    }
    for (int c = 0; c < kCriteoCatColumns; ++c) {
      const std::string_view f = fields_[1 + kCriteoIntColumns + c];
      if (!IsHex(f)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "categorical column C", c + 1, ": ", Quoted(f), " is not hex"));
      }
    }

    batch->BeginSample(label);
    for (int j = 0; j < kCriteoIntColumns; ++j) {
      if (present[j]) batch->AddKey(CriteoIntKey(j, ints[j]));
      batch->EndSlot();
    }
    for (int c = 0; c < kCriteoCatColumns; ++c) {
      const std::string_view f = fields_[1 + kCriteoIntColumns + c];
      if (!f.empty()) batch->AddKey(CriteoCatKey(c, f));
      batch->EndSlot();
    }
    for (int j = 0; j < kCriteoIntColumns; ++j) {
      batch->AddDense(present[j] ? CriteoDense(ints[j]) : 0.0f);
    }
    return absl::OkStatus();
  }

 private:
  std::array<std::string_view, kCriteoFields> fields_;  // scratch
};

}  // namespace

std::unique_ptr<LineParser> MakeCriteoParser() {
  return std::make_unique<CriteoParser>();
}

}  // namespace hetps
