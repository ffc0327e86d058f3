// Per-row update rules applied by the servers: sgd, adagrad, adam, ftrl.
//
// An Optimizer is stateless itself and thread-compatible: the state lives in
// the tables, next to each row (`StateWidth(dim)` floats per row), so many
// threads may call Update on different rows at once.
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "hetps/config.h"

namespace hetps {

class Optimizer {
 public:
  // INVALID_ARGUMENT names the field when `config` is unusable (unknown
  // type, non-positive learning rate, betas outside [0, 1), ...).
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(
      const OptimizerConfig& config);

  virtual ~Optimizer() = default;

  virtual const char* name() const = 0;

  // Floats of optimizer state each row of width `dim` carries.
  virtual uint64_t StateWidth(uint64_t dim) const = 0;

  // Sets the state of a new row whose weights are already initialised.
  virtual void InitState(const float* weights, float* state,
                         uint64_t dim) const = 0;

  // One update of `dim` weights with gradient `grad`. `step` is the number of
  // updates this row received before this one (adam's bias correction).
  //
  // `step_scale` (in (0, 1]) is the share of a full step this gradient
  // takes: the aggregator's staleness weight. It scales the gradient where
  // it moves the weights (sgd's and adagrad's step, adam's first moment,
  // ftrl's z) and nowhere else: accumulators of g² (adagrad, adam's second
  // moment, ftrl's n) see the gradient as sent. Scaling the gradient itself
  // would not do: adagrad and adam divide it by its own running magnitude,
  // so a uniformly weighted-down gradient would move the weights as far as
  // an unweighted one. 1 is the plain rule.
  virtual void Update(float* weights, float* state, const float* grad,
                      uint64_t dim, uint64_t step, float step_scale) const = 0;
};

}  // namespace hetps
