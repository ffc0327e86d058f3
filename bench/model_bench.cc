// DeepFM forward + backward on one core, Criteo-shaped: 39 slots (13
// bucketised numeric + 26 categorical) with one key each, 13 dense features,
// k = 8, MLP 400-400-400, once per instruction-set level this CPU runs
// (train.isa; the name's middle part). items/s is samples/s; flop/s counts
// the MLP's multiply-adds (2 flops each), the work an FMA unit can do.
// BM_FmaPeak/<level> is the core's own ceiling for that: independent
// fused multiply-adds on registers, nothing else.
//
//   model_bench --benchmark_filter=DeepFmTrain --benchmark_format=json
#include <benchmark/benchmark.h>
#include <immintrin.h>

#include <cstdint>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "data/batch.h"
#include "hetps/config.h"
#include "model/model.h"
#include "table/initializer.h"

namespace hetps {
namespace {

constexpr int kSlots = 39;
constexpr int kDense = 13;
constexpr uint64_t kIdsPerSlot = 100000;
constexpr int kEmbeddingDim = 8;
const std::vector<int> kHidden = {400, 400, 400};

// Multiply-adds of the MLP per sample: forward x·W for every layer (input
// S·k + dense, the hidden widths, 1). Training does that three times: the
// forward pass, the weights' gradients, the inputs' gradients.
double MlpMultiplyAdds() {
  int in = kSlots * kEmbeddingDim + kDense;
  double total = 0;
  for (int width : kHidden) {
    total += static_cast<double>(in) * width;
    in = width;
  }
  return total + in;
}

struct Fixture {
  std::unique_ptr<Model> model;
  Batch batch;
  std::vector<uint32_t> row_of_key;
  std::vector<float> rows;
  std::vector<float> dense;
  std::vector<float> p, row_grads, dense_grad;

  Fixture(Isa isa, int batch_size) {
    TrainConfig train;
    train.model = "deepfm";
    train.isa = IsaName(isa);
    train.embedding_dim = kEmbeddingDim;
    train.hidden = kHidden;
    auto created = Model::Create(train, kSlots, kDense);
    if (!created.ok()) std::abort();
    model = std::move(*created);

    // Skewed ids so that, as in real CTR data, a batch repeats some keys.
    std::mt19937_64 rng(1);
    std::geometric_distribution<uint64_t> id(1e-3);
    std::normal_distribution<float> value(0.0f, 1.0f);
    absl::flat_hash_map<uint64_t, uint32_t> row_index;
    batch.num_slots = kSlots;
    batch.num_dense = kDense;
    for (int i = 0; i < batch_size; ++i) {
      batch.BeginSample(static_cast<float>(rng() % 4 == 0));
      for (int s = 0; s < kSlots; ++s) {
        const uint64_t key = s * kIdsPerSlot + id(rng) % kIdsPerSlot;
        batch.AddKey(key);
        batch.EndSlot();
        auto [it, inserted] =
            row_index.try_emplace(key, static_cast<uint32_t>(row_index.size()));
        row_of_key.push_back(it->second);
      }
      for (int d = 0; d < kDense; ++d) batch.AddDense(value(rng));
    }
    const TableConfig emb = model->Tables()[0];
    const TableConfig mlp = model->Tables()[1];
    rows.resize(row_index.size() * model->row_dim());
    for (size_t r = 0; r < rows.size(); ++r) {
      rows[r] =
          InitialValue(emb.init, r / model->row_dim(), r % model->row_dim());
    }
    dense.resize(model->dense_size());
    for (size_t i = 0; i < dense.size(); ++i) {
      dense[i] = InitialValue(mlp.init, i, 0);
    }
    p.resize(batch.size());
    row_grads.resize(rows.size());
    dense_grad.resize(dense.size());
  }

