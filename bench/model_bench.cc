// DeepFM forward + backward on one core, Criteo-shaped: 39 slots (13
// bucketised numeric + 26 categorical) with one key each, 13 dense features,
// k = 8, MLP 400-400-400, once per instruction-set level this CPU runs
// (train.isa; the name's middle part). items/s is samples/s.
//
//   model_bench --benchmark_filter=DeepFmTrain --benchmark_format=json
#include <benchmark/benchmark.h>

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
    train.embedding_dim = 8;
    train.hidden = {400, 400, 400};
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
}

void DeepFmPredict(benchmark::State& state, Isa isa) {
  Fixture f(isa, static_cast<int>(state.range(0)));
  for (auto _ : state) {
    f.model->Predict(f.batch, f.params(), f.p);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(state.iterations() * state.range(0));
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
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
