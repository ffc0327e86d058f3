#include "table/dense_table.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
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
  absl::MutexLock lock(&mu_);
  std::copy_n(weights_.begin(), std::min<uint64_t>(length_, out.size()),
              out.begin());
}

void DenseTable::PullAhead(std::span<const float> ahead, float step_scale,
                           std::span<float> out) const {
  std::vector<float> state;
  uint64_t updates = 0;
  {
    absl::MutexLock lock(&mu_);
    std::copy_n(weights_.begin(), std::min<uint64_t>(length_, out.size()),
                out.begin());
    state = state_;
    updates = updates_;
  }
  // The copy steps outside the lock: the slice itself is not touched.
  optimizer_->Update(out.data(), state.data(), ahead.data(), length_, updates,
                     step_scale);
}

void DenseTable::Push(std::span<const float> grad, float step_scale) {
  absl::MutexLock lock(&mu_);
  optimizer_->Update(weights_.data(), state_.data(), grad.data(), length_,
                     updates_, step_scale);
  ++updates_;
}

uint64_t DenseTable::update_count() const {
  absl::MutexLock lock(&mu_);
  return updates_;
}

DenseTable::Snapshot DenseTable::Save() const {
  absl::MutexLock lock(&mu_);
  return {.weights = weights_, .state = state_, .updates = updates_};
}

absl::Status DenseTable::Restore(Snapshot snapshot) {
  absl::MutexLock lock(&mu_);
  if (snapshot.weights.size() != weights_.size() ||
      snapshot.state.size() != state_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("dense table ", config_.name, ": saved slice has ",
                     snapshot.weights.size(), " weights and ",
                     snapshot.state.size(), " state floats, this server holds ",
                     weights_.size(), " and ", state_.size()));
  }
  weights_ = std::move(snapshot.weights);
  state_ = std::move(snapshot.state);
  updates_ = snapshot.updates;
  return absl::OkStatus();
}

}  // namespace hetps
