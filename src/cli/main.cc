// hetps: one binary for every role of a job.
//
//   hetps launch CONFIG          a whole local cluster (servers, then workers)
//   hetps calibrate CONFIG [--compare]   measure the workers, write a tuned job
//   hetps server --config C --rank R    one server (multi-host runs)
//   hetps worker --config C --rank R    one worker
//   hetps status --coordinator HOST:PORT [--json] [--config C]
//                (the job's config, for its auth section)
//   hetps save --coordinator HOST:PORT [--config C]
//                every server writes a checkpoint now
//   hetps export --checkpoint-dir D --out DIR   the model for serving
//
// Exit codes: 0 done, 1 a role failed, 2 configuration error, 130 Ctrl-C.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "CLI/CLI.hpp"
#include "cli/calibrate.h"
#include "cli/roles.h"
#include "common/logging.h"
#include "common/process_tuning.h"
#include "config/credentials.h"
#include "config/environment.h"
#include "hetps/config.h"
#include "hetps/version.h"
#include "model/job_shape.h"

namespace {

std::string SelfPath(const char* argv0) {
  char buf[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  if (n <= 0) return argv0;
  buf[n] = '\0';
  return buf;
}

int ConfigError(const std::string& message) {
  std::fprintf(stderr, "hetps: configuration error: %s\n", message.c_str());
  return hetps::kExitConfigError;
}

}  // namespace

int main(int argc, char** argv) {
  hetps::TuneProcess();
  CLI::App app{"hetps: a parameter server for heterogeneous clusters"};
  app.set_version_flag("--version", hetps::kVersionString);
  app.require_subcommand(1);

  std::string config_path;
  std::vector<std::string> overrides;
  std::string summary_json;
  int rank = -1;
  std::string coordinator;
  bool json = false;

  auto* launch = app.add_subcommand("launch", "run a local cluster");
  launch->add_option("config", config_path, "job YAML")->required();
  launch->add_option("--set", overrides, "override a field: path=value");
  bool quiet_status = false;
  launch->add_flag("--no-status", quiet_status,
                   "do not print the live status line while the job runs");
  launch->add_option("--summary-json", summary_json,
                     "write the final summary as JSON here");
  bool verbose = false;
  launch->add_flag("-v,--verbose", verbose,
                   "show every role's output here too (it always goes to "
                   "the run directory)");
  std::string run_dir;
  launch->add_option("--run-dir", run_dir,
                     "the run directory (default runs/<job>-<time>-<pid>)");

  auto* calibrate = app.add_subcommand(
      "calibrate",
      "measure every worker of the job (throughput by batch size, memory, "
      "links, drift) and write a tuned job file");
  calibrate->add_option("config", config_path, "job YAML")->required();
  calibrate->add_option("--set", overrides, "override a field: path=value");
  hetps::CalibrateOptions calibrate_options;
  calibrate->add_option("--seconds", calibrate_options.seconds,
                        "each worker's measurement (default 20)");
  calibrate->add_option("--out", calibrate_options.out,
                        "the tuned YAML (default JOB.tuned.yaml beside JOB)");
  calibrate->add_option("--run-dir", calibrate_options.run_dir,
                        "where the calibration's runs go");
  calibrate->add_flag("--compare", calibrate_options.compare,
                      "then run the original and the tuned job and compare "
                      "their time to the target AUC");

  auto* run = app.add_subcommand(
      "run",
      "run the role mpirun or srun gives this process (ranks below "
      "cluster.servers serve, the rest train; they meet at "
      "cluster.rendezvous)");
  run->add_option("config", config_path, "job YAML")->required();
  run->add_option("--set", overrides, "override a field: path=value");

  auto* server = app.add_subcommand("server", "run one server");
  auto* worker = app.add_subcommand("worker", "run one worker");
  for (CLI::App* role : {server, worker}) {
    role->add_option("--config", config_path, "job YAML");
    role->add_option("--set", overrides, "override a field: path=value");
    role->add_option("--rank", rank,
                     "rank of this role (else from the environment)");
  }
  double calibrate_seconds = 0;
  worker->add_option("--calibrate-seconds", calibrate_seconds,
                     "measure this worker for that long instead of training "
                     "its share (hetps calibrate starts workers so)");
  // Checkpoint flags: shorthands for the checkpoint.* fields.
  std::string checkpoint_dir;
  uint64_t checkpoint_every = 0;
  bool resume = false;
  for (CLI::App* role : {launch, server}) {
    role->add_option("--checkpoint-dir", checkpoint_dir,
                     "write checkpoints here (checkpoint.dir)");
    role->add_option("--checkpoint-every", checkpoint_every,
                     "save every N applied rounds (checkpoint.every_rounds)");
    role->add_flag("--resume", resume,
                   "start from the newest checkpoint that verifies "
                   "(checkpoint.resume)");
  }

  auto* save = app.add_subcommand(
      "save", "make every server of a running job write a checkpoint now");
  auto* export_model = app.add_subcommand(
      "export", "write the model of a job's newest checkpoints for serving");
  std::string export_out;
  export_model
      ->add_option("--checkpoint-dir", checkpoint_dir,
                   "the job's checkpoint.dir")
      ->required();
  export_model->add_option("--out", export_out, "output directory")->required();

  auto* gen = app.add_subcommand(
      "gen-data", "write Criteo-format data drawn from a hidden teacher model");
  hetps::CriteoGenConfig gen_config;
  std::string gen_out;
  gen->add_option("--out", gen_out, "output file (TSV)")->required();
  gen->add_option("--samples", gen_config.samples, "number of samples");
  gen->add_option("--seed", gen_config.seed, "seed of teacher and samples");
  gen->add_option("--vocab", gen_config.vocab,
                  "ids of categorical column c: vocab >> (c % 4)");
  gen->add_option("--zipf", gen_config.zipf_s,
                  "Zipf exponent of the categorical ids");
  gen->add_option("--missing-rate", gen_config.missing_rate,
                  "probability that a field is empty");
  gen->add_option("--teacher-rank", gen_config.teacher_rank,
                  "rank of the teacher's pairwise interactions");
  gen->add_option("--teacher-scale", gen_config.teacher_scale,
                  "std. deviation of the teacher's first-order part");
  gen->add_option("--pair-scale", gen_config.pair_scale,
                  "std. deviation of the teacher's pairwise part");
  gen->add_option("--positive-rate", gen_config.positive_rate,
                  "fraction of positive labels the bias aims at");

  auto* status = app.add_subcommand("status", "show a running job");
  status->add_option("--coordinator", coordinator, "host:port of server 0")
      ->required();
  status->add_flag("--json", json, "print JSON");
  save->add_option("--coordinator", coordinator, "host:port of server 0")
      ->required();
  for (CLI::App* client : {status, save}) {
    client->add_option("--config", config_path,
                       "the job's YAML (its auth section: token, TLS)");
    client->add_option("--set", overrides, "override a field: path=value");
  }

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : hetps::kExitConfigError;
  }

