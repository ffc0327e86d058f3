// The known gradients the cluster tests push: small dyadic numbers, so every
// sum the servers form is exact in float whatever the arrival order, and the
// tests can demand bit-exact final values.
#pragma once

#include <cstdint>
#include <vector>

namespace hetps::pattern {

inline constexpr const char* kSparse = "emb";
inline constexpr const char* kDense = "dense";
inline constexpr uint64_t kDim = 4;
inline constexpr uint64_t kDenseSize = 10;
inline constexpr float kLearningRate = 0.5f;  // sgd, zero init

// Batch sizes 1, 1, 2: a round's total is 4, so merged = Σ b·g / 4 is exact.
inline uint32_t BatchOf(uint32_t worker) { return worker == 2 ? 2 : 1; }

struct Step {
  std::vector<uint64_t> keys;        // shared keys 0..39 + 8 of the worker's own
  std::vector<float> sparse_grads;   // keys.size() * kDim
  std::vector<float> dense_grads;    // kDenseSize
};

inline float GradOf(uint32_t worker, int round, uint64_t key, uint64_t col) {
  return static_cast<float>((worker + 1) * (round % 3 + 1) * (key % 5 + 1) *
                            (col + 1)) / 64.0f;
}

inline Step StepOf(uint32_t worker, int round) {
  Step step;
  for (uint64_t k = 0; k < 40; ++k) step.keys.push_back(k);
  for (uint64_t k = 0; k < 8; ++k) step.keys.push_back(1000 + worker * 100 + k);
  // A duplicate of key 3: the client must merge it into one row.
  step.keys.push_back(3);
  for (uint64_t key : step.keys) {
    for (uint64_t c = 0; c < kDim; ++c) {
      step.sparse_grads.push_back(GradOf(worker, round, key, c));
    }
  }
  for (uint64_t i = 0; i < kDenseSize; ++i) {
    step.dense_grads.push_back(GradOf(worker, round, i, 0));
  }
  return step;
}

}  // namespace hetps::pattern
