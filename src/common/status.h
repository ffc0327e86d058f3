// absl::Status <-> grpc::Status. Codes map one to one (both follow the
// canonical google.rpc codes), so a caller sees the same code the server chose.
#pragma once

#include <grpcpp/support/status.h>

#include <cstdint>

#include "absl/status/status.h"

namespace hetps {

grpc::Status ToGrpcStatus(const absl::Status& status);

// OK when a peer's `version` is ours (hetps/version.h); otherwise
// FAILED_PRECONDITION naming `what` (the request) and both versions.
absl::Status CheckProtocolVersion(uint32_t version, const char* what);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace hetps
