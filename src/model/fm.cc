// Field-level factorization machine:
//   logit = b + Σ_s f_s + ½ Σ_d ((Σ_s e_sd)² − Σ_s e_sd²)
// where f_s / e_s are the means of w / v over the keys of slot s, so the
// interactions are between slots (fields), not between individual keys.
// Sparse row: [w, v_0 .. v_{k-1}] (row_dim 1 + k). Dense table: [b] (size 1,
// zero start).
#include <algorithm>
#include <memory>
#include <span>
#include <vector>

#include "model/model.h"
#include "model/models.h"

namespace hetps::model_internal {
namespace {

class FmModel final : public Model {
 public:
  FmModel(const TrainConfig& train, int num_slots)
      : train_(train), num_slots_(num_slots), k_(train.embedding_dim) {}

  const char* name() const override { return "fm"; }
  Isa isa() const override { return kCompiledIsa; }
  uint64_t row_dim() const override { return 1 + static_cast<uint64_t>(k_); }
  uint64_t dense_size() const override { return 1; }

  std::vector<TableConfig> Tables() const override {
    return ModelTableConfigs(train_, name(), row_dim(), dense_size(),
                             {.type = "zero", .scale = 0, .seed = 0});
  }

  void Predict(const Batch& batch, const BatchParams& params,
               std::span<float> p) const override {
    std::vector<float> logit(batch.size());
    const std::span<float> emb = ThreadScratch(0, batch.size() * stride());
    Logits(batch, params, logit, emb);
    SigmoidInto(logit, p);
  }

  double Train(const Batch& batch, const BatchParams& params,
               std::span<float> p, std::span<float> row_grads,
               std::span<float> dense_grad) const override {
    const size_t n = batch.size();
    std::vector<float> g(n);
    const std::span<float> emb = ThreadScratch(0, n * stride());
    Logits(batch, params, g, emb);
    const double loss = LossAndLogitGrad(batch.labels, g, p, g);
    float bias_grad = 0;
    for (float gi : g) bias_grad += gi;
    dense_grad[0] = bias_grad;
    const std::span<float> demb = ThreadScratch(1, n * stride());
    std::fill(demb.begin(), demb.end(), 0.0f);
    AddFmInteractionGrad(num_slots_, k_, emb.data(), g, demb.data(), stride());
    ScatterSlotGrads(batch, params, row_dim(), k_, g, demb.data(), stride(),
                     row_grads);
    return loss;
  }

 private:
  size_t stride() const { return static_cast<size_t>(num_slots_) * k_; }

  // Fills `logit` and the pooled slot vectors `emb` (size() × stride()).
  void Logits(const Batch& batch, const BatchParams& params,
              std::span<float> logit, std::span<float> emb) const {
    PoolSlots(batch, params, row_dim(), k_, logit, emb.data(), stride());
    const float bias = params.dense[0];
    for (float& z : logit) z += bias;
    AddFmInteraction(num_slots_, k_, emb.data(), stride(), logit);
  }

  const TrainConfig train_;
  const int num_slots_;
  const int k_;
};

}  // namespace

std::unique_ptr<Model> NewFmModel(const TrainConfig& train, int num_slots) {
  return std::make_unique<FmModel>(train, num_slots);
}

}  // namespace hetps::model_internal
