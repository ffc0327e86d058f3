// The one way hetps opens a gRPC channel to a peer, and the one way a server
// listens: both sides take the job's Credentials (hetps/config.h), so every
// call of every component is secured the same way.
//
// Security, when configured (README.md, "Authentication and TLS"):
// - TLS when credentials.ca_pem is set: servers present cert_pem/key_pem,
//   clients verify them against ca_pem; with require_client_cert servers also
//   refuse a client that does not present a certificate signed by ca_pem
//   (clients present client_cert_pem/client_key_pem).
// - A token when credentials.token is set: clients send
//   `authorization: Bearer <token>` on every call; servers refuse a call
//   without it (UNAUTHENTICATED, "missing token") or with another one
//   (UNAUTHENTICATED, "wrong token") before any handler runs, so a refused
//   call changes nothing. Messages never quote a token.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/tensor_calls.h"
#include "hetps.grpc.pb.h"
#include "hetps/config.h"

namespace hetps {

// The metadata key that carries the token ("Bearer <token>").
inline constexpr char kAuthorizationHeader[] = "authorization";

// A channel to `endpoint` ("host:port") secured as `credentials` say, with
// send and receive limits of `max_message_bytes` (a 1M-key request exceeds
// gRPC's 4 MB default), its own connection (not shared with other channels
// of this process), and reconnect back-off capped at 1 s so that a server
// which comes up late is found within the caller's own retry loop.
// `credentials` is copied.
std::shared_ptr<grpc::Channel> MakeChannel(const std::string& endpoint,
                                           uint64_t max_message_bytes,
                                           const Credentials& credentials);

// Stubs by endpoint: the seam between hetps and gRPC. PsClient and the
// coordinator take these factories; the real ones open a MakeChannel each,
// tests hand in stubs that fail, drop or delay calls
// (tests/support/faulty_stub.h) or gmock ones (hetps_mock.grpc.pb.h).
using ParameterServerStubs =
    std::function<std::unique_ptr<rpc::ParameterServer::StubInterface>(
        const std::string& endpoint)>;
using CoordinatorStubs =
    std::function<std::unique_ptr<rpc::Coordinator::StubInterface>(
        const std::string& endpoint)>;
ParameterServerStubs GrpcParameterServerStubs(uint64_t max_message_bytes,
                                              const Credentials& credentials);

// PsClient's ways to one server, over one channel: the generated stub for
// every call but the two that carry tensors, which go through `tensors`
// (common/tensor_calls.h).
struct PsClientStub {
  std::unique_ptr<rpc::ParameterServer::StubInterface> stub;
  std::unique_ptr<TensorCalls> tensors;
};
using PsClientStubs = std::function<PsClientStub(const std::string& endpoint)>;
PsClientStubs GrpcPsClientStubs(uint64_t max_message_bytes,
                                const Credentials& credentials);
CoordinatorStubs GrpcCoordinatorStubs(uint64_t max_message_bytes,
                                      const Credentials& credentials);

// Server-side counterpart: listens on `listen_address` secured as
// `credentials` say, sets the message limits, and disables SO_REUSEPORT so
// that two processes can never share a port by accident. `*port` receives
// the bound port when the server starts (0: it could not listen, e.g. a
// malformed certificate or key). `credentials` is copied.
void ConfigureServerBuilder(grpc::ServerBuilder& builder,
                            const std::string& listen_address,
                            uint64_t max_message_bytes,
                            const Credentials& credentials, int* port);

}  // namespace hetps
