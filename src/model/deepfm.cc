// DeepFM: the field-level FM of fm.cc plus an MLP over the same slot
// vectors and the dense features, sharing one embedding table:
//   logit = b + Σ_s f_s + FM(e_0..e_{S-1}) + MLP(x),
//   x = [e_0, .., e_{S-1}, dense features]   (in = S*k + num_dense floats),
//   MLP: h_0 = x; h_{l+1} = ReLU(h_l W_l + c_l) for each hidden layer;
//        output = h_L w_out (no bias: b already is the output bias).
// With `hidden` empty the MLP is the single linear map x w_out.
//
// Dense table layout (dense_size() floats), with widths = {in, hidden..., 1}
// and L = hidden.size():
//   [0]                 b
//   for l = 0 .. L-1:   W_l  widths[l] × widths[l+1], row-major
//                             (W_l[r][c] at offset + r * widths[l+1] + c)
//                       c_l  widths[l+1]
//   then                w_out  widths[L] (= W_L, a widths[L] × 1 matrix)
//
// The batch is computed as matrix products over (batch × features) row-major
// matrices; the weights are Eigen::Map views on the pulled dense span and the
// gradients are written straight into dense_grad through the same maps, so
// nothing is copied per batch besides the activations, which live in
// per-thread scratch reused from batch to batch (see ThreadScratch).
#include <Eigen/Dense>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "model/model.h"
#include "model/models.h"

namespace hetps::model_internal {
namespace {

using RowMatrix =
    Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using ConstMatrixMap = Eigen::Map<const RowMatrix>;
using MatrixMap = Eigen::Map<RowMatrix>;
using ConstVectorMap = Eigen::Map<const Eigen::VectorXf>;
using VectorMap = Eigen::Map<Eigen::VectorXf>;
using ConstRowVectorMap = Eigen::Map<const Eigen::RowVectorXf>;
using RowVectorMap = Eigen::Map<Eigen::RowVectorXf>;

class DeepFmModel final : public Model {
 public:
  DeepFmModel(const TrainConfig& train, int num_slots, int num_dense)
      : train_(train),
        num_slots_(num_slots),
        num_dense_(num_dense),
        k_(train.embedding_dim),
        in_(static_cast<Eigen::Index>(num_slots) * k_ + num_dense) {
    widths_.push_back(in_);
    for (int width : train.hidden) widths_.push_back(width);
    widths_.push_back(1);
    size_t offset = 1;  // [0] is b
    const size_t layers = train.hidden.size() + 1;
    for (size_t l = 0; l < layers; ++l) {
      weight_offset_.push_back(offset);
      offset += static_cast<size_t>(widths_[l]) * widths_[l + 1];
      bias_offset_.push_back(offset);
      if (l + 1 < layers) offset += widths_[l + 1];
    }
    dense_size_ = offset;
    max_width_ = *std::max_element(widths_.begin(), widths_.end());
  }

  const char* name() const override { return "deepfm"; }
  Isa isa() const override { return kCompiledIsa; }
  uint64_t row_dim() const override { return 1 + static_cast<uint64_t>(k_); }
  uint64_t dense_size() const override { return dense_size_; }
  uint64_t activation_floats() const override {
    // Each hidden layer's activations and their gradients.
    uint64_t hidden = 0;
    for (size_t l = 1; l + 1 < widths_.size(); ++l) hidden += widths_[l];
    return 2 * hidden;
  }

  std::vector<TableConfig> Tables() const override {
    // One scale has to serve the whole table (InitialValue draws every
    // element alike), so use He-uniform, sqrt(6 / fan_in), for the widest
    // fan_in: ReLU layers of that width keep their activation variance and
    // narrower ones start smaller, never exploding. Biases and b share the
    // (small) draw, which is harmless. Sparse rows use their own seed
    // stream: xor-ing keeps dense element i apart from sparse key i.
    Eigen::Index max_fan_in = 1;
    for (size_t l = 0; l + 1 < widths_.size(); ++l) {
      max_fan_in = std::max(max_fan_in, widths_[l]);
    }
    const InitializerConfig dense_init = {
        .type = "uniform",
        .scale = static_cast<float>(std::sqrt(6.0 / max_fan_in)),
        .seed = train_.init.seed ^ 0x9e3779b97f4a7c15ull};
    return ModelTableConfigs(train_, name(), row_dim(), dense_size(),
                             dense_init);
  }

  void Predict(const Batch& batch, const BatchParams& params,
               std::span<float> p) const override {
    std::vector<float> logit(batch.size());
    Forward(batch, params, logit);
    SigmoidInto(logit, p);
  }

