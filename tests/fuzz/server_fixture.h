// What the request fuzz targets share: a small PsServer built fresh for each
// input (so every input runs against the same state and a crash reproduces
// from its input alone), and the steering that lets random bytes get past
// the first checks to the deep validation.
//
// The server is rank 0 of 2 in async mode (pushes apply at once, pulls never
// wait), 2 workers, at most kMaxKeys keys per request, tables
//   "emb"   sparse, dim kSparseDim, sgd, uniform init
//   "dense" dense, dim kDenseDim (this server holds the first half), sgd.
#pragma once

#include <grpcpp/support/byte_buffer.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <vector>

#include "hetps.pb.h"
#include "hetps/config.h"
#include "server/ps_server.h"

namespace hetps::fuzz {

inline constexpr uint32_t kSparseDim = 4;
inline constexpr uint64_t kDenseDim = 6;
inline constexpr uint32_t kMaxKeys = 64;
inline constexpr uint32_t kWorkers = 2;

// Turns off spdlog and protobuf logging (refused requests and invalid UTF-8
// would print thousands of lines a second). Call first in every input.
void Quiet();

JobConfig FuzzJob();
std::unique_ptr<PsServer> MakeServer();

// The dense table's values, to check that a refused request changed nothing.
std::vector<float> DenseValues(const PsServer& server);

// Steering bits, the first byte of a request target's input.
inline constexpr uint8_t kFixVersion = 1;  // the right protocol_version
inline constexpr uint8_t kFixWorker = 2;   // worker_id < kWorkers, batch >= 1
inline constexpr uint8_t kFixTables = 4;   // existing tables, their dims

// `bytes` in gRPC buffers of `size` bytes each (the last shorter), as a
// peer's message may arrive.
grpc::ByteBuffer InBuffers(std::string_view bytes, size_t size);
// The buffer size a steering byte asks for: 1 to 31 bytes (its high bits),
// or 0 there for all `bytes` in one.
size_t BufferSize(uint8_t steering, size_t bytes);

// Status codes a request handler may answer with (docs/PROTOCOL.md).
bool IsDocumentedCode(grpc::StatusCode code);

}  // namespace hetps::fuzz
