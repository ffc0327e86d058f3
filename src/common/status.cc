#include "common/status.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "hetps/version.h"

namespace hetps {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

absl::Status CheckProtocolVersion(uint32_t version, const char* what) {
  if (version == kProtocolVersion) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(what, ": protocol version mismatch: peer speaks ", version,
                   ", this node speaks ", kProtocolVersion,
                   "; run the same hetps version on every node"));
}

absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace hetps
