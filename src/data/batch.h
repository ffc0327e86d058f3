// Batch: a set of samples in the layout every model reads.
//
// Each sample has `num_slots` sparse slots (feature fields); a slot holds
// zero or more feature keys (FeatureKey(slot, value)): one for a plain
// categorical field, several for a multi-valued one (movie genres), none
// when the value is missing. Keys are stored CSR-style. A sample may also
// carry `num_dense` real-valued features (already normalised by the reader).
#pragma once

#include <cstdint>
#include <cstddef>
#include <span>
#include <vector>

namespace hetps {

struct Batch {
  int num_slots = 0;
  int num_dense = 0;
  std::vector<float> labels;  // one per sample, 0 or 1
  std::vector<float> dense;   // size() * num_dense
  // Keys of sample i, slot s: keys[offsets[i * num_slots + s] ..
  // offsets[i * num_slots + s + 1]). offsets has size() * num_slots + 1
  // entries and starts with 0.
  std::vector<uint32_t> offsets = {0};
  std::vector<uint64_t> keys;

  size_t size() const { return labels.size(); }

  void Clear() {
    labels.clear();
    dense.clear();
    offsets.assign(1, 0);
    keys.clear();
  }

  std::span<const uint64_t> SlotKeys(size_t sample, int slot) const {
    const size_t at = sample * num_slots + slot;
    return {keys.data() + offsets[at], keys.data() + offsets[at + 1]};
  }

  // Appends one sample; call AddKey for each key of slot 0, then EndSlot(),
  // and so on for every slot, then AddDense num_dense times.
  void BeginSample(float label) { labels.push_back(label); }
  void AddKey(uint64_t key) { keys.push_back(key); }
  void EndSlot() { offsets.push_back(static_cast<uint32_t>(keys.size())); }
  void AddDense(float value) { dense.push_back(value); }

  // Appends a copy of sample `i` of `from` (same num_slots and num_dense).
  void AppendSample(const Batch& from, size_t i) {
    labels.push_back(from.labels[i]);
    dense.insert(dense.end(), from.dense.begin() + i * num_dense,
                 from.dense.begin() + (i + 1) * num_dense);
    const size_t first = i * num_slots;
    const uint32_t base = from.offsets[first];
    const uint32_t shift = static_cast<uint32_t>(keys.size()) - base;
    keys.insert(keys.end(), from.keys.begin() + base,
                from.keys.begin() + from.offsets[first + num_slots]);
    for (int s = 1; s <= num_slots; ++s) {
      offsets.push_back(from.offsets[first + s] + shift);
    }
  }
};

}  // namespace hetps