  BatchParams params() const { return {row_of_key, rows, dense}; }
};

void DeepFmTrain(benchmark::State& state, Isa isa) {
  Fixture f(isa, static_cast<int>(state.range(0)));
  for (auto _ : state) {
    const double loss =
        f.model->Train(f.batch, f.params(), f.p, f.row_grads, f.dense_grad);
    benchmark::DoNotOptimize(loss);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.counters["flop/s"] = benchmark::Counter(
      2 * 3 * MlpMultiplyAdds() * state.iterations() * state.range(0),
      benchmark::Counter::kIsRate);
}

void DeepFmPredict(benchmark::State& state, Isa isa) {
  Fixture f(isa, static_cast<int>(state.range(0)));
  for (auto _ : state) {
    f.model->Predict(f.batch, f.params(), f.p);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
  state.counters["flop/s"] = benchmark::Counter(
      2 * MlpMultiplyAdds() * state.iterations() * state.range(0),
      benchmark::Counter::kIsRate);
}

// Independent accumulators, at least 8 to keep two FMA units busy through a
// 4-cycle latency, and all in registers with the multiplier: 12 of AVX2's
// 16 (with 16, two lived on the stack and their store-to-load chains held
// the loop to ~3/4 of the peak on a Zen 4), 16 of AVX-512's 32. Each
// returns the flops done (2 per lane per FMA).
__attribute__((target("avx2,fma"))) double FmaLoopAvx2(int64_t rounds) {
  const __m256 mul = _mm256_set1_ps(0.999f);
  __m256 acc[12];
  for (__m256& a : acc) a = mul;
  for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 12
    for (__m256& a : acc) a = _mm256_fmadd_ps(a, mul, mul);
  }
  float sink = 0;
  for (__m256& a : acc) sink += _mm256_cvtss_f32(a);
  benchmark::DoNotOptimize(sink);
  return 2.0 * 8 * 12 * static_cast<double>(rounds);
}

__attribute__((target("avx512f"))) double FmaLoopAvx512(int64_t rounds) {
  const __m512 mul = _mm512_set1_ps(0.999f);
  __m512 acc[16];
  for (__m512& a : acc) a = mul;
  for (int64_t r = 0; r < rounds; ++r) {
#pragma GCC unroll 16
    for (__m512& a : acc) a = _mm512_fmadd_ps(a, mul, mul);
  }
  float sink = 0;
  for (__m512& a : acc) sink += _mm512_cvtss_f32(a);
  benchmark::DoNotOptimize(sink);
  return 2.0 * 16 * 16 * static_cast<double>(rounds);
}

void FmaPeak(benchmark::State& state, double (*loop)(int64_t)) {
  double flops = 0;
  for (auto _ : state) flops += loop(1 << 20);
  state.counters["flop/s"] =
      benchmark::Counter(flops, benchmark::Counter::kIsRate);
}

}  // namespace
}  // namespace hetps

int main(int argc, char** argv) {
  using hetps::Isa;
  for (Isa isa : hetps::AvailableIsas()) {
    const std::string level = hetps::IsaName(isa);
    benchmark::RegisterBenchmark(("BM_DeepFmTrain/" + level).c_str(),
                                 hetps::DeepFmTrain, isa)
        ->Arg(256)
        ->Arg(1024)
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("BM_DeepFmPredict/" + level).c_str(),
                                 hetps::DeepFmPredict, isa)
        ->Arg(256)
        ->Arg(1024)
        ->Unit(benchmark::kMillisecond);
  }
  for (Isa isa : hetps::AvailableIsas()) {
    if (isa == Isa::kAvx2) {
      benchmark::RegisterBenchmark("BM_FmaPeak/avx2", hetps::FmaPeak,
                                   hetps::FmaLoopAvx2);
    } else if (isa == Isa::kAvx512) {
      benchmark::RegisterBenchmark("BM_FmaPeak/avx512", hetps::FmaPeak,
                                   hetps::FmaLoopAvx512);
    }
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
