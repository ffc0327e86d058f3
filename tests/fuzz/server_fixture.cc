#include "server_fixture.h"

#include <google/protobuf/stubs/logging.h>

#include <algorithm>

#include "common/logging.h"
#include "fuzz_check.h"

namespace hetps::fuzz {

void Quiet() {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::off);
    google::protobuf::SetLogHandler([](google::protobuf::LogLevel, const char*,
                                       int, const std::string&) {});
    return true;
  }();
  (void)quiet;
}

grpc::ByteBuffer InBuffers(std::string_view bytes, size_t size) {
  std::vector<grpc::Slice> slices;
  for (size_t at = 0; at < bytes.size(); at += size) {
    slices.emplace_back(bytes.substr(at, size).data(),
                        std::min(size, bytes.size() - at));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

size_t BufferSize(uint8_t steering, size_t bytes) {
  return steering >> 3 == 0 ? bytes + 1 : steering >> 3;
}

JobConfig FuzzJob() {
  JobConfig config;
  config.mode = ConsistencyMode::kAsync;
  config.cluster.ps_endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  config.cluster.workers = kWorkers;
  config.server.max_keys_per_request = kMaxKeys;
  config.server.table_stripes = 4;
  TableConfig emb;
  emb.name = "emb";
  emb.kind = TableKind::kSparse;
  emb.dim = kSparseDim;
  emb.optimizer.type = "sgd";
  emb.optimizer.learning_rate = 0.5f;
  emb.init.type = "uniform";
  TableConfig dense = emb;
  dense.name = "dense";
  dense.kind = TableKind::kDense;
  dense.dim = kDenseDim;
  config.tables = {emb, dense};
  return config;
}

std::unique_ptr<PsServer> MakeServer() {
  auto server = PsServer::Create(FuzzJob(), 0);
  FUZZ_CHECK(server.ok());
  return std::move(*server);
}

std::vector<float> DenseValues(const PsServer& server) {
  DenseTable* table = server.dense_table("dense");
  FUZZ_CHECK(table != nullptr);
  std::vector<float> values(table->length());
  table->Pull(values);
  return values;
}

bool IsDocumentedCode(grpc::StatusCode code) {
  switch (code) {
    case grpc::StatusCode::OK:
    case grpc::StatusCode::FAILED_PRECONDITION:
    case grpc::StatusCode::NOT_FOUND:
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::RESOURCE_EXHAUSTED:
      return true;
    default:
      return false;
  }
}

}  // namespace hetps::fuzz
