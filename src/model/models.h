// The built-in models behind Model::Create, and the pieces they share.
// Private to src/model/: callers use model/model.h.
//
// Every built-in model is field-aware in the same way: a sparse row is
// [w, v_0 .. v_{k-1}] (k = 0 for lr), each slot is mean-pooled into a
// first-order term f_s and (k > 0) a slot vector e_s, and the logit adds the
// dense-table bias b. The helpers below do the pooling, its backward pass,
// the field-level FM interaction and the stable loss once, so the three
// models differ only in what they add on top.
//
// Preconditions shared by every helper (the caller, Model::Train/Predict,
// documents them to its own callers): batch.num_slots equals the model's
// num_slots, batch.dense holds size() * num_dense floats, params.row_of_key
// has batch.keys.size() entries that index rows of params.rows, and the
// output spans have the sizes stated. Nothing is checked at run time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "data/batch.h"
#include "hetps/config.h"
#include "model/model.h"

// The level this copy of the models is compiled for: the build defines
// HETPS_MODEL_ISA for each ISA module (kAvx2, kAvx512); the baseline linked
// into every binary is kSse2.
#ifndef HETPS_MODEL_ISA
#define HETPS_MODEL_ISA kSse2
#endif

namespace hetps::model_internal {

inline constexpr Isa kCompiledIsa = Isa::HETPS_MODEL_ISA;

// Factories; the arguments were validated by Model::Create.
std::unique_ptr<Model> NewLrModel(const TrainConfig& train);
std::unique_ptr<Model> NewFmModel(const TrainConfig& train, int num_slots);
std::unique_ptr<Model> NewDeepFmModel(const TrainConfig& train, int num_slots,
                                      int num_dense);

// The factories of one compiled copy of the models, as Model::Create finds
// them: the baseline's directly, an ISA module's through its one exported
// symbol, kModuleEntry (isa.cc).
struct ModelFactories {
  Isa isa;
  std::unique_ptr<Model> (*lr)(const TrainConfig& train);
  std::unique_ptr<Model> (*fm)(const TrainConfig& train, int num_slots);
  std::unique_ptr<Model> (*deepfm)(const TrainConfig& train, int num_slots,
                                   int num_dense);
};
inline constexpr ModelFactories kCompiledModels = {
    kCompiledIsa, NewLrModel, NewFmModel, NewDeepFmModel};
// The factories of `isa`, which SelectIsa returned (the baseline's for a
// level that is not available).
const ModelFactories& FactoriesFor(Isa isa);
// The name of an ISA module's entry point: extern "C", no arguments,
// returns a const ModelFactories* (isa_module.cc).
inline constexpr char kModuleEntry[] = "hetps_model_factories";

// The two TableConfigs every model exposes: "<model>_emb" (sparse, row_dim
// floats per key, train.optimizer / train.init) and "<model>_dense" (dense,
// dense_size floats, train.dense_optimizer / `dense_init`).
std::vector<TableConfig> ModelTableConfigs(const TrainConfig& train,
                                           const char* model_name,
                                           uint64_t row_dim,
                                           uint64_t dense_size,
                                           const InitializerConfig& dense_init);

// Mean-pools every slot of every sample. `first[i]` receives the sum over
// slots of the mean first-order weight (column 0 of the rows), i.e. the lr
// part of sample i's logit without the bias. When k > 0, the slot vector of
// sample i, slot s (the mean of columns 1..k) is written to
// emb[i * emb_stride + s * k + d]; emb_stride >= num_slots * k lets the
// caller leave room after the slot vectors (deepfm puts its dense features
// there). An empty slot contributes 0 to `first` and a zero vector.
// `first` has batch.size() entries.
void PoolSlots(const Batch& batch, const BatchParams& params, uint64_t row_dim,
               int k, std::span<float> first, float* emb, size_t emb_stride);

// The backward pass of PoolSlots: zeroes `row_grads` (params.rows' layout),
// then for every key occurrence j of sample i, slot s with n keys adds
// dlogit[i] / n to column 0 of its row and demb[i * demb_stride + s * k + d]
// / n to column 1 + d. Occurrences that share a row accumulate.
void ScatterSlotGrads(const Batch& batch, const BatchParams& params,
                      uint64_t row_dim, int k, std::span<const float> dlogit,
                      const float* demb, size_t demb_stride,
                      std::span<float> row_grads);

// Adds the field-level FM interaction ½ Σ_d ((Σ_s e_sd)² − Σ_s e_sd²) of
// each sample's slot vectors (layout as in PoolSlots) to logit[i].
void AddFmInteraction(int num_slots, int k, const float* emb, size_t emb_stride,
                      std::span<float> logit);

// The backward pass of AddFmInteraction: adds g[i] * (Σ_s' e_s'd − e_sd) to
// demb[i * stride + s * k + d] (emb and demb share `stride`).
void AddFmInteractionGrad(int num_slots, int k, const float* emb,
                          std::span<const float> g, float* demb, size_t stride);

// `size` floats of scratch owned by the calling thread and kept between
// calls, so that a steady stream of batches allocates nothing: a fresh
// multi-megabyte buffer is freshly mmap'd memory, and faulting its pages in
// costs more than the MLP's GEMMs at batch 1024. Each `index` names one
// buffer, which keeps its contents from request to request; a request larger
// than any earlier one for that index may move it (earlier spans for that
// index dangle). A new buffer's contents are unspecified: write before
// reading. The memory is freed at thread exit.
std::span<float> ThreadScratch(size_t index, size_t size);

// Writes sigmoid(logit[i]) to p[i] (overflow-free for any logit).
void SigmoidInto(std::span<const float> logit, std::span<float> p);

// Turns per-sample logits into probabilities `p`, the gradient of the MEAN
// logloss w.r.t. each logit (`g`, may alias `logit`), and returns the SUMMED
// logloss, computed from the logit in the softplus form so that confident
// mistakes cost their true (large) loss instead of log(0).
double LossAndLogitGrad(std::span<const float> labels,
                        std::span<const float> logit, std::span<float> p,
                        std::span<float> g);

}  // namespace hetps::model_internal
