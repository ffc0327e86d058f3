// Micro-benchmarks of SparseTable Pull and Push on warm rows (every key
// already present), the steady state of training, and of what a server
// adds per request to record its access (shard/access_stats.h) and to
// check a push's values for NaN/Inf (common/finite.h). Keys are
// random 64-bit ids, as produced by feature hashing.
//
//   table_bench --benchmark_format=json
//
// Arguments: {keys per request, dim} ({keys} for RecordAccess). items/s
// counts keys.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "benchmark/benchmark.h"
#include "common/clock.h"
#include "common/finite.h"
#include "hetps/config.h"
#include "shard/access_stats.h"
#include "shard/shard_map.h"
#include "table/optimizer.h"
#include "table/sparse_table.h"

namespace hetps {
namespace {

struct Fixture {
  std::unique_ptr<SparseTable> table;
  std::vector<uint64_t> keys;
  std::vector<float> values;  // pull output or push gradients
};

Fixture MakeWarmTable(const std::string& optimizer, size_t count,
                      uint64_t dim) {
  TableConfig config;
  config.name = "bench";
  config.dim = dim;
  config.optimizer.type = optimizer;
  config.optimizer.learning_rate = 0.01f;
  config.init.type = "uniform";
  Fixture f;
  f.table = std::make_unique<SparseTable>(
      config, std::move(*Optimizer::Create(config.optimizer)),
      ServerOptions{}.table_stripes);
  std::mt19937_64 rng(42);
  f.keys.resize(count);
  for (auto& k : f.keys) k = rng();
  f.values.assign(count * dim, 0.001f);
  std::vector<float> out(count * dim);
  f.table->Pull(f.keys, out);  // creates every row
  return f;
}

void BM_Pull(benchmark::State& state) {
  const size_t count = static_cast<size_t>(state.range(0));
  const uint64_t dim = static_cast<uint64_t>(state.range(1));
  Fixture f = MakeWarmTable("sgd", count, dim);
  for (auto _ : state) {
    f.table->Pull(f.keys, f.values);
    benchmark::DoNotOptimize(f.values.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(count));
}

void BM_Push(benchmark::State& state, const char* optimizer) {
  const size_t count = static_cast<size_t>(state.range(0));
  const uint64_t dim = static_cast<uint64_t>(state.range(1));
  Fixture f = MakeWarmTable(optimizer, count, dim);
  for (auto _ : state) {
    f.table->Push(f.keys, f.values);
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(count));
}

// The same warm keys in as many orders as a request of them may come in
// before one comes again in an order a table still has a plan for
// (SparseTable keeps the grouping of recent requests' keys): each
// iteration takes the next order, so no request finds the plan of another
// iteration's.
std::vector<std::vector<uint64_t>> Orders(const std::vector<uint64_t>& keys) {
  const size_t count = ((size_t{1} << 20) + keys.size() - 1) / keys.size() + 8;
  std::vector<std::vector<uint64_t>> orders(count, keys);
  for (size_t i = 0; i < count; ++i) {
    std::rotate(orders[i].begin(), orders[i].begin() + (i * 7919) % keys.size(),
                orders[i].end());
    std::swap(orders[i][0], orders[i][i % keys.size()]);
  }
  return orders;
}

// Requests of the warm keys in an order no recent request had: pulls,
// pushes, or both as a training step makes them (a pull of the batch's
// keys, then the push of their gradients in the same order).
void BM_NewOrder(benchmark::State& state, bool pull, bool push) {
  const size_t count = static_cast<size_t>(state.range(0));
  const uint64_t dim = static_cast<uint64_t>(state.range(1));
  Fixture f = MakeWarmTable("sgd", count, dim);
  const auto orders = Orders(f.keys);
  std::vector<float> rows(count * dim);
  size_t next = 0;
  for (auto _ : state) {
    if (pull) f.table->Pull(orders[next], rows);
    if (push) f.table->Push(orders[next], f.values);
    next = (next + 1) % orders.size();
    benchmark::DoNotOptimize(rows.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(count));
}

void NewOrderSizes(benchmark::internal::Benchmark* b) {
  for (int64_t count : {1'000, 10'000, 30'000}) {
    for (int64_t dim : {1, 16}) b->Args({count, dim});
  }
  b->ArgNames({"keys", "dim"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}

void Sizes(benchmark::internal::Benchmark* b) {
  for (int64_t count : {3'000, 10'000, 30'000, 100'000, 1'000'000}) {
    for (int64_t dim : {1, 16}) b->Args({count, dim});
  }
  b->ArgNames({"keys", "dim"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}

// One request's keys recorded by a server of the default 4096 buckets.
void BM_RecordAccess(benchmark::State& state) {
  const size_t count = static_cast<size_t>(state.range(0));
  AccessRecorder recorder(ServerOptions{}.num_buckets, {"bench"},
                          Clock::Real());
  std::mt19937_64 rng(42);
  std::vector<uint64_t> keys(count);
  for (auto& k : keys) k = rng();
  for (auto _ : state) {
    recorder.Record(Access::kPull, "bench", keys, 64, absl::Microseconds(100));
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(count));
}

// The NaN/Inf check every push's values get, on the client and again on
// the server (common/finite.h): all finite, the common case.
void BM_CheckFinite(benchmark::State& state) {
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> values(static_cast<size_t>(state.range(0)));
  for (float& v : values) v = normal(rng);
  for (auto _ : state) {
    benchmark::DoNotOptimize(FirstNonFinite(values));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(values.size() * sizeof(float)));
}

// What a bucket move walks at its old owner (server/ps_server_moves.cc):
// the copy of the rows of `moving` of 4096 buckets (ForEachRowWithState
// with the bucket test), and their removal when the move settles
// (ExtractRows; the rows are put back, untimed, for the next iteration).
// items/s counts the table's rows walked.
std::vector<bool> MovingBuckets(uint32_t moving) {
  std::vector<bool> buckets(ServerOptions{}.num_buckets, false);
  for (uint32_t b = 0; b < moving; ++b) buckets[b * 73 % buckets.size()] = true;
  return buckets;
}

void BM_CopyBuckets(benchmark::State& state) {
  const size_t count = static_cast<size_t>(state.range(0));
  Fixture f = MakeWarmTable("adagrad", count, 32);
  const std::vector<bool> moving =
      MovingBuckets(static_cast<uint32_t>(state.range(1)));
  uint64_t copied = 0;
  for (auto _ : state) {
    std::vector<float> weights;
    f.table->ForEachRowWithState(
        [&](uint64_t, std::span<const float> w, std::span<const float>,
            uint64_t) { weights.insert(weights.end(), w.begin(), w.end()); },
        [&](std::span<const uint64_t> keys, std::span<bool> take) {
          MarkKeysInBuckets(moving, keys, take);
        });
    copied = weights.size() / 32;
    benchmark::DoNotOptimize(weights.data());
  }
  state.counters["rows_copied"] = static_cast<double>(copied);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(count));
}

void BM_ExtractBuckets(benchmark::State& state) {
  const size_t count = static_cast<size_t>(state.range(0));
  Fixture f = MakeWarmTable("adagrad", count, 32);
  const std::vector<bool> moving =
      MovingBuckets(static_cast<uint32_t>(state.range(1)));
  struct Row {
    uint64_t key;
    std::vector<float> weights, state;
    uint64_t updates;
  };
  std::vector<Row> taken;
  for (auto _ : state) {
    taken.clear();
    f.table->ExtractRows(
        [&](std::span<const uint64_t> keys, std::span<bool> take) {
          MarkKeysInBuckets(moving, keys, take);
        },
        [&](uint64_t key, std::span<const float> w, std::span<const float> st,
            uint64_t updates) {
          taken.push_back(
              {key, {w.begin(), w.end()}, {st.begin(), st.end()}, updates});
        });
    state.PauseTiming();
    for (const Row& r : taken) {
      f.table->RestoreRow(r.key, r.weights, r.state, r.updates);
    }
    state.ResumeTiming();
  }
  state.counters["rows_removed"] = static_cast<double>(taken.size());
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(count));
}

void MoveSizes(benchmark::internal::Benchmark* b) {
  for (int64_t count : {150'000, 1'000'000}) b->Args({count, 54});
  b->ArgNames({"rows", "moving"})->Unit(benchmark::kMicrosecond)->UseRealTime();
}

BENCHMARK(BM_Pull)->Apply(Sizes);
BENCHMARK(BM_CopyBuckets)->Apply(MoveSizes);
BENCHMARK(BM_ExtractBuckets)->Apply(MoveSizes);
BENCHMARK(BM_RecordAccess)
    ->Arg(64)
    ->Arg(1'000)
    ->Arg(10'000)
    ->Arg(100'000)
    ->ArgName("keys")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_CheckFinite)
    ->Arg(16'000)
    ->Arg(160'000)
    ->Arg(1'600'000)
    ->ArgName("values")
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Push, sgd, "sgd")->Apply(Sizes);
BENCHMARK_CAPTURE(BM_NewOrder, pull, true, false)->Apply(NewOrderSizes);
BENCHMARK_CAPTURE(BM_NewOrder, push, false, true)->Apply(NewOrderSizes);
BENCHMARK_CAPTURE(BM_NewOrder, step, true, true)->Apply(NewOrderSizes);
BENCHMARK_CAPTURE(BM_Push, adagrad, "adagrad")->Apply(Sizes);

}  // namespace
}  // namespace hetps

BENCHMARK_MAIN();
