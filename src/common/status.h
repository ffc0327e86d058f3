// absl::Status <-> grpc::Status. Codes map one to one (both follow the
// canonical google.rpc codes), so a caller sees the same code the server chose.
#pragma once

#include <grpcpp/support/status.h>

#include "absl/status/status.h"

namespace hetps {

grpc::Status ToGrpcStatus(const absl::Status& status);
absl::Status FromGrpcStatus(const grpc::Status& status);

}  // namespace hetps
