// Paddle-style environment -> JobConfig and role (see environment.h).

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

}  // namespace hetps
