// The pieces the built-in models share (models.h). Compiled with the models
// once per instruction-set level (isa.h).
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "model/models.h"

namespace hetps::model_internal {

std::vector<TableConfig> ModelTableConfigs(
    const TrainConfig& train, const char* model_name, uint64_t row_dim,
    uint64_t dense_size, const InitializerConfig& dense_init) {
  TableConfig emb;
  emb.name = absl::StrCat(model_name, "_emb");
  emb.kind = TableKind::kSparse;
  emb.dim = row_dim;
  emb.optimizer = train.optimizer;
  emb.init = train.init;
  TableConfig dense;
  dense.name = absl::StrCat(model_name, "_dense");
  dense.kind = TableKind::kDense;
  dense.dim = dense_size;
  dense.optimizer = train.dense_optimizer;
  dense.init = dense_init;
  return {std::move(emb), std::move(dense)};
}

void PoolSlots(const Batch& batch, const BatchParams& params, uint64_t row_dim,
               int k, std::span<float> first, float* emb, size_t emb_stride) {
  const size_t n = batch.size();
  const int slots = batch.num_slots;
  const float* rows = params.rows.data();
  for (size_t i = 0; i < n; ++i) {
    float f = 0;
    float* e_row = emb + i * emb_stride;
    for (int s = 0; s < slots; ++s) {
      const size_t at = i * slots + s;
      const uint32_t begin = batch.offsets[at];
      const uint32_t end = batch.offsets[at + 1];
      float* e = e_row + static_cast<size_t>(s) * k;
      std::fill(e, e + k, 0.0f);
      if (begin == end) continue;
      float w_sum = 0;
      for (uint32_t j = begin; j < end; ++j) {
        const float* row = rows + params.row_of_key[j] * row_dim;
        w_sum += row[0];
        for (int d = 0; d < k; ++d) e[d] += row[1 + d];
      }
      const float inv = 1.0f / static_cast<float>(end - begin);
      f += w_sum * inv;
      // The common single-key slot skips the scaling multiply.
      if (end - begin > 1) {
        for (int d = 0; d < k; ++d) e[d] *= inv;
      }
    }
    first[i] = f;
  }
}

void ScatterSlotGrads(const Batch& batch, const BatchParams& params,
                      uint64_t row_dim, int k, std::span<const float> dlogit,
                      const float* demb, size_t demb_stride,
                      std::span<float> row_grads) {
  std::fill(row_grads.begin(), row_grads.end(), 0.0f);
  const size_t n = batch.size();
  const int slots = batch.num_slots;
  for (size_t i = 0; i < n; ++i) {
    const float* de_row = demb + i * demb_stride;
    for (int s = 0; s < slots; ++s) {
      const size_t at = i * slots + s;
      const uint32_t begin = batch.offsets[at];
      const uint32_t end = batch.offsets[at + 1];
      if (begin == end) continue;
      const float inv = 1.0f / static_cast<float>(end - begin);
      const float dw = dlogit[i] * inv;
      const float* de = de_row + static_cast<size_t>(s) * k;
      for (uint32_t j = begin; j < end; ++j) {
        float* grad = row_grads.data() + params.row_of_key[j] * row_dim;
        grad[0] += dw;
        for (int d = 0; d < k; ++d) grad[1 + d] += de[d] * inv;
      }
    }
  }
}

void AddFmInteraction(int num_slots, int k, const float* emb, size_t emb_stride,
                      std::span<float> logit) {
  for (size_t i = 0; i < logit.size(); ++i) {
    const float* e = emb + i * emb_stride;
    float interaction = 0;
    for (int d = 0; d < k; ++d) {
      float sum = 0;
      float sum_sq = 0;
      for (int s = 0; s < num_slots; ++s) {
        const float x = e[static_cast<size_t>(s) * k + d];
        sum += x;
        sum_sq += x * x;
      }
      interaction += sum * sum - sum_sq;
    }
    logit[i] += 0.5f * interaction;
  }
}

void AddFmInteractionGrad(int num_slots, int k, const float* emb,
                          std::span<const float> g, float* demb,
                          size_t stride) {
  for (size_t i = 0; i < g.size(); ++i) {
    const float* e = emb + i * stride;
    float* de = demb + i * stride;
    for (int d = 0; d < k; ++d) {
      float sum = 0;
      for (int s = 0; s < num_slots; ++s) {
        sum += e[static_cast<size_t>(s) * k + d];
      }
      for (int s = 0; s < num_slots; ++s) {
        const size_t at = static_cast<size_t>(s) * k + d;
        de[at] += g[i] * (sum - e[at]);
      }
    }
  }
}

// In an ISA module the scratch is an initial-exec thread_local: loaded
// from memory with dlopen, the module's thread_locals would otherwise be
// dynamic TLS, and LeakSanitizer's walk of dynamic TLS read a bogus range
// for it and crashed at exit (every run under ctest on an AVX-512 VM,
// where both modules load). Initial-exec takes a few bytes of the static
// TLS that glibc keeps spare for dlopen; were none left, the module would
// not load and the models would run below its level, with a warning
// (isa.cc).
#if defined(HETPS_MODEL_ISA_MODULE)
#define HETPS_SCRATCH_TLS __attribute__((tls_model("initial-exec")))
#else
#define HETPS_SCRATCH_TLS
#endif

std::span<float> ThreadScratch(size_t index, size_t size) {
  // Freed only at thread exit; the per-thread high-water mark is a few
  // batches' activations.
  HETPS_SCRATCH_TLS thread_local std::vector<std::vector<float>> buffers;
  if (buffers.size() <= index) buffers.resize(index + 1);
  std::vector<float>& buffer = buffers[index];
  if (buffer.size() < size) buffer.resize(size);
  return {buffer.data(), size};
}

void SigmoidInto(std::span<const float> logit, std::span<float> p) {
  for (size_t i = 0; i < logit.size(); ++i) {
    // exp of a non-positive argument only: never overflows.
    const float z = logit[i];
    if (z >= 0) {
      p[i] = 1.0f / (1.0f + std::exp(-z));
    } else {
      const float e = std::exp(z);
      p[i] = e / (1.0f + e);
    }
  }
}

double LossAndLogitGrad(std::span<const float> labels,
                        std::span<const float> logit, std::span<float> p,
                        std::span<float> g) {
  SigmoidInto(logit, p);
  const size_t n = labels.size();
  if (n == 0) return 0;
  const float inv_n = 1.0f / static_cast<float>(n);
  double loss = 0;
  for (size_t i = 0; i < n; ++i) {
    const double z = logit[i];
    const double y = labels[i];
    // -[y log σ(z) + (1-y) log(1-σ(z))] = softplus(z) - y z, with softplus
    // written so that exp never sees a positive argument.
    loss += std::max(z, 0.0) - y * z + std::log1p(std::exp(-std::abs(z)));
    g[i] = (p[i] - labels[i]) * inv_n;
  }
  return loss;
}

}  // namespace hetps::model_internal
