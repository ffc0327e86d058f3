// Free TCP ports for local clusters (launcher, tests, benchmarks).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hetps {

// `count` distinct ports on the IPv4 address `host` that were free a moment
// ago: all are bound at once (so they differ), then released for the servers
// to take. Another process could take one in between; the server that then
// fails to bind says so. INVALID_ARGUMENT for a host that is not an IPv4
// address, UNAVAILABLE when binding fails.
absl::StatusOr<std::vector<int>> PickFreePorts(const std::string& host,
                                               int count);

}  // namespace hetps
