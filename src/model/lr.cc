// Logistic regression over mean-pooled slots:
//   logit = b + Σ_s mean(w over the keys of slot s).
// Sparse row: [w] (row_dim 1). Dense table: [b] (size 1, zero start).
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/models.h"

namespace hetps::model_internal {
namespace {

class LrModel final : public Model {
 public:
  explicit LrModel(const TrainConfig& train) : train_(train) {}

  const char* name() const override { return "lr"; }
  Isa isa() const override { return kCompiledIsa; }
  uint64_t row_dim() const override { return 1; }
  uint64_t dense_size() const override { return 1; }

  std::vector<TableConfig> Tables() const override {
    // A zero bias is the neutral start; any other would be a guess at the
    // base rate.
    return ModelTableConfigs(train_, name(), row_dim(), dense_size(),
                             {.type = "zero", .scale = 0, .seed = 0});
  }

  void Predict(const Batch& batch, const BatchParams& params,
               std::span<float> p) const override {
    std::vector<float> logit(batch.size());
    Logits(batch, params, logit);
    SigmoidInto(logit, p);
  }

  double Train(const Batch& batch, const BatchParams& params,
               std::span<float> p, std::span<float> row_grads,
               std::span<float> dense_grad) const override {
    std::vector<float> g(batch.size());
    Logits(batch, params, g);
    const double loss = LossAndLogitGrad(batch.labels, g, p, g);
    float bias_grad = 0;
    for (float gi : g) bias_grad += gi;
    dense_grad[0] = bias_grad;
    ScatterSlotGrads(batch, params, row_dim(), /*k=*/0, g, nullptr, 0,
                     row_grads);
    return loss;
  }

 private:
  void Logits(const Batch& batch, const BatchParams& params,
              std::span<float> logit) const {
    PoolSlots(batch, params, row_dim(), /*k=*/0, logit, nullptr, 0);
    const float bias = params.dense[0];
    for (float& z : logit) z += bias;
  }

  const TrainConfig train_;
};

}  // namespace

std::unique_ptr<Model> NewLrModel(const TrainConfig& train) {
  return std::make_unique<LrModel>(train);
}

}  // namespace hetps::model_internal