  double Train(const Batch& batch, const BatchParams& params,
               std::span<float> p, std::span<float> row_grads,
               std::span<float> dense_grad) const override {
    const Eigen::Index n = static_cast<Eigen::Index>(batch.size());
    const size_t hidden = hidden_layers();
    std::vector<float> g(batch.size());
    Forward(batch, params, g);
    const double loss = LossAndLogitGrad(batch.labels, g, p, g);

    std::fill(dense_grad.begin(), dense_grad.end(), 0.0f);
    const ConstVectorMap gv(g.data(), n);
    dense_grad[0] = gv.sum();
    // Output layer: logit += h_L w_out.
    VectorMap(dense_grad.data() + weight_offset_[hidden], widths_[hidden])
        .noalias() = Activation(n, hidden).transpose() * gv;
    // d loss / d h_l ping-pongs between two buffers of the widest layer.
    float* dh_data = ThreadScratch(hidden + 1, n * max_width_).data();
    float* below_data = ThreadScratch(hidden + 2, n * max_width_).data();
    MatrixMap(dh_data, n, widths_[hidden]).noalias() =
        gv * OutputWeights(params.dense).transpose();
    // Hidden layers, last to first; dh enters as d loss / d h_{l+1} and
    // leaves as d loss / d h_l, so after the loop it is d loss / d x.
    for (size_t l = hidden; l-- > 0;) {
      MatrixMap dh(dh_data, n, widths_[l + 1]);
      const MatrixMap out = Activation(n, l + 1);
      // ReLU: h_{l+1} > 0 exactly where its pre-activation was.
      dh.array() *= (out.array() > 0.0f).cast<float>();
      MatrixMap(dense_grad.data() + weight_offset_[l], widths_[l],
                widths_[l + 1])
          .noalias() = Activation(n, l).transpose() * dh;
      RowVectorMap(dense_grad.data() + bias_offset_[l], widths_[l + 1])
          .noalias() = dh.colwise().sum();
      MatrixMap(below_data, n, widths_[l]).noalias() =
          dh * Weights(params.dense, l).transpose();
      std::swap(dh_data, below_data);
    }
    // The slot-vector part of d loss / d x also gets the FM term's gradient,
    // then both flow back into the rows with the first-order gradient.
    const float* x = Activation(n, 0).data();
    AddFmInteractionGrad(num_slots_, k_, x, g, dh_data, in_);
    ScatterSlotGrads(batch, params, row_dim(), k_, g, dh_data, in_, row_grads);
    return loss;
  }

 private:
  size_t hidden_layers() const { return widths_.size() - 2; }

  ConstMatrixMap Weights(std::span<const float> dense, size_t l) const {
    return ConstMatrixMap(dense.data() + weight_offset_[l], widths_[l],
                          widths_[l + 1]);
  }
  ConstRowVectorMap Bias(std::span<const float> dense, size_t l) const {
    return ConstRowVectorMap(dense.data() + bias_offset_[l], widths_[l + 1]);
  }
  ConstVectorMap OutputWeights(std::span<const float> dense) const {
    const size_t l = hidden_layers();
    return ConstVectorMap(dense.data() + weight_offset_[l], widths_[l]);
  }
  // h_l of the last Forward on this thread (h_0 = x), n × widths_[l]. The
  // ThreadScratch indices are 0 .. L for h_0 .. h_L, then L + 1 and L + 2
  // for the backward pass's two gradient buffers.
  MatrixMap Activation(Eigen::Index n, size_t l) const {
    return MatrixMap(ThreadScratch(l, n * widths_[l]).data(), n, widths_[l]);
  }

  // Writes each sample's logit and leaves the activations h_0 .. h_L, which
  // the backward pass needs, in this thread's scratch (see Activation).
  void Forward(const Batch& batch, const BatchParams& params,
               std::span<float> logit) const {
    const Eigen::Index n = static_cast<Eigen::Index>(batch.size());
    const size_t hidden = hidden_layers();
    MatrixMap x = Activation(n, 0);
    // Slot vectors go straight into x; the first-order sums into logit.
    PoolSlots(batch, params, row_dim(), k_, logit, x.data(), in_);
    if (num_dense_ > 0) {
      const Eigen::Index emb_width = in_ - num_dense_;
      for (Eigen::Index i = 0; i < n; ++i) {
        std::memcpy(x.data() + i * in_ + emb_width,
                    batch.dense.data() + i * num_dense_,
                    sizeof(float) * num_dense_);
      }
    }
    for (size_t l = 0; l < hidden; ++l) {
      MatrixMap out = Activation(n, l + 1);
      out.noalias() = Activation(n, l) * Weights(params.dense, l);
      out = (out.rowwise() + Bias(params.dense, l)).cwiseMax(0.0f);
    }
    VectorMap z(logit.data(), n);
    z.noalias() += Activation(n, hidden) * OutputWeights(params.dense);
    z.array() += params.dense[0];
    AddFmInteraction(num_slots_, k_, x.data(), in_, logit);
  }

  const TrainConfig train_;
  const int num_slots_;
  const int num_dense_;
  const int k_;
  const Eigen::Index in_;              // MLP input width, S*k + num_dense
  std::vector<Eigen::Index> widths_;   // {in, hidden..., 1}
  std::vector<size_t> weight_offset_;  // per layer, incl. the output layer
  std::vector<size_t> bias_offset_;    // per hidden layer (output: unused)
  size_t dense_size_ = 0;
  Eigen::Index max_width_ = 1;
};

}  // namespace

std::unique_ptr<Model> NewDeepFmModel(const TrainConfig& train, int num_slots,
                                      int num_dense) {
  return std::make_unique<DeepFmModel>(train, num_slots, num_dense);
}

}  // namespace hetps::model_internal