  if (*export_model) return hetps::RunExport(checkpoint_dir, export_out);
  if (*gen) return hetps::RunGenData(gen_config, gen_out);

  if (!checkpoint_dir.empty()) {
    overrides.push_back("checkpoint.dir=" +
                        std::filesystem::absolute(checkpoint_dir).string());
  }
  if (checkpoint_every > 0) {
    overrides.push_back("checkpoint.every_rounds=" +
                        std::to_string(checkpoint_every));
  }
  if (resume) overrides.push_back("checkpoint.resume=true");

  auto config = hetps::BuildJobConfig(config_path, overrides);
  if (!config.ok()) return ConfigError(std::string(config.status().message()));

  if (*status || *save) {
    // Only the secrets matter here: no tables, no data.
    absl::Status s = hetps::ValidateJobConfig(*config);
    if (s.ok()) s = hetps::ResolveCredentials(*config, std::getenv);
    if (!s.ok()) return ConfigError(std::string(s.message()));
    return *status ? hetps::RunStatus(coordinator, json, config->credentials)
                   : hetps::RunSave(coordinator, config->credentials);
  }
  if (*launch) {
    if (auto shape = hetps::ValidateAndResolve(*config); !shape.ok()) {
      return ConfigError(std::string(shape.status().message()));
    }
    hetps::SetupLogging(config->log_level, "launch");
    hetps::LaunchOptions options;
    options.self_path = SelfPath(argv[0]);
    options.config_path = config_path;
    options.overrides = overrides;
    options.summary_json = summary_json;
    options.live_status = !quiet_status;
    options.verbose = verbose;
    options.run_dir = run_dir;
    return hetps::RunLaunch(*std::move(config), options);
  }

  if (*calibrate) {
    if (auto shape = hetps::ValidateAndResolve(*config); !shape.ok()) {
      return ConfigError(std::string(shape.status().message()));
    }
    hetps::SetupLogging(config->log_level, "calibrate");
    calibrate_options.self_path = SelfPath(argv[0]);
    calibrate_options.config_path = config_path;
    calibrate_options.overrides = overrides;
    return hetps::RunCalibrate(*config, calibrate_options);
  }

  // A single role: the environment may name endpoints, role and rank.
  const bool by_launcher = run->parsed();
  auto assigned = by_launcher
                      ? hetps::ApplyLauncherEnvironment(*config, std::getenv)
                      : hetps::ApplyPaddleEnvironment(*config, std::getenv);
  if (!assigned.ok())
    return ConfigError(std::string(assigned.status().message()));
  if (by_launcher && assigned->role == hetps::RoleAssignment::kNone) {
    return ConfigError(
        "hetps run: no launcher variables (OMPI_COMM_WORLD_RANK from mpirun, "
        "SLURM_PROCID from srun); start a single role with hetps server|worker "
        "--rank N");
  }
  if (rank < 0) rank = assigned->rank;
  auto shape = hetps::ValidateAndResolve(*config);
  if (!shape.ok()) return ConfigError(std::string(shape.status().message()));
  const bool is_server = by_launcher
                             ? assigned->role == hetps::RoleAssignment::kServer
                             : server->parsed();
  const int count = is_server ? config->num_servers() : config->num_workers();
  if (rank < 0 || rank >= count) {
    return ConfigError("--rank: " + std::to_string(rank) + " is not in [0, " +
                       std::to_string(count) + ")");
  }
  if (config->cluster.ps_endpoints.empty() &&
      config->cluster.rendezvous.empty()) {
    return ConfigError(
        "cluster.ps_endpoints: a single role needs the server endpoints "
        "(config, --set, or PADDLE_PSERVERS_IP_PORT_LIST) or "
        "cluster.rendezvous, server 0's host:port");
  }
  hetps::SetupLogging(config->log_level, (is_server ? "server " : "worker ") +
                                             std::to_string(rank));
  return is_server ? hetps::RunServerRole(*config, *shape, rank, by_launcher)
                   : hetps::RunWorkerRole(*config, *shape, rank, by_launcher,
                                          calibrate_seconds);
}
