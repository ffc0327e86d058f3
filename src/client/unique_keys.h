// UniqueKeys: a key list reduced to its distinct keys, in first-seen order,
// plus the position of every original key among them. The trainer builds one
// per batch (the rows it pulls and the gradients it pushes are per distinct
// key); PsClient uses it when a caller's keys may repeat.
//
// Not thread-safe; reuse one object to keep its buffers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/container/flat_hash_map.h"

namespace hetps {

class UniqueKeys {
 public:
  void Build(std::span<const uint64_t> keys) {
    keys_.clear();
    position_.resize(keys.size());
    index_.clear();
    index_.reserve(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto [it, inserted] =
          index_.try_emplace(keys[i], static_cast<uint32_t>(keys_.size()));
      if (inserted) keys_.push_back(keys[i]);
      position_[i] = it->second;
    }
  }

  // The distinct keys.
  const std::vector<uint64_t>& keys() const { return keys_; }
  // position()[i]: where the i-th key of the last Build went in keys().
  const std::vector<uint32_t>& position() const { return position_; }

 private:
  std::vector<uint64_t> keys_;
  std::vector<uint32_t> position_;
  absl::flat_hash_map<uint64_t, uint32_t> index_;
};

}  // namespace hetps
