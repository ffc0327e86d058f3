// Writes the seed corpus: valid inputs for each fuzz target, so fuzzing
// starts from requests and payloads the code accepts and mutates inward.
//   make_fuzz_seeds DIR    writes DIR/<target>/seed-<what>
// README ("Fuzzing") says how to refresh tests/fuzz/corpus with it.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "common/bytes.h"
#include "compress/codec.h"
#include "hetps/version.h"
#include "server_fixture.h"
#include "shard/shard_map.h"

namespace hetps::fuzz {
namespace {

namespace fs = std::filesystem;

const CodecKind kKinds[] = {CodecKind::kNone,       CodecKind::kFp16,
                            CodecKind::kInt8,       CodecKind::kSparseFp32,
                            CodecKind::kSparseFp16, CodecKind::kSparseInt8};

void Write(const fs::path& dir, const std::string& name,
           const std::string& bytes) {
  fs::create_directories(dir);
  std::ofstream(dir / ("seed-" + name), std::ios::binary) << bytes;
}

std::string Le16(uint32_t v) {
  return {static_cast<char>(v & 0xff), static_cast<char>((v >> 8) & 0xff)};
}

// A gradient with zeros, small and large magnitudes, so every codec path
// (sparse selection, fp16 clamping and subnormals, int8 blocks) is seeded.
std::vector<float> Gradient(size_t n) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    switch (i % 6) {
      case 0:
        g[i] = 0;
        break;
      case 1:
        g[i] = 0.25f * static_cast<float>(i);
        break;
      case 2:
        g[i] = -1e-6f;
        break;
      case 3:
        g[i] = 7e4f;
        break;
      case 4:
        g[i] = -3.5f;
        break;
      default:
        g[i] = 0;
        break;
    }
  }
  return g;
}

// Keys this server (rank 0 of 2) owns, so pushes and pulls get accepted.
std::vector<uint64_t> OwnedKeys(size_t n) {
  const JobConfig job = FuzzJob();
  const ShardMap map = ShardMap::Uniform(2, job.server.num_buckets);
  std::vector<uint64_t> keys;
  for (uint64_t k = 1; keys.size() < n; ++k) {
    if (map.ServerOf(k * 7919) == 0) keys.push_back(k * 7919);
  }
  return keys;
}

void CodecSeeds(const fs::path& dir) {
  for (CodecKind kind : kKinds) {
    const std::string name = CodecName(kind);
    for (uint32_t block : {0u, 3u}) {
      if (block != 0 && kind != CodecKind::kInt8 &&
          kind != CodecKind::kSparseInt8) {
        continue;
      }
      const CodecSpec spec{.kind = kind, .int8_block = block};
      const std::string b = block ? "-block" + std::to_string(block) : "";
      for (uint32_t n : {0u, 7u, 300u}) {
        std::string payload;
        EncodeDense(spec, Gradient(n), &payload);
        // Shape from the header, and the same shape in the prefix.
        Write(dir, "dense-" + name + b + "-" + std::to_string(n),
              std::string("\x01\x01", 2) + Le16(n) + Le16(0xffff) + payload);
        Write(dir, "dense-prefix-" + name + b + "-" + std::to_string(n),
              std::string("\x00\x01", 2) + Le16(n) + Le16(0xffff) + payload);
      }
      for (uint32_t dim : {1u, 4u}) {
        for (size_t rows : {0u, 5u}) {
          std::vector<float> values = Gradient(rows * dim);
          std::string payload;
          EncodeRows(spec, dim, OwnedKeys(rows), values, &payload);
          const std::string what = name + b + "-dim" + std::to_string(dim) +
                                   "-" + std::to_string(rows);
          Write(dir, "rows-" + what,
                std::string("\x01") + static_cast<char>(dim) + Le16(0) +
                    Le16(0xffff) + payload);
          Write(dir, "rows-prefix-" + what,
                std::string("\x00") + static_cast<char>(dim) + Le16(0) +
                    Le16(static_cast<uint32_t>(rows)) + payload);
        }
      }
    }
  }
}

std::string WithFlags(uint8_t flags, const google::protobuf::Message& m) {
  return std::string(1, static_cast<char>(flags)) + m.SerializeAsString();
}

