#include "model/model.h"

#include <memory>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/models.h"

namespace hetps {

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const TrainConfig& train,
                                                     int num_slots,
                                                     int num_dense) {
  if (num_slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "num_slots: the data must have at least one slot, got ", num_slots));
  }
  if (num_dense < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_dense: must be >= 0, got ", num_dense));
  }
  const bool factorized = train.model == "fm" || train.model == "deepfm";
  if (train.model != "lr" && !factorized) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.model: no built-in model '", train.model,
                     "' (built in: lr, fm, deepfm)"));
  }
  if (factorized && train.embedding_dim < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("train.embedding_dim: must be >= 1 for ", train.model,
                     ", got ", train.embedding_dim));
  }
  const absl::StatusOr<Isa> isa = SelectIsa(train.isa);
  if (!isa.ok()) return isa.status();
  const model_internal::ModelFactories& factories =
      model_internal::FactoriesFor(*isa);
  if (train.model == "lr") return factories.lr(train);
  if (train.model == "fm") return factories.fm(train, num_slots);
  // deepfm. An empty `hidden` is allowed on purpose: the deep part is then a
  // single linear layer over the slot vectors and dense features, which is
  // still a useful model (FM plus a linear term on the dense features).
  for (size_t i = 0; i < train.hidden.size(); ++i) {
    if (train.hidden[i] < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.hidden[", i, "]: layer width must be >= 1, got ",
                       train.hidden[i]));
    }
  }
  return factories.deepfm(train, num_slots, num_dense);
}

}  // namespace hetps
