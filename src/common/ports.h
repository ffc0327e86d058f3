// Free TCP ports for local clusters (launcher, tests, benchmarks), and the
// local address that reaches another host (rendezvous).
#pragma once

#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace hetps {

// `count` distinct ports on the IPv4 address `host` that were free a moment
// ago: all are bound at once (so they differ), then released for the servers
// to take. They are drawn at random below the kernel's ephemeral range
// (net.ipv4.ip_local_port_range), which sockets bound to port 0 and
// outgoing connections take theirs from: otherwise any process on the
// machine could be handed one of them in between. Another launcher drawing
// the same port in that moment is still possible; the server that then
// fails to bind says so. Where the range leaves too little room below it,
// the kernel picks. INVALID_ARGUMENT for a host that is not an IPv4
// address, UNAVAILABLE when binding fails.
absl::StatusOr<std::vector<int>> PickFreePorts(const std::string& host,
                                               int count);

// The IPv4 address of this machine that packets to `endpoint` ("host:port",
// host a name or an address) leave from: what the other side can reach us
// at. Nothing is sent (a UDP socket is connected, not used). UNAVAILABLE
// naming the endpoint when the host does not resolve or has no route.
absl::StatusOr<std::string> LocalAddressToward(const std::string& endpoint);

}  // namespace hetps
