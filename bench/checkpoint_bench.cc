// Checkpoint cost of one server, in process: a sparse table of --rows rows
// of --dim floats (adagrad: as many floats of state again) plus a dense
// table, saved (Checkpointer::Save) while a client pushes 64 rows at a time
// through the server's Push, verified, restored into a fresh server and
// exported. The pause is how long the save held the server's applies
// (Checkpointer::last_pause); the client's longest push during the save is
// what a worker feels of it.
//
//   checkpoint_bench [--rows 1000000] [--dim 16] [--reps 3] [--dir /tmp/x]
//                    [--out results.json]
//
// The JSON reports the median seconds of each step, the checkpoint's bytes
// and MB/s, the median pause and longest push during a save (ms). The files go to --dir (default: a fresh directory under /tmp);
// the page cache is warm, fsync included.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "CLI/CLI.hpp"
#include "common/bytes.h"
#include "hetps/version.h"
#include "nlohmann/json.hpp"
#include "server/checkpoint.h"
#include "server/ps_server.h"

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

hetps::JobConfig BenchJob(const std::string& dir, uint64_t dim) {
  hetps::JobConfig config;
  config.mode = hetps::ConsistencyMode::kAsync;
  config.cluster.ps_endpoints = {"127.0.0.1:1"};
  config.cluster.workers = 1;
  config.checkpoint.dir = dir;
  config.checkpoint.keep = 1;
  hetps::TableConfig emb;
  emb.name = "emb";
  emb.kind = hetps::TableKind::kSparse;
  emb.dim = dim;
  emb.optimizer.type = "adagrad";
  hetps::TableConfig dense = emb;
  dense.name = "dense";
  dense.kind = hetps::TableKind::kDense;
  dense.dim = 1 << 20;
  config.tables = {emb, dense};
  return config;
}

uint64_t DirBytes(const std::string& dir) {
  uint64_t total = 0;
  for (const auto& e : fs::directory_iterator(dir)) total += e.file_size();
  return total;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"hetps checkpoint benchmark"};
  uint64_t rows = 1000000;
  uint64_t dim = 16;
  int reps = 3;
  std::string dir;
  std::string out_path;
  app.add_option("--rows", rows, "sparse rows");
  app.add_option("--dim", dim, "floats per row");
  app.add_option("--reps", reps, "repetitions (median reported)");
  app.add_option("--dir", dir, "checkpoint directory");
  app.add_option("--out", out_path, "write the JSON here too");
  CLI11_PARSE(app, argc, argv);
  if (dir.empty()) {
    dir = (fs::temp_directory_path() /
           ("hetps-ckpt-bench-" + std::to_string(getpid())))
              .string();
  }
  fs::remove_all(dir);

  hetps::JobConfig config = BenchJob(dir, dim);
  auto server = hetps::PsServer::Create(config, 0);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  // Fill: one push per 100k keys, so every row has adagrad state.
  hetps::SparseTable* table = (*server)->sparse_table("emb");
  const uint64_t step = 100000;
  std::vector<uint64_t> keys(step);
  std::vector<float> grads(step * dim, 0.01f);
  for (uint64_t begin = 0; begin < rows; begin += step) {
    const uint64_t n = std::min(step, rows - begin);
    for (uint64_t i = 0; i < n; ++i) keys[i] = (begin + i) * 0x9E3779B97F4A7C15ull;
    table->Push(std::span(keys.data(), n), std::span(grads.data(), n * dim));
  }

  hetps::Checkpointer checkpointer(config, 0, server->get());
  std::vector<double> save_s, verify_s, restore_s, export_s, pause_ms,
      push_ms;
  std::string path;
  uint64_t clock = 0;
  for (int r = 0; r < reps; ++r) {
    // A client pushing 64 of the rows at a time while the save runs.
    std::atomic<bool> saving{true};
    double longest_push = 0;
    std::thread pusher([&] {
      std::vector<uint64_t> some(64);
      while (saving) {
        for (uint64_t i = 0; i < some.size(); ++i) {
          some[i] = ((clock * 64 + i) % rows) * 0x9E3779B97F4A7C15ull;
        }
        hetps::rpc::PushRequest request;
        request.set_protocol_version(hetps::kProtocolVersion);
        request.set_batch_size(1);
        request.set_worker_id(0);
        request.set_clock(clock++);
        request.set_map_version(1);
        hetps::rpc::TableGradient* g = request.add_gradients();
        g->set_table("emb");
        g->set_dim(dim);
        hetps::AssignBytes<uint64_t>(g->mutable_keys(), some);
        hetps::AssignBytes<float>(g->mutable_values(),
                                  std::vector<float>(64 * dim, 0.01f));
        hetps::rpc::PushResponse response;
        grpc::ServerContext context;
        const auto begin = Clock::now();
        (*server)->Push(&context, &request, &response);
        longest_push = std::max(longest_push, SecondsSince(begin) * 1e3);
      }
    });
    auto start = Clock::now();
    auto saved = checkpointer.Save();
    save_s.push_back(SecondsSince(start));
    saving = false;
    pusher.join();
    push_ms.push_back(longest_push);
    pause_ms.push_back(absl::ToDoubleMilliseconds(checkpointer.last_pause()));
    if (!saved.ok()) {
      std::fprintf(stderr, "%s\n", saved.status().ToString().c_str());
      return 1;
    }
    path = *saved;

    start = Clock::now();
    auto verified = hetps::VerifyCheckpoint(path);
    verify_s.push_back(SecondsSince(start));
    if (!verified.ok()) return 1;

    hetps::JobConfig resume = config;
    resume.checkpoint.resume = true;
    auto fresh = hetps::PsServer::Create(resume, 0);
    if (!fresh.ok()) return 1;
    hetps::Checkpointer restorer(resume, 0, fresh->get());
    start = Clock::now();
    if (!restorer.Restore().ok()) return 1;
    restore_s.push_back(SecondsSince(start));
    if ((*fresh)->sparse_table("emb")->size() != rows) {
      std::fprintf(stderr, "restored %llu rows, saved %llu\n",
                   static_cast<unsigned long long>(
                       (*fresh)->sparse_table("emb")->size()),
                   static_cast<unsigned long long>(rows));
      return 1;
    }

    start = Clock::now();
    if (!hetps::ExportModel(dir, dir + "-export").ok()) return 1;
    export_s.push_back(SecondsSince(start));
  }
  const uint64_t bytes = DirBytes(path);
  const double mb = static_cast<double>(bytes) / 1e6;
  nlohmann::json result = {
      {"rows", rows},
      {"dim", dim},
      {"optimizer", "adagrad"},
      {"checkpoint_bytes", bytes},
      {"reps", reps},
      {"save_s", Median(save_s)},
      {"pause_ms", Median(pause_ms)},
      {"longest_push_during_save_ms", Median(push_ms)},
      {"save_mb_per_s", mb / Median(save_s)},
      {"verify_s", Median(verify_s)},
      {"restore_s", Median(restore_s)},
      {"restore_mb_per_s", mb / Median(restore_s)},
      {"export_s", Median(export_s)}};
  std::printf("%s\n", result.dump(2).c_str());
  if (!out_path.empty()) std::ofstream(out_path) << result.dump(2) << "\n";
  fs::remove_all(dir);
  fs::remove_all(dir + "-export");
  return 0;
}
