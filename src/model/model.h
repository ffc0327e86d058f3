// Model: forward and backward of a CTR model over a Batch, on parameters
// pulled from the servers. Every model keeps its parameters in exactly two
// tables so that a training step is one sparse pull, one dense pull and one
// push:
//   - a sparse table of rows of row_dim() floats per feature key (first-order
//     weight and/or embedding), and
//   - a dense table of dense_size() floats (bias, MLP weights).
//
// Samples are field-aware: the keys of one slot are mean-pooled into one
// slot vector (a multi-valued slot such as genres becomes the average of its
// rows; an empty slot contributes zeros).
//
// Loss is the mean binary cross-entropy over the batch (sigmoid output).
// Gradients are those of that mean, so a server that averages pushes by batch
// size recovers the gradient of the global batch.
//
// The arithmetic runs at the instruction-set level train.isa names (see Isa
// below); "auto" picks the highest this CPU has.
//
// Thread-safe: a Model holds only its shape. fm and deepfm keep their
// activation buffers in per-thread scratch that lives until the thread exits
// (about 10 MB for deepfm 400-400-400 at batch 1024): allocating them per call
// cost more than the matrix products (page faults and memset).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "data/batch.h"
#include "hetps/config.h"

namespace hetps {

// The instruction-set levels the built-in models are compiled for. Each is
// the same source (lr.cc, fm.cc, deepfm.cc, models.cc) compiled with that
// level's flags: sse2, which every x86-64 CPU runs, is linked into every
// binary; avx2 (AVX2 + FMA + BMI1/2 + F16C) and avx512 (that plus AVX-512
// F/BW/CD/DQ/VL) are shared modules embedded in the binary (x86-64 builds)
// and loaded, when first asked for, only on a CPU that has the level. A
// module keeps every symbol to itself, so its Eigen and standard-library
// code never stands in for the baseline's (isa.cc).
enum class Isa { kSse2, kAvx2, kAvx512 };

// "sse2", "avx2", "avx512": the names train.isa takes.
const char* IsaName(Isa isa);

// The levels this process can run, lowest first: kSse2, then each level the
// CPU has and whose module loaded (a module that fails to load is logged
// once with the reason and left out).
std::vector<Isa> AvailableIsas();

// The level `train_isa` (train.isa) selects: the highest available one for
// "auto". INVALID_ARGUMENT for an unknown name; FAILED_PRECONDITION naming
// the available levels for one this CPU (or this build) cannot run.
absl::StatusOr<Isa> SelectIsa(const std::string& train_isa);

// The parameters of one batch, as pulled: `row_of_key[j]` is the row in
// `rows` (row-major, row_dim() floats each) of batch.keys[j].
struct BatchParams {
  std::span<const uint32_t> row_of_key;
  std::span<const float> rows;
  std::span<const float> dense;
};

class Model {
 public:
  // INVALID_ARGUMENT naming the field for a bad shape (unknown
  // train.model, embedding_dim < 1, a hidden width < 1); SelectIsa's errors
  // for train.isa. An empty
  // train.hidden makes deepfm's deep part one linear layer.
  // `num_slots`/`num_dense` come from the data reader.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const TrainConfig& train,
                                                       int num_slots,
                                                       int num_dense);
  virtual ~Model() = default;

  virtual const char* name() const = 0;
  // The level this model's arithmetic runs at.
  virtual Isa isa() const = 0;
  virtual uint64_t row_dim() const = 0;
  virtual uint64_t dense_size() const = 0;
  // Floats of activations (and their gradients) one sample keeps during
  // Train beyond its pooled slots: deepfm's hidden layers.
  virtual uint64_t activation_floats() const { return 0; }

  // The two tables with their configured optimizers and initialisers; table
  // names are the model's (e.g. "deepfm_emb", "deepfm_dense").
  virtual std::vector<TableConfig> Tables() const = 0;

  // Writes the predicted click probability of each sample into `p`
  // (batch.size() floats).
  virtual void Predict(const Batch& batch, const BatchParams& params,
                       std::span<float> p) const = 0;

  // Predicts (into `p`) and computes the gradient of the mean logloss:
  // `row_grads` (same layout as params.rows, zeroed by the callee) and
  // `dense_grad` (dense_size() floats, zeroed by the callee). Returns the
  // summed (not mean) logloss of the batch.
  virtual double Train(const Batch& batch, const BatchParams& params,
                       std::span<float> p, std::span<float> row_grads,
                       std::span<float> dense_grad) const = 0;
};

}  // namespace hetps


