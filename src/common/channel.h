// The one way hetps opens a gRPC channel to a peer.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

namespace hetps {

// An insecure channel to `endpoint` ("host:port") with send and receive
// limits of `max_message_bytes` (a 1M-key request exceeds gRPC's 4 MB
// default), its own connection (not shared with other channels of this
// process), and reconnect back-off capped at 1 s so that a server which comes
// up late is found within the caller's own retry loop.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           uint64_t max_message_bytes);

// Server-side counterpart: message limits, and no SO_REUSEPORT, so that two
// processes can never share a port by accident.
void ConfigureServerBuilder(grpc::ServerBuilder& builder,
                            uint64_t max_message_bytes);

}  // namespace hetps
