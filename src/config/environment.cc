// Launcher environments (Paddle-style lists, OpenMPI, Slurm) -> JobConfig
// and role (see environment.h).

#include "config/environment.h"

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"

namespace hetps {
namespace {

constexpr char kServerList[] = "PADDLE_PSERVERS_IP_PORT_LIST";
constexpr char kWorkerList[] = "PADDLE_TRAINER_ENDPOINTS";
constexpr char kRole[] = "TRAINING_ROLE";
constexpr char kTrainerId[] = "PADDLE_TRAINER_ID";
constexpr char kPodIp[] = "POD_IP";
constexpr char kPort[] = "PADDLE_PORT";

// The variable's value, or nullopt when unset or empty: launchers often
// export a variable empty rather than leave it out.
std::optional<std::string> Read(
    const std::function<const char*(const char*)>& getenv, const char* name) {
  const char* value = getenv(name);
  if (value == nullptr) return std::nullopt;
  std::string text(absl::StripAsciiWhitespace(value));
  if (text.empty()) return std::nullopt;
  return text;
}

absl::StatusOr<std::vector<std::string>> ReadEndpointList(
    const std::function<const char*(const char*)>& getenv, const char* name) {
  std::vector<std::string> endpoints;
  std::optional<std::string> text = Read(getenv, name);
  if (!text) return endpoints;
  for (absl::string_view item :
       absl::StrSplit(*text, ',', absl::SkipWhitespace())) {
    std::string endpoint(absl::StripAsciiWhitespace(item));
    if (absl::Status status = ValidateEndpoint(endpoint); !status.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(name, "[", endpoints.size(), "]: ", status.message()));
    }
    endpoints.push_back(std::move(endpoint));
  }
  return endpoints;
}

absl::StatusOr<int> ServerRank(
    const std::function<const char*(const char*)>& getenv,
    const std::vector<std::string>& servers) {
  std::optional<std::string> ip = Read(getenv, kPodIp);
  std::optional<std::string> port = Read(getenv, kPort);
  if (!ip || !port) {
    return absl::InvalidArgumentError(
        absl::StrCat(kPodIp, ", ", kPort, ": both must be set when ", kRole,
                     "=PSERVER (the server's own endpoint)"));
  }
  if (servers.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        kServerList, ": must list the servers when ", kRole, "=PSERVER"));
  }
  // A bare IPv6 address needs brackets to match the list's form.
  const bool bare_v6 = ip->find(':') != std::string::npos && ip->front() != '[';
  const std::string self = bare_v6 ? absl::StrCat("[", *ip, "]:", *port)
                                   : absl::StrCat(*ip, ":", *port);
  for (size_t i = 0; i < servers.size(); ++i) {
    if (servers[i] == self) return static_cast<int>(i);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      kPodIp, ":", kPort, ": '", self, "' is not among the server endpoints (",
      absl::StrJoin(servers, ","), ")"));
}

absl::StatusOr<int> WorkerRank(
    const std::function<const char*(const char*)>& getenv,
    const std::vector<std::string>& workers) {
  std::optional<std::string> id = Read(getenv, kTrainerId);
  if (!id) {
    return absl::InvalidArgumentError(
        absl::StrCat(kTrainerId, ": must be set when ", kRole, "=TRAINER"));
  }
  int rank = -1;
  if (!absl::SimpleAtoi(*id, &rank) || rank < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kTrainerId, ": expected a non-negative integer, got '", *id, "'"));
  }
  // Without an endpoint list the worker count may still change (--set), so
  // the range is checked only against a list given here or in the config.
  if (!workers.empty() && rank >= static_cast<int>(workers.size())) {
    return absl::InvalidArgumentError(absl::StrCat(kTrainerId, ": ", rank,
                                                   " is out of range for ",
                                                   workers.size(), " workers"));
  }
  return rank;
}

}  // namespace

absl::StatusOr<RoleAssignment> ApplyPaddleEnvironment(
    JobConfig& config, const std::function<const char*(const char*)>& getenv) {
  JobConfig updated = config;
  absl::StatusOr<std::vector<std::string>> servers =
      ReadEndpointList(getenv, kServerList);
  if (!servers.ok()) return servers.status();
  if (!servers->empty()) updated.cluster.ps_endpoints = *std::move(servers);
  absl::StatusOr<std::vector<std::string>> workers =
      ReadEndpointList(getenv, kWorkerList);
  if (!workers.ok()) return workers.status();
  if (!workers->empty()) updated.cluster.worker_endpoints = *std::move(workers);

  RoleAssignment assignment;
  std::optional<std::string> role = Read(getenv, kRole);
  if (role == "PSERVER") {
    absl::StatusOr<int> rank = ServerRank(getenv, updated.cluster.ps_endpoints);
    if (!rank.ok()) return rank.status();
    assignment = {RoleAssignment::kServer, *rank};
  } else if (role == "TRAINER") {
    absl::StatusOr<int> rank =
        WorkerRank(getenv, updated.cluster.worker_endpoints);
    if (!rank.ok()) return rank.status();
    assignment = {RoleAssignment::kWorker, *rank};
  } else if (role) {
    return absl::InvalidArgumentError(absl::StrCat(
        kRole, ": expected PSERVER or TRAINER, got '", *role, "'"));
  }
  config = std::move(updated);
  return assignment;
}

