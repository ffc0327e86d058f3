// A test worker process: registers like a real worker, then for `rounds`
// rounds pulls (waiting for the round in sync mode) and pushes the known
// gradients of cluster/pattern.h, then leaves. Exit 0 on success.
// PAUSE_MS (default 0) is slept after each round, to stretch a run.
//
//   hetps_pattern_worker CONFIG RANK ROUNDS [PAUSE_MS]
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "cluster/pattern.h"
#include "coord/coordinator_client.h"
#include "hetps/config.h"
#include "hetps/ps_client.h"

int main(int argc, char** argv) {
  if (argc != 4 && argc != 5) {
    std::fprintf(stderr, "usage: %s CONFIG RANK ROUNDS [PAUSE_MS]\n", argv[0]);
    return 2;
  }
  auto config = hetps::LoadJobConfigFile(argv[1]);
  if (!config.ok() || !hetps::ValidateJobConfig(*config).ok()) {
    std::fprintf(stderr, "bad config\n");
    return 2;
  }
  const uint32_t rank = std::stoi(argv[2]);
  const int rounds = std::stoi(argv[3]);
  const int pause_ms = argc == 5 ? std::stoi(argv[4]) : 0;

  hetps::CoordinatorClient coordinator(*config, rank);
  if (auto r = coordinator.Register(); !r.ok()) {
    std::fprintf(stderr, "register: %s\n", r.status().ToString().c_str());
    return 1;
  }
  hetps::PsClientOptions options;
  options.endpoints = config->cluster.ps_endpoints;
  options.worker_id = rank;
  options.rpc = config->client;
  options.push_to_all_servers = config->mode == hetps::ConsistencyMode::kSync;
  auto client = hetps::PsClient::Connect(options);
  if (!client.ok()) {
    std::fprintf(stderr, "connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  coordinator.StartHeartbeats();
  for (int r = 0; r < rounds; ++r) {
    const hetps::pattern::Step step = hetps::pattern::StepOf(rank, r);
    std::vector<float> rows(step.keys.size() * hetps::pattern::kDim);
    std::vector<float> dense(hetps::pattern::kDenseSize);
    if (auto s =
            (*client)->PullSparse(hetps::pattern::kSparse, step.keys, rows);
        !s.ok()) {
      std::fprintf(stderr, "pull: %s\n", s.ToString().c_str());
      return 1;
    }
    if (auto s = (*client)->PullDense(hetps::pattern::kDense, dense); !s.ok()) {
      std::fprintf(stderr, "pull dense: %s\n", s.ToString().c_str());
      return 1;
    }
    const hetps::TableGrad grads[] = {
        {hetps::pattern::kSparse, step.keys, step.sparse_grads},
        {hetps::pattern::kDense, {}, step.dense_grads}};
    if (auto s = (*client)->Push(grads, hetps::pattern::BatchOf(rank));
        !s.ok()) {
      std::fprintf(stderr, "push: %s\n", s.ToString().c_str());
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  }
  if (auto s = coordinator.Leave("pattern done"); !s.ok()) {
    std::fprintf(stderr, "leave: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
