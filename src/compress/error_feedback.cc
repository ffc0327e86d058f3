#include "compress/error_feedback.h"

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "compress/codec.h"

namespace hetps {
namespace {

absl::string_view AbslView(std::string_view s) { return {s.data(), s.size()}; }

bool AllZero(std::span<const float> values) {
  return std::all_of(values.begin(), values.end(),
                     [](float v) { return v == 0; });
}

}  // namespace

std::span<const float> ErrorFeedback::TableResiduals::Residual(
    uint64_t key) const {
  auto row = rows.find(key);
  if (row == rows.end()) return {};
  return {values.data() + uint64_t{row->second.slot} * dim, dim};
}

void ErrorFeedback::TableResiduals::Drop(uint64_t key) {
  auto it = rows.find(key);
  if (it == rows.end()) return;
  by_age.erase(it->second.age_position);
  free_slots.push_back(it->second.slot);
  rows.erase(it);
}

void ErrorFeedback::TableResiduals::Store(uint64_t key,
                                          std::span<const float> residual,
                                          size_t max_rows) {
  // Keys are distinct within a push, so this only matters for a caller that
  // broke that rule: it keeps the age list consistent.
  Drop(key);
  if (rows.size() >= max_rows) Drop(by_age.front());
  uint32_t slot;
  if (!free_slots.empty()) {
    slot = free_slots.back();
    free_slots.pop_back();
  } else {
    slot = static_cast<uint32_t>(values.size() / dim);
    values.resize(values.size() + dim);
  }
  std::copy(residual.begin(), residual.end(),
            values.begin() + uint64_t{slot} * dim);
  by_age.push_back(key);
  rows[key] = Row{encodes, slot, std::prev(by_age.end())};
}

ErrorFeedback::ErrorFeedback(const ErrorFeedbackLimits& limits)
    : limits_(limits) {}

absl::Status ErrorFeedback::EncodeDense(std::string_view tensor,
                                        const CodecSpec& spec,
                                        std::span<const float> grad,
                                        std::string* payload) {
  auto held = dense_.find(tensor);
  if (held != dense_.end() && held->second.size() != grad.size()) {
    payload->clear();
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", AbslView(tensor), "': gradient of ", grad.size(),
        " values, but its residual holds ", held->second.size()));
  }
  corrected_.assign(grad.begin(), grad.end());
  if (held != dense_.end()) {
    for (size_t i = 0; i < grad.size(); ++i) corrected_[i] += held->second[i];
  }
  hetps::EncodeDense(spec, corrected_, payload);
  if (spec.kind == CodecKind::kNone) {
    // fp32 carries the sum exactly: nothing is left over.
    if (held != dense_.end()) dense_.erase(held);
    return absl::OkStatus();
  }
  decoded_.resize(grad.size());
  if (absl::Status s = hetps::DecodeDense(*payload, decoded_); !s.ok()) {
    payload->clear();
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor '", AbslView(tensor), "' not encodable: ", s.message()));
  }
  for (size_t i = 0; i < grad.size(); ++i) corrected_[i] -= decoded_[i];
  if (AllZero(corrected_)) {
    if (held != dense_.end()) dense_.erase(held);
  } else if (held != dense_.end()) {
    held->second.swap(corrected_);
  } else {
    dense_.emplace(std::string(tensor), corrected_);
  }
  return absl::OkStatus();
}

absl::Status ErrorFeedback::EncodeRows(std::string_view table,
                                       const CodecSpec& spec, uint32_t dim,
                                       std::span<const uint64_t> keys,
                                       std::span<const float> rows,
                                       std::string* payload) {
  if (dim == 0 || rows.size() != keys.size() * dim) {
    payload->clear();
    return absl::InvalidArgumentError(absl::StrCat(
        "table '", AbslView(table), "': ", keys.size(), " keys of dim ", dim,
        " need ", keys.size() * dim, " values, got ", rows.size()));
  }
  auto found = tables_.find(table);
  if (found != tables_.end() && !found->second.rows.empty() &&
      found->second.dim != dim) {
    payload->clear();
    return absl::InvalidArgumentError(
        absl::StrCat("table '", AbslView(table), "': rows of dim ", dim,
                     ", but its residuals have dim ", found->second.dim));
  }
  TableResiduals* held = found != tables_.end() ? &found->second : nullptr;

  corrected_.assign(rows.begin(), rows.end());
  if (held != nullptr) {
    for (size_t i = 0; i < keys.size(); ++i) {
      const std::span<const float> residual = held->Residual(keys[i]);
      for (uint32_t c = 0; c < residual.size(); ++c) {
        corrected_[i * dim + c] += residual[c];
      }
    }
  }
  hetps::EncodeRows(spec, dim, keys, corrected_, payload);
  const bool lossless = spec.kind == CodecKind::kNone;
  if (!lossless) {
    if (absl::Status s = hetps::DecodeRows(*payload, dim, keys.size(),
                                           &decoded_keys_, &decoded_);
        !s.ok()) {
      payload->clear();
      return absl::InvalidArgumentError(absl::StrCat(
          "table '", AbslView(table), "' not encodable: ", s.message()));
    }
  }

  if (held == nullptr) {
    held = &tables_.emplace(std::string(table), TableResiduals{}).first->second;
  }
  if (held->dim != dim) {
    // Only reached with no rows held: start the slot layout afresh.
    held->values.clear();
    held->free_slots.clear();
    held->dim = dim;
  }
  ++held->encodes;
  // The residuals of the pushed rows are now inside `corrected_`.
  for (uint64_t key : keys) held->Drop(key);
  while (!held->by_age.empty() &&
         held->encodes - held->rows.at(held->by_age.front()).refreshed >=
             limits_.max_age) {
    held->Drop(held->by_age.front());
  }
  if (lossless || limits_.max_rows_per_table == 0 || limits_.max_age == 0) {
    return absl::OkStatus();
  }
  // The encoder keeps rows in the order given (codec.h), so one pass pairs
  // each pushed row with its decoded row, if it was sent.
  size_t next_decoded = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    const std::span<float> residual(corrected_.data() + i * dim, dim);
    if (next_decoded < decoded_keys_.size() &&
        decoded_keys_[next_decoded] == keys[i]) {
      const float* decoded = decoded_.data() + next_decoded * dim;
      for (uint32_t c = 0; c < dim; ++c) residual[c] -= decoded[c];
      ++next_decoded;
    }
    if (!AllZero(residual)) {
      held->Store(keys[i], residual, limits_.max_rows_per_table);
    }
  }
  return absl::OkStatus();
}

size_t ErrorFeedback::residual_rows(std::string_view table) const {
  auto found = tables_.find(table);
  return found == tables_.end() ? 0 : found->second.rows.size();
}

std::span<const float> ErrorFeedback::dense_residual(
    std::string_view tensor) const {
  auto found = dense_.find(tensor);
  if (found == dense_.end()) return {};
  return found->second;
}

std::span<const float> ErrorFeedback::row_residual(std::string_view table,
                                                   uint64_t key) const {
  auto found = tables_.find(table);
  if (found == tables_.end()) return {};
  return found->second.Residual(key);
}

}  // namespace hetps
