#include "table/dense_table.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <utility>

#include "table/initializer.h"

namespace hetps {

DenseTable::DenseTable(const TableConfig& config, uint64_t offset,
                       uint64_t length, std::unique_ptr<Optimizer> optimizer)
    : config_(config),
      offset_(offset),
      length_(length),
      optimizer_(std::move(optimizer)),
      weights_(length),
      state_(optimizer_->StateWidth(length)) {
  // Keyed by the global index, so however the array is split across servers
  // every element starts at the same value.
  for (uint64_t i = 0; i < length_; ++i) {
    weights_[i] = InitialValue(config_.init, offset_ + i, 0);
  }
  optimizer_->InitState(weights_.data(), state_.data(), length_);
}

void DenseTable::Pull(std::span<float> out) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::copy_n(weights_.begin(), std::min<uint64_t>(length_, out.size()),
              out.begin());
}

void DenseTable::Push(std::span<const float> grad) {
  std::lock_guard<std::mutex> lock(mu_);
  optimizer_->Update(weights_.data(), state_.data(), grad.data(), length_,
                     updates_);
  ++updates_;
}

uint64_t DenseTable::update_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return updates_;
}

}  // namespace hetps
