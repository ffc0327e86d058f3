// Fuzzes the server's push: ParsePush, which reads a push off the wire, and
// PsServer::Push, which validates and applies a worker's gradients: raw
// keys and values, and codec payloads for both table kinds.
//
// Input: one steering byte (server_fixture.h), then a serialized
// rpc::PushRequest. The bytes, in gRPC buffers cut where the steering byte
// says, are parsed by ParsePush and by protobuf: both must accept or both
// refuse, and agree on every field (ParsePush's values marked finite
// exactly when they are, when there are any). Every input that parses runs,
// steered, through ParsePush against a fresh server. Checked: the answer is one
// of the documented codes; a refused push applies nothing (no sparse row
// created, the dense slice unchanged, no round counted); an accepted one counts
// one round and creates no more rows than it carried keys.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/finite.h"
#include "common/tensor_calls.h"
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

std::string_view View(const grpc::Slice& slice) {
  return {reinterpret_cast<const char*>(slice.begin()), slice.size()};
}

// ParsePush's reading of `bytes` against protobuf's `parsed` (nullptr: it
// refused them).
void ExpectSameParse(std::string_view bytes, size_t buffer_size,
                     const rpc::PushRequest* parsed) {
  grpc::ByteBuffer buffer = InBuffers(bytes, buffer_size);
  ReceivedPush push;
  const grpc::Status status = ParsePush(&buffer, &push);
  FUZZ_CHECK(status.ok() == (parsed != nullptr));
  if (!status.ok()) {
    FUZZ_CHECK(status.error_code() == grpc::StatusCode::INVALID_ARGUMENT);
    return;
  }
  FUZZ_CHECK(push.gradients.size() ==
             static_cast<size_t>(parsed->gradients_size()));
  rpc::PushRequest whole = push.message;
  for (size_t i = 0; i < push.gradients.size(); ++i) {
    const ReceivedPush::Tensors& t = push.gradients[i];
    rpc::TableGradient* g = whole.mutable_gradients(static_cast<int>(i));
    FUZZ_CHECK(g->keys().empty() && g->values().empty());
    g->set_keys(std::string(View(t.keys)));
    g->set_values(std::string(View(t.values)));
    std::vector<float> values(t.values.size() / sizeof(float));
    if (!values.empty()) {
      std::memcpy(values.data(), t.values.begin(),
                  values.size() * sizeof(float));
    }
    // (A gradient without values was not checked: nothing to check.)
    if (!values.empty()) FUZZ_CHECK(t.finite == (FirstNonFinite(values) < 0));
    if (t.finite) FUZZ_CHECK(FirstNonFinite(values) < 0);
  }
  FUZZ_CHECK(whole.SerializeAsString() == parsed->SerializeAsString());
}

}  // namespace
}  // namespace hetps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetps;
  using namespace hetps::fuzz;
  Quiet();
  if (size < 1) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data + 1),
                               size - 1);
  const size_t buffer_size = BufferSize(data[0], bytes.size());
  rpc::PushRequest request;
  const bool parsed =
      request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()));
  ExpectSameParse(bytes, buffer_size, parsed ? &request : nullptr);
  if (!parsed) return 0;
  Steer(data[0], &request);

  std::unique_ptr<PsServer> server = MakeServer();
  const std::vector<float> dense_before = DenseValues(*server);
  grpc::ServerContext context;
  rpc::PushResponse response;
  grpc::ByteBuffer steered =
      InBuffers(request.SerializeAsString(), buffer_size);
  ReceivedPush push;
  FUZZ_CHECK(ParsePush(&steered, &push).ok());
  const grpc::Status status = server->Push(&context, push, &response);

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
