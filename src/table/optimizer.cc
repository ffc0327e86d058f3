#include "table/optimizer.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>

#if defined(__SSE__)
#include <immintrin.h>
#endif

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace hetps {
namespace {

// All rules work in float, element by element, in the order the formulas are
// written, so tests can reproduce them by hand to ~1e-6.
//
// The element loops run four lanes at a time through a GCC/Clang vector
// type: -O2 does not auto-vectorise loops of unknown length, and a scalar
// sqrt must keep errno semantics, which rules out vectorising it anyway.
// Lanes and the scalar tail apply the same operations in the same order, so
// every element gets bit-for-bit the same result on either path.
typedef float Float4 __attribute__((vector_size(16)));

template <typename T>
T Load(const float* p) {
  T v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

template <typename T>
void Store(float* p, T v) {
  std::memcpy(p, &v, sizeof(v));
}

template <typename T>
T Splat(float x) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    return T{x, x, x, x};
  }
}

float Sqrt(float x) { return std::sqrt(x); }

Float4 Sqrt(Float4 x) {
#if defined(__SSE__)
  return _mm_sqrt_ps(x);
#else
  return Float4{std::sqrt(x[0]), std::sqrt(x[1]), std::sqrt(x[2]),
                std::sqrt(x[3])};
#endif
}

// Calls step(T{}, i) with T = Float4 for elements [i, i + 4), then with
// T = float for the remaining elements one by one.
template <typename Step>
void Elementwise(uint64_t dim, Step step) {
  uint64_t i = 0;
  for (; i + 4 <= dim; i += 4) step(Float4{}, i);
  for (; i < dim; ++i) step(float{}, i);
}

// w -= lr * s * g (s: step_scale). No state.
class Sgd final : public Optimizer {
 public:
  explicit Sgd(const OptimizerConfig& c) : lr_(c.learning_rate) {}

  const char* name() const override { return "sgd"; }
  uint64_t StateWidth(uint64_t) const override { return 0; }
  void InitState(const float*, float*, uint64_t) const override {}

  void Update(float* w, float*, const float* g, uint64_t dim, uint64_t,
              float step_scale) const override {
    const float lr = lr_ * step_scale;
    Elementwise(dim, [&](auto lanes, uint64_t i) {
      using T = decltype(lanes);
      Store(w + i, Load<T>(w + i) - Splat<T>(lr) * Load<T>(g + i));
    });
  }

 private:
  const float lr_;
};

// a += g²; w -= lr * s * g / (sqrt(a) + epsilon). State: a[dim], starting at
// initial_accumulator.
class Adagrad final : public Optimizer {
 public:
  explicit Adagrad(const OptimizerConfig& c)
      : lr_(c.learning_rate), eps_(c.epsilon), a0_(c.initial_accumulator) {}

  const char* name() const override { return "adagrad"; }
  uint64_t StateWidth(uint64_t dim) const override { return dim; }
  void InitState(const float*, float* state, uint64_t dim) const override {
    for (uint64_t i = 0; i < dim; ++i) state[i] = a0_;
  }

  void Update(float* w, float* a, const float* g, uint64_t dim, uint64_t,
              float step_scale) const override {
    const float lr = lr_ * step_scale;
    Elementwise(dim, [&](auto lanes, uint64_t i) {
      using T = decltype(lanes);
      const T gi = Load<T>(g + i);
      const T ai = Load<T>(a + i) + gi * gi;
      Store(a + i, ai);
      Store(w + i,
            Load<T>(w + i) - Splat<T>(lr) * gi / (Sqrt(ai) + Splat<T>(eps_)));
    });
  }

 private:
  const float lr_;
  const float eps_;
  const float a0_;
};

// Adam with bias correction; t = step + 1. State: [m[dim], v[dim]], zeros.
// m = b1 m + (1 - b1) s g; v = b2 v + (1 - b2) g²; w -= lr m^ / (sqrt(v^) +
// eps).
class Adam final : public Optimizer {
 public:
  explicit Adam(const OptimizerConfig& c)
      : lr_(c.learning_rate), b1_(c.beta1), b2_(c.beta2), eps_(c.epsilon) {}

  const char* name() const override { return "adam"; }
  uint64_t StateWidth(uint64_t dim) const override { return 2 * dim; }
  void InitState(const float*, float* state, uint64_t dim) const override {
    for (uint64_t i = 0; i < 2 * dim; ++i) state[i] = 0.0f;
  }

  void Update(float* w, float* state, const float* g, uint64_t dim,
              uint64_t step, float step_scale) const override {
    float* m = state;
    float* v = state + dim;
    // The powers are taken once per row, in double so that large step counts
    // do not lose the correction to repeated float rounding.
    const double t = static_cast<double>(step) + 1.0;
    const float c1 = static_cast<float>(1.0 - std::pow(double{b1_}, t));
    const float c2 = static_cast<float>(1.0 - std::pow(double{b2_}, t));
    const float m_share = (1.0f - b1_) * step_scale;
    Elementwise(dim, [&](auto lanes, uint64_t i) {
      using T = decltype(lanes);
      const T gi = Load<T>(g + i);
      const T mi = Splat<T>(b1_) * Load<T>(m + i) + Splat<T>(m_share) * gi;
      const T vi =
          Splat<T>(b2_) * Load<T>(v + i) + Splat<T>(1.0f - b2_) * gi * gi;
      Store(m + i, mi);
      Store(v + i, vi);
      const T mhat = mi / Splat<T>(c1);
      const T vhat = vi / Splat<T>(c2);
      Store(w + i, Load<T>(w + i) -
                       Splat<T>(lr_) * mhat / (Sqrt(vhat) + Splat<T>(eps_)));
    });
  }

 private:
  const float lr_;
  const float b1_;
  const float b2_;
  const float eps_;
};

// FTRL-proximal (McMahan et al. 2013), alpha = learning_rate. State:
// [z[dim], n[dim]], both starting at 0. Per element:
//   sigma = (sqrt(n + g²) - sqrt(n)) / alpha
//   z += s * g - sigma * w;  n += g²     (s: step_scale)
//   w = |z| <= l1 ? 0 : -(z - sign(z) * l1) / ((beta + sqrt(n)) / alpha + l2)
// z is not back-solved from the row's random initial weight: that weight only
// enters through the first sigma * w term, after which w is the closed form
// of (z, n).
class Ftrl final : public Optimizer {
 public:
  explicit Ftrl(const OptimizerConfig& c)
      : alpha_(c.learning_rate), beta_(c.ftrl_beta), l1_(c.l1), l2_(c.l2) {}

  const char* name() const override { return "ftrl"; }
  uint64_t StateWidth(uint64_t dim) const override { return 2 * dim; }
  void InitState(const float*, float* state, uint64_t dim) const override {
    for (uint64_t i = 0; i < 2 * dim; ++i) state[i] = 0.0f;
  }

  void Update(float* w, float* state, const float* g, uint64_t dim, uint64_t,
              float step_scale) const override {
    float* z = state;
    float* n = state + dim;
    for (uint64_t i = 0; i < dim; ++i) {
      const float n_new = n[i] + g[i] * g[i];
      const float sigma = (std::sqrt(n_new) - std::sqrt(n[i])) / alpha_;
      z[i] += step_scale * g[i] - sigma * w[i];
      n[i] = n_new;
      if (std::fabs(z[i]) <= l1_) {
        w[i] = 0.0f;
      } else {
        const float sign = z[i] < 0.0f ? -1.0f : 1.0f;
        w[i] =
            -(z[i] - sign * l1_) / ((beta_ + std::sqrt(n[i])) / alpha_ + l2_);
      }
    }
  }

 private:
  const float alpha_;
  const float beta_;
  const float l1_;
  const float l2_;
};

// The checks below are written so that NaN fails them too.

absl::Status MustBePositive(const char* field, float value) {
  if (value > 0.0f && std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "optimizer.", field, ": must be > 0 and finite, got ", value));
}