void PushSeeds(const fs::path& dir) {
  const std::vector<uint64_t> keys = OwnedKeys(5);
  auto base = [] {
    rpc::PushRequest req;
    req.set_protocol_version(kProtocolVersion);
    req.set_worker_id(1);
    req.set_clock(3);
    req.set_batch_size(32);
    return req;
  };
  auto add_raw_sparse = [&](rpc::PushRequest* req) {
    rpc::TableGradient* g = req->add_gradients();
    g->set_table("emb");
    g->set_dim(kSparseDim);
    AssignBytes<uint64_t>(g->mutable_keys(), keys);
    AssignBytes<float>(g->mutable_values(), Gradient(keys.size() * kSparseDim));
  };
  auto add_raw_dense = [&](rpc::PushRequest* req) {
    rpc::TableGradient* g = req->add_gradients();
    g->set_table("dense");
    g->set_dim(kDenseDim);
    AssignBytes<float>(g->mutable_values(), Gradient(kDenseDim / 2));
  };
  rpc::PushRequest sparse = base();
  add_raw_sparse(&sparse);
  rpc::PushRequest dense = base();
  add_raw_dense(&dense);
  rpc::PushRequest both = base();
  add_raw_sparse(&both);
  add_raw_dense(&both);
  for (uint8_t flags : {0, 7}) {
    const std::string f = "-flags" + std::to_string(flags);
    Write(dir, "raw-sparse" + f, WithFlags(flags, sparse));
    Write(dir, "raw-dense" + f, WithFlags(flags, dense));
    Write(dir, "raw-both" + f, WithFlags(flags, both));
  }
  for (CodecKind kind : kKinds) {
    if (kind == CodecKind::kNone) continue;  // codec 0 on the wire means raw
    const CodecSpec spec{.kind = kind};
    rpc::PushRequest req = base();
    rpc::TableGradient* g = req.add_gradients();
    g->set_table("emb");
    g->set_dim(kSparseDim);
    g->set_codec(static_cast<uint32_t>(kind));
    EncodeRows(spec, kSparseDim, keys, Gradient(keys.size() * kSparseDim),
               g->mutable_values());
    g = req.add_gradients();
    g->set_table("dense");
    g->set_dim(kDenseDim);
    g->set_codec(static_cast<uint32_t>(kind));
    EncodeDense(spec, Gradient(kDenseDim / 2), g->mutable_values());
    Write(dir, std::string("codec-") + CodecName(kind), WithFlags(7, req));
  }
}

void PullSeeds(const fs::path& dir) {
  rpc::PullSparseRequest sparse;
  sparse.set_protocol_version(kProtocolVersion);
  sparse.set_table("emb");
  sparse.set_dim(kSparseDim);
  sparse.set_worker_id(1);
  sparse.set_clock(2);
  std::vector<uint64_t> keys = OwnedKeys(6);
  keys.push_back(keys.front());  // duplicates are allowed in pulls
  AssignBytes<uint64_t>(sparse.mutable_keys(), keys);
  rpc::PullDenseRequest dense;
  dense.set_protocol_version(kProtocolVersion);
  dense.set_table("dense");
  dense.set_size(kDenseDim);
  dense.set_worker_id(0);
  dense.set_clock(2);
  for (uint8_t flags : {0, 7}) {
    const std::string f = "-flags" + std::to_string(flags);
    Write(dir, "sparse" + f, WithFlags(flags, sparse));
    Write(dir, "dense" + f, WithFlags(flags | 8, dense));
  }
}

// Frames as a client sends them (a push, a pull) and as a server answers
// (rows, an error), whole and in buffers of 3 bytes.
void FrameSeeds(const fs::path& dir) {
  rpc::PushRequest push;
  push.set_protocol_version(kProtocolVersion);
  push.set_worker_id(1);
  rpc::TableGradient* g = push.add_gradients();
  g->set_table("emb");
  g->set_dim(kSparseDim);
  const std::vector<uint64_t> keys = OwnedKeys(3);
  AssignBytes<uint64_t>(g->mutable_keys(), keys);
  AssignBytes<float>(g->mutable_values(), Gradient(keys.size() * kSparseDim));
  rpc::PullSparseRequest pull;
  pull.set_table("emb");
  pull.set_dim(kSparseDim);
  AssignBytes<uint64_t>(pull.mutable_keys(), keys);
  rpc::PullSparseResponse rows;
  AssignBytes<float>(rows.mutable_values(), Gradient(keys.size() * kSparseDim));
  rows.set_applied_rounds(4);

  std::vector<std::pair<std::string, rpc::TensorFrame>> frames(4);
  frames[0].first = "push";
  frames[0].second.set_id(1);
  frames[0].second.set_kind(rpc::TensorFrame::PUSH);
  frames[0].second.set_body(push.SerializeAsString());
  frames[1].first = "pull";
  frames[1].second.set_id(2);
  frames[1].second.set_kind(rpc::TensorFrame::PULL_SPARSE);
  frames[1].second.set_body(pull.SerializeAsString());
  frames[2].first = "rows";
  frames[2].second = frames[1].second;
  frames[2].second.set_body(rows.SerializeAsString());
  frames[3].first = "error";
  frames[3].second.set_id(3);
  frames[3].second.set_code(3);
  frames[3].second.set_error("push: the request is not a PushRequest");
  for (const auto& [name, frame] : frames) {
    for (uint8_t flags : {0, 3 << 3}) {
      Write(dir, name + "-flags" + std::to_string(flags),
            WithFlags(flags, frame));
    }
  }
}

}  // namespace
}  // namespace hetps::fuzz

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path dir = argv[1];
  hetps::fuzz::CodecSeeds(dir / "codec_fuzzer");
  hetps::fuzz::PushSeeds(dir / "push_fuzzer");
  hetps::fuzz::PullSeeds(dir / "pull_fuzzer");
  hetps::fuzz::FrameSeeds(dir / "frame_fuzzer");
  return 0;
}
