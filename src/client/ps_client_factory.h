// PsClientFactory: PsClient::Connect with its two seams exposed — the Clock
// its retries and back-off run on, and the stubs it reaches servers through
// — so that retries, back-off and dead peers are tested in process
// (tests/client/ps_client_test.cc), on a FakeClock and stubs that fail,
// drop or delay calls. PsClient::Connect is this with the real clock and
// gRPC stubs.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "common/channel.h"
#include "common/clock.h"
#include "hetps/ps_client.h"

namespace hetps {

class PsClientFactory {
 public:
  static absl::StatusOr<std::unique_ptr<PsClient>> Connect(
      const PsClientOptions& options, Clock& clock, PsClientStubs stubs);
};

}  // namespace hetps
