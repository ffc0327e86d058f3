// The parameter tables each built-in model trains. Validation uses this to
// fill JobConfig::tables when the job lists none and to check a listed set
// against what the model needs; the trainer uses it to find its tables by
// name. Adding a model means adding it here (and to the trainer), nowhere else.
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "hetps/config.h"

namespace hetps {

// Logistic regression: one weight per feature id, plus a bias.
inline constexpr char kLrWeightTable[] = "lr_w";  // sparse, dim 1
inline constexpr char kLrBiasTable[] = "lr_b";    // dense, dim 1

// Names of the built-in models, in the order shown in error messages.
std::vector<std::string> ModelNames();

// The tables `train.model` needs, each with `train.optimizer` and `train.init`.
// INVALID_ARGUMENT naming `train.model` when the model is not built in.
absl::StatusOr<std::vector<TableConfig>> ModelTables(const TrainConfig& train);

}  // namespace hetps
