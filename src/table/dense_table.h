// DenseTable: this server's contiguous slice [offset, offset + length) of a
// dense parameter array (MLP weights, biases), with optimizer state.
//
// Thread-safety: all methods may be called concurrently; one mutex guards the
// slice (dense slices are small next to sparse tables).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "hetps/config.h"
#include "table/optimizer.h"

namespace hetps {

class DenseTable {
 public:
  // Initial values come from InitialValue(config.init, offset + i, 0).
  DenseTable(const TableConfig& config, uint64_t offset, uint64_t length,
             std::unique_ptr<Optimizer> optimizer);

  const TableConfig& config() const { return config_; }
  uint64_t offset() const { return offset_; }
  uint64_t length() const { return length_; }

  // Copies the slice into `out` (length() floats).
  void Pull(std::span<float> out) const;
  // As Pull, the slice as one optimizer step with gradient `ahead`
  // (length() floats) and `step_scale` would leave it; the table does not
  // change.
  void PullAhead(std::span<const float> ahead, float step_scale,
                 std::span<float> out) const;

  // One optimizer step with `grad` (length() floats, finite);
  // `step_scale`: Optimizer::Update.
  void Push(std::span<const float> grad, float step_scale = 1.0f);

  uint64_t update_count() const;

  // The slice with its optimizer state: what a checkpoint saves and
  // restores.
  struct Snapshot {
    std::vector<float> weights;  // length() floats
    std::vector<float> state;    // the optimizer's state of the slice
    uint64_t updates = 0;
  };
  Snapshot Save() const;
  // INVALID_ARGUMENT (table unchanged) when the sizes do not match this
  // slice.
  absl::Status Restore(Snapshot snapshot);

 private:
  const TableConfig config_;
  const uint64_t offset_;
  const uint64_t length_;
  const std::unique_ptr<Optimizer> optimizer_;
  // state_ holds optimizer_->StateWidth(length_) floats: the slice is updated
  // as one row of width length_.

  mutable absl::Mutex mu_;
  std::vector<float> weights_ ABSL_GUARDED_BY(mu_);
  std::vector<float> state_ ABSL_GUARDED_BY(mu_);
  uint64_t updates_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace hetps
