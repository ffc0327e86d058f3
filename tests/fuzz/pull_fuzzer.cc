// Fuzzes PsServer::PullSparse and PsServer::PullDense.
//
// Input: one steering byte (server_fixture.h; bit 3 picks the request:
// clear = rpc::PullSparseRequest, set = rpc::PullDenseRequest), then the
// serialized request. Every input runs against a fresh server. Checked: the
// answer is one of the documented codes; a refused pull creates no rows and
// returns no values; an accepted one returns exactly keys × dim (sparse) or
// this server's slice (dense) finite values, and the same values when asked
// again.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <vector>

#include "fuzz_check.h"
#include "hetps/version.h"
#include "server_fixture.h"

namespace hetps::fuzz {
namespace {

constexpr uint8_t kDenseRequest = 8;

template <typename Request>
void SteerCommon(uint8_t flags, Request* request) {
  if (flags & kFixVersion) request->set_protocol_version(kProtocolVersion);
  if (flags & kFixWorker)
    request->set_worker_id(request->worker_id() % kWorkers);
}

std::vector<float> Floats(const std::string& bytes) {
  FUZZ_CHECK(bytes.size() % 4 == 0);
  std::vector<float> out(bytes.size() / 4);
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), bytes.size());
  return out;
}

void PullSparse(uint8_t flags, const uint8_t* data, size_t size) {
  rpc::PullSparseRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  SteerCommon(flags, &request);
  if (flags & kFixTables) {
    request.set_table("emb");
    request.set_dim(kSparseDim);
  }
  std::unique_ptr<PsServer> server = MakeServer();
  grpc::ServerContext context;
  PullSparseReply response;
  const grpc::Status status = AwaitPullAnswer(*server, &PsServer::PullSparse,
                                              &context, &request, &response);
  FUZZ_CHECK(IsDocumentedCode(status.error_code()));
  const uint64_t rows = server->sparse_table("emb")->size();
  if (!status.ok()) {
    FUZZ_CHECK(rows == 0);
    FUZZ_CHECK(response.rows.data.empty());
    return;
  }
  const uint64_t keys = request.keys().size() / 8;
  FUZZ_CHECK(request.keys().size() % 8 == 0);
  FUZZ_CHECK(keys <= kMaxKeys);
  FUZZ_CHECK(rows <= keys);
  const std::span<const float> values = response.rows.data;
  FUZZ_CHECK(values.size() == keys * kSparseDim);
  for (float v : values) FUZZ_CHECK(std::isfinite(v));
  PullSparseReply again;
  grpc::ServerContext context2;
  FUZZ_CHECK(AwaitPullAnswer(*server, &PsServer::PullSparse, &context2,
                             &request, &again)
                 .ok());
  FUZZ_CHECK(std::ranges::equal(again.rows.data, values));
  FUZZ_CHECK(server->sparse_table("emb")->size() == rows);
}

void PullDense(uint8_t flags, const uint8_t* data, size_t size) {
  rpc::PullDenseRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  SteerCommon(flags, &request);
  if (flags & kFixTables) {
    request.set_table("dense");
    request.set_size(kDenseDim);
  }
  std::unique_ptr<PsServer> server = MakeServer();
  grpc::ServerContext context;
  rpc::PullDenseResponse response;
  const grpc::Status status = AwaitPullAnswer(*server, &PsServer::PullDense,
                                              &context, &request, &response);
  FUZZ_CHECK(IsDocumentedCode(status.error_code()));
  if (!status.ok()) {
    FUZZ_CHECK(response.values().empty());
    return;
  }
  DenseTable* table = server->dense_table("dense");
  FUZZ_CHECK(response.offset() == table->offset());
  FUZZ_CHECK(Floats(response.values()) == DenseValues(*server));
  FUZZ_CHECK(table->length() == kDenseDim / 2);
}

}  // namespace
}  // namespace hetps::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetps::fuzz;
  Quiet();
  if (size < 1) return 0;
  if (data[0] & kDenseRequest) {
    PullDense(data[0], data + 1, size - 1);
  } else {
    PullSparse(data[0], data + 1, size - 1);
  }
  return 0;
}