absl::Status MustBeNonNegative(const char* field, float value) {
  if (value >= 0.0f && std::isfinite(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "optimizer.", field, ": must be >= 0 and finite, got ", value));
}

absl::Status MustBeBeta(const char* field, float value) {
  if (value >= 0.0f && value < 1.0f) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("optimizer.", field, ": must be in [0, 1), got ", value));
}

}  // namespace

// Every field is checked whatever the type: the values a rule ignores are
// still never meaningful when out of range, and a typo in one (say, beta1
// set for what was meant to become an adam table) is better reported now.
absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(
    const OptimizerConfig& config) {
  const std::string& type = config.type;
  if (type != "sgd" && type != "adagrad" && type != "adam" && type != "ftrl") {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.type: unknown optimizer '", type,
                     "' (expected sgd, adagrad, adam, ftrl)"));
  }
  for (absl::Status s :
       {MustBePositive("learning_rate", config.learning_rate),
        MustBeNonNegative("initial_accumulator", config.initial_accumulator),
        MustBePositive("epsilon", config.epsilon),
        MustBeBeta("beta1", config.beta1), MustBeBeta("beta2", config.beta2),
        MustBeNonNegative("ftrl_beta", config.ftrl_beta),
        MustBeNonNegative("l1", config.l1),
        MustBeNonNegative("l2", config.l2)}) {
    if (!s.ok()) return s;
  }
  if (type == "sgd") return std::make_unique<Sgd>(config);
  if (type == "adagrad") return std::make_unique<Adagrad>(config);
  if (type == "adam") return std::make_unique<Adam>(config);
  return std::make_unique<Ftrl>(config);
}

}  // namespace hetps
