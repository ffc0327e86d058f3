// The Paddle-style launcher environment, for running `hetps server` and
// `hetps worker` as drop-in replacements under launchers that set:
//   PADDLE_PSERVERS_IP_PORT_LIST  "host:port,host:port"  ->
//   cluster.ps_endpoints PADDLE_TRAINER_ENDPOINTS      "host:port,..." ->
//   cluster.worker_endpoints TRAINING_ROLE                 PSERVER | TRAINER
//   PADDLE_TRAINER_ID             the worker's rank
//   POD_IP, PADDLE_PORT           a server's own endpoint; its rank is the
//                                 endpoint's index in the server list
// Only the CLI calls these; nothing deeper reads the environment.
#pragma once

#include <functional>
#include <string>
#include <vector>

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

// Launchers that start every rank with one command (`hetps run`):
//   OpenMPI (mpirun)  OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE,
//                     OMPI_COMM_WORLD_LOCAL_SIZE
//   Slurm (srun)      SLURM_PROCID, SLURM_NTASKS, SLURM_JOB_NODELIST
// (OpenMPI's first when both are set: mpirun inside an allocation). Ranks
// [0, cluster.servers) are the servers, the rest the workers, so the size
// must be cluster.servers + cluster.workers. The job starts from a
// rendezvous (cluster.ps_endpoints must not be set): cluster.rendezvous as
// configured, else under Slurm the allocation's first node (rank 0 runs
// there: srun's default block distribution), else under mpirun on one
// machine 127.0.0.1; both at kDefaultRendezvousPort. kNone when neither
// launcher's variables are set; INVALID_ARGUMENT naming the variable or
// field otherwise. `config` is changed only on success.
absl::StatusOr<RoleAssignment> ApplyLauncherEnvironment(
    JobConfig& config, const std::function<const char*(const char*)>& getenv);

// Slurm's hostlist syntax: "node[01-03,07],login1" -> node01 node02 node03
// node07 login1 (ranges keep the width of their first bound; several
// bracket groups in one name multiply). INVALID_ARGUMENT on bad syntax.
absl::StatusOr<std::vector<std::string>> ExpandHostlist(
    const std::string& hostlist);

}  // namespace hetps
