// Memory per sparse row in a server's table (issue 17, target 5): creates
// --rows rows of --dim floats with --optimizer (each row pushed once, so
// its optimizer state exists) in a SparseTable with the server's stripes,
// and reports the heap the table holds and the resident memory it added,
// per row, against the payload: the 8-byte key, the weights and the
// optimizer state.
//
//   table_memory_bench [--rows 10000000] [--dim 16] [--optimizer adagrad]
//
// Prints one JSON object.
#include <malloc.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/process_tuning.h"
#include "hetps/config.h"
#include "nlohmann/json.hpp"
#include "table/optimizer.h"
#include "table/sparse_table.h"

namespace {

// Bytes the heap has handed out (mallinfo2: in use, arena and mmapped).
uint64_t HeapBytes() {
  const struct mallinfo2 m = mallinfo2();
  return m.uordblks + m.hblkhd;
}

// Resident bytes of this process (/proc/self/statm).
uint64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  uint64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
}

}  // namespace

int main(int argc, char** argv) {
  hetps::TuneProcess();
  CLI::App app{"hetps memory per sparse row"};
  uint64_t rows = 10000000;
  uint64_t dim = 16;
  std::string optimizer = "adagrad";
  app.add_option("--rows", rows, "rows to create");
  app.add_option("--dim", dim, "floats per row");
  app.add_option("--optimizer", optimizer, "sgd, adagrad, adam, ftrl");
  CLI11_PARSE(app, argc, argv);

  hetps::TableConfig config;
  config.name = "emb";
  config.dim = dim;
  config.optimizer.type = optimizer;
  config.init.type = "uniform";
  auto opt = hetps::Optimizer::Create(config.optimizer);
  if (!opt.ok()) {
    std::fprintf(stderr, "%s\n", opt.status().ToString().c_str());
    return 1;
  }
  const uint64_t state = (*opt)->StateWidth(dim);
  // The pushes' buffers, allocated before the baseline.
  constexpr uint64_t kStep = 100000;
  std::vector<uint64_t> keys(kStep);
  std::vector<float> grads(kStep * dim, 0.01f);
  const uint64_t heap_before = HeapBytes();
  const uint64_t resident_before = ResidentBytes();
  uint64_t heap_after = 0;
  uint64_t resident_after = 0;
  {
    hetps::SparseTable table(config, std::move(*opt),
                             hetps::ServerOptions{}.table_stripes);
    std::mt19937_64 random(42);
    for (uint64_t made = 0; made < rows; made += kStep) {
      const uint64_t n = std::min(kStep, rows - made);
      for (uint64_t i = 0; i < n; ++i) keys[i] = random();
      table.Push(std::span(keys.data(), n), std::span(grads.data(), n * dim));
    }
    heap_after = HeapBytes();
    resident_after = ResidentBytes();
    if (table.size() != rows) {
      std::fprintf(stderr, "made %llu rows, wanted %llu (key collision?)\n",
                   static_cast<unsigned long long>(table.size()),
                   static_cast<unsigned long long>(rows));
      return 1;
    }
  }
  const double payload = 8.0 + 4.0 * static_cast<double>(dim + state);
  const double heap = static_cast<double>(heap_after - heap_before) / rows;
  const double resident =
      static_cast<double>(resident_after - resident_before) / rows;
  nlohmann::json result = {{"rows", rows},
                           {"dim", dim},
                           {"optimizer", optimizer},
                           {"payload_bytes_per_row", payload},
                           {"heap_bytes_per_row", heap},
                           {"resident_bytes_per_row", resident},
                           {"heap_over_payload", heap / payload},
                           {"resident_over_payload", resident / payload}};
  std::printf("%s\n", result.dump(2).c_str());
  return 0;
}
