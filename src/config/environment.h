// The Paddle-style launcher environment, for running `hetps server` and
// `hetps worker` as drop-in replacements under launchers that set:
//   PADDLE_PSERVERS_IP_PORT_LIST  "host:port,host:port"  ->
//   cluster.ps_endpoints PADDLE_TRAINER_ENDPOINTS      "host:port,..." ->
//   cluster.worker_endpoints TRAINING_ROLE                 PSERVER | TRAINER
//   PADDLE_TRAINER_ID             the worker's rank
//   POD_IP, PADDLE_PORT           a server's own endpoint; its rank is the
//                                 endpoint's index in the server list
// Only the CLI calls this; nothing deeper reads the environment.
#pragma once

#include <functional>

#include "absl/status/statusor.h"
#include "hetps/config.h"

namespace hetps {

struct RoleAssignment {
  enum Role { kNone, kServer, kWorker };
  Role role = kNone;  // kNone: TRAINING_ROLE is not set
  int rank = -1;      // -1 unless the role's rank is known
};

// Reads the variables above through `getenv` (std::getenv in production, a
// map in tests; it returns nullptr for an unset variable, and an empty value
// counts as unset). Endpoint lists replace the config's lists. On error
// (INVALID_ARGUMENT naming the variable) `config` is left unchanged.
absl::StatusOr<RoleAssignment> ApplyPaddleEnvironment(
    JobConfig& config, const std::function<const char*(const char*)>& getenv);

}  // namespace hetps