namespace {

// One name of a hostlist, its bracket groups expanded (cartesian).
absl::Status ExpandName(absl::string_view name, std::vector<std::string>* out) {
  const size_t open = name.find('[');
  if (open == absl::string_view::npos) {
    if (name.find(']') != absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("']' without '[' in '", name, "'"));
    }
    out->emplace_back(name);
    return absl::OkStatus();
  }
  const size_t close = name.find(']', open);
  if (close == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("'[' without ']' in '", name, "'"));
  }
  const absl::string_view prefix = name.substr(0, open);
  const absl::string_view rest = name.substr(close + 1);
  for (absl::string_view item :
       absl::StrSplit(name.substr(open + 1, close - open - 1), ',')) {
    std::vector<absl::string_view> bounds = absl::StrSplit(item, '-');
    uint64_t low = 0, high = 0;
    if (bounds.size() > 2 || bounds[0].empty() ||
        !absl::SimpleAtoi(bounds[0], &low) ||
        !absl::SimpleAtoi(bounds.back(), &high) || high < low ||
        high - low > 100000) {
      return absl::InvalidArgumentError(
          absl::StrCat("bad range '", item, "' in '", name, "'"));
    }
    const size_t width = bounds[0].size();
    for (uint64_t i = low; i <= high; ++i) {
      std::string number = std::to_string(i);
      if (number.size() < width) number.insert(0, width - number.size(), '0');
      if (auto s = ExpandName(absl::StrCat(prefix, number, rest), out);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int> ReadCount(
    const std::function<const char*(const char*)>& getenv, const char* name) {
  std::optional<std::string> text = Read(getenv, name);
  int value = -1;
  if (!text || !absl::SimpleAtoi(*text, &value) || value < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(name, ": expected a non-negative integer, got '",
                     text.value_or(""), "'"));
  }
  return value;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ExpandHostlist(
    const std::string& hostlist) {
  std::vector<std::string> hosts;
  // Commas inside brackets separate ranges, outside them names.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= hostlist.size(); ++i) {
    if (i < hostlist.size() && hostlist[i] == '[') ++depth;
    if (i < hostlist.size() && hostlist[i] == ']') --depth;
    if (i == hostlist.size() || (hostlist[i] == ',' && depth == 0)) {
      absl::string_view name = absl::StripAsciiWhitespace(
          absl::string_view(hostlist).substr(start, i - start));
      if (name.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("empty name in hostlist '", hostlist, "'"));
      }
      if (auto s = ExpandName(name, &hosts); !s.ok()) return s;
      start = i + 1;
    }
  }
  return hosts;
}

absl::StatusOr<RoleAssignment> ApplyLauncherEnvironment(
    JobConfig& config, const std::function<const char*(const char*)>& getenv) {
  const bool mpi = Read(getenv, "OMPI_COMM_WORLD_RANK").has_value();
  const bool slurm = Read(getenv, "SLURM_PROCID").has_value();
  if (!mpi && !slurm) return RoleAssignment{};
  const char* rank_var = mpi ? "OMPI_COMM_WORLD_RANK" : "SLURM_PROCID";
  const char* size_var = mpi ? "OMPI_COMM_WORLD_SIZE" : "SLURM_NTASKS";
  absl::StatusOr<int> rank = ReadCount(getenv, rank_var);
  if (!rank.ok()) return rank.status();
  absl::StatusOr<int> size = ReadCount(getenv, size_var);
  if (!size.ok()) return size.status();
  if (!config.cluster.ps_endpoints.empty()) {
    return absl::InvalidArgumentError(
        "cluster.ps_endpoints: a job started by mpirun or srun finds its "
        "servers at the rendezvous (cluster.rendezvous); leave the list out");
  }
  const int servers = config.cluster.servers;
  const int workers = config.num_workers();
  if (*size != servers + workers) {
    return absl::InvalidArgumentError(absl::StrCat(
        size_var, " is ", *size, ", not cluster.servers + cluster.workers (",
        servers, " + ", workers, ")"));
  }
  if (*rank >= *size) {
    return absl::InvalidArgumentError(
        absl::StrCat(rank_var, ": ", *rank, " is not below ", *size));
  }
  JobConfig updated = config;
  if (updated.cluster.rendezvous.empty()) {
    std::string host;
    if (mpi) {
      absl::StatusOr<int> local =
          ReadCount(getenv, "OMPI_COMM_WORLD_LOCAL_SIZE");
      if (!local.ok() || *local != *size) {
        return absl::InvalidArgumentError(
            "cluster.rendezvous: mpirun across machines needs server 0's "
            "host:port (rank 0's machine), e.g. --set "
            "cluster.rendezvous=node01:7100");
      }
      host = "127.0.0.1";
    } else {
      std::optional<std::string> nodes = Read(getenv, "SLURM_JOB_NODELIST");
      if (!nodes) {
        return absl::InvalidArgumentError(
            "SLURM_JOB_NODELIST: unset; it names the rendezvous host (or set "
            "cluster.rendezvous)");
      }
      absl::StatusOr<std::vector<std::string>> hosts = ExpandHostlist(*nodes);
      if (!hosts.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("SLURM_JOB_NODELIST: ", hosts.status().message()));
      }
      host = hosts->front();
    }
    updated.cluster.rendezvous =
        absl::StrCat(host, ":", kDefaultRendezvousPort);
  }
  config = std::move(updated);
  return *rank < servers
             ? RoleAssignment{RoleAssignment::kServer, *rank}
             : RoleAssignment{RoleAssignment::kWorker, *rank - servers};
}

}  // namespace hetps
