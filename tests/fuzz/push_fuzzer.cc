// Fuzzes PsServer::Push, the handler that validates and applies a worker's
// gradients: raw keys and values, and codec payloads for both table kinds.
//
// Input: one steering byte (server_fixture.h), then a serialized
// rpc::PushRequest. Every input runs against a fresh server. Checked: the
// answer is one of the documented codes; a refused push applies nothing
// (no sparse row created, the dense slice unchanged, no round counted); an
// accepted one counts one round and creates no more rows than it carried
// keys.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <cstring>

#include "fuzz_check.h"
#include "hetps/version.h"
#include "server_fixture.h"

namespace hetps::fuzz {
namespace {

// Gives every gradient a table that exists and that table's dim: a row-set
// payload or raw keys go to the sparse table, anything else to the dense.
void Steer(uint8_t flags, rpc::PushRequest* request) {
  if (flags & kFixVersion) request->set_protocol_version(kProtocolVersion);
  if (flags & kFixWorker) {
    request->set_worker_id(request->worker_id() % kWorkers);
    if (request->batch_size() == 0) request->set_batch_size(1);
  }
  if (!(flags & kFixTables)) return;
  for (rpc::TableGradient& g : *request->mutable_gradients()) {
    const bool rows = g.codec() != 0
                          ? g.values().size() > 3 && g.values()[3] == 1
                          : !g.keys().empty();
    g.set_table(rows ? "emb" : "dense");
    g.set_dim(rows ? kSparseDim : kDenseDim);
  }
}

// Most keys the request can create rows for: raw keys, and the row count of
// each codec payload's header.
uint64_t KeysCarried(const rpc::PushRequest& request) {
  uint64_t keys = 0;
  for (const rpc::TableGradient& g : request.gradients()) {
    keys += g.keys().size() / 8;
    if (g.codec() != 0 && g.values().size() >= 8) {
      uint32_t count;
      std::memcpy(&count, g.values().data() + 4, sizeof(count));
      keys += count;
    }
  }
  return keys;
}

}  // namespace
}  // namespace hetps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetps;
  using namespace hetps::fuzz;
  Quiet();
  if (size < 1) return 0;
  rpc::PushRequest request;
  if (!request.ParseFromArray(data + 1, static_cast<int>(size - 1))) return 0;
  Steer(data[0], &request);

  std::unique_ptr<PsServer> server = MakeServer();
  const std::vector<float> dense_before = DenseValues(*server);
  grpc::ServerContext context;
  rpc::PushResponse response;
  const grpc::Status status = server->Push(&context, &request, &response);

  FUZZ_CHECK(IsDocumentedCode(status.error_code()));
  const uint64_t rows = server->sparse_table("emb")->size();
  if (!status.ok()) {
    FUZZ_CHECK(!status.error_message().empty());
    FUZZ_CHECK(rows == 0);
    FUZZ_CHECK(DenseValues(*server) == dense_before);
    FUZZ_CHECK(server->applied_rounds() == 0);
    FUZZ_CHECK(response.applied_rounds() == 0);
    return 0;
  }
  FUZZ_CHECK(server->applied_rounds() == 1);
  FUZZ_CHECK(response.applied_rounds() == 1);
  FUZZ_CHECK(rows <= KeysCarried(request));
  return 0;
}
