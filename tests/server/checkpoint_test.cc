// Checkpoints of one server: saved and restored exactly (weights, optimizer
// state, update counts, dense slices, the coordinator's data progress);
// a corrupt, truncated or unfinished checkpoint is refused naming the file
// and the one before it loads; old ones are pruned; export for serving.
#include "server/checkpoint.h"

#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <functional>
#include <optional>
#include <thread>

#include "hetps/version.h"
#include "nlohmann/json.hpp"
#include "server/ps_server.h"
#include "support/test_support.h"

namespace hetps {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using testing::TempDir;

JobConfig CheckpointJob(const std::string& dir) {
  JobConfig config;
  config.mode = ConsistencyMode::kAsync;
  config.cluster.ps_endpoints = {"127.0.0.1:1"};
  config.cluster.workers = 1;
  config.checkpoint.dir = dir;
  config.checkpoint.keep = 5;
  TableConfig emb;
  emb.name = "emb";
  emb.kind = TableKind::kSparse;
  emb.dim = 3;
  emb.optimizer.type = "adagrad";
  emb.optimizer.learning_rate = 0.1f;
  emb.init.type = "uniform";
  TableConfig dense = emb;
  dense.name = "dense";
  dense.kind = TableKind::kDense;
  dense.dim = 5;
  dense.optimizer.type = "adam";
  config.tables = {emb, dense};
  return config;
}

// One deterministic update of both tables; `step` varies the gradients.
void Train(PsServer& ps, int step) {
  std::vector<uint64_t> keys;
  std::vector<float> grads;
  for (uint64_t k = 0; k < 50; ++k) {
    keys.push_back(k * 7919 + static_cast<uint64_t>(step % 3));
    for (int c = 0; c < 3; ++c) grads.push_back(0.01f * (c + 1) * (step + 1));
  }
  ps.sparse_table("emb")->Push(keys, grads);
  std::vector<float> dense(5);
  for (int i = 0; i < 5; ++i) dense[i] = 0.1f * (i - 2) + 0.01f * step;
  ps.dense_table("dense")->Push(dense);
}

struct Row {
  std::vector<float> weights, state;
  uint64_t updates;
  bool operator==(const Row&) const = default;
};

// Everything a server holds, for exact comparison.
struct Contents {
  std::map<uint64_t, Row> rows;
  DenseTable::Snapshot dense;
  bool operator==(const Contents& o) const {
    return rows == o.rows && dense.weights == o.dense.weights &&
           dense.state == o.dense.state && dense.updates == o.dense.updates;
  }
};

Contents Read(PsServer& ps) {
  Contents c;
  ps.sparse_table("emb")->ForEachRowWithState(
      [&](uint64_t key, std::span<const float> w, std::span<const float> s,
          uint64_t updates) {
        c.rows[key] = {{w.begin(), w.end()}, {s.begin(), s.end()}, updates};
      });
  c.dense = ps.dense_table("dense")->Save();
  return c;
}

std::unique_ptr<PsServer> NewServer(const JobConfig& config) {
  auto ps = PsServer::Create(config, 0);
  EXPECT_TRUE(ps.ok()) << ps.status();
  return std::move(*ps);
}

// Restores a fresh server from `config.checkpoint.dir`; its contents.
absl::StatusOr<Contents> Resume(JobConfig config) {
  config.checkpoint.resume = true;
  auto ps = NewServer(config);
  Checkpointer checkpointer(config, 0, ps.get());
  if (absl::Status s = checkpointer.Restore(); !s.ok()) return s;
  return Read(*ps);
}

class CheckpointTest : public ::testing::Test {
 protected:
  // Two checkpoints: after 3 and after 6 updates of each table.
  void SetUp() override {
    config_ = CheckpointJob(dir_.path());
    auto ps = NewServer(config_);
    Checkpointer checkpointer(config_, 0, ps.get());
    for (int step = 0; step < 3; ++step) Train(*ps, step);
    auto first = checkpointer.Save();
    ASSERT_TRUE(first.ok()) << first.status();
    first_ = *first;
    at_first_ = Read(*ps);
    for (int step = 3; step < 6; ++step) Train(*ps, step);
    auto second = checkpointer.Save();
    ASSERT_TRUE(second.ok()) << second.status();
    second_ = *second;
    at_second_ = Read(*ps);
    ASSERT_NE(at_first_.dense.weights, at_second_.dense.weights);
  }

  std::string FileOf(const std::string& ckpt, const std::string& name) {
    return (fs::path(ckpt) / name).string();
  }

  TempDir dir_;
  JobConfig config_;
  std::string first_, second_;
  Contents at_first_, at_second_;
};

TEST_F(CheckpointTest, RestoresWeightsStateAndCountsExactly) {
  EXPECT_THAT(first_, HasSubstr("server-0/ckpt-00000001"));
  EXPECT_THAT(second_, HasSubstr("server-0/ckpt-00000002"));
  EXPECT_FALSE(fs::exists(second_ + ".tmp"));
  auto restored = Resume(config_);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_EQ(restored->rows.size(), 150u);
  EXPECT_TRUE(*restored == at_second_);
  EXPECT_EQ(restored->dense.updates, 6u);

  // Training on from the restored state gives what training on without the
  // restart gives: the optimizer state came back too.
  auto original = NewServer(config_);
  for (int step = 0; step < 8; ++step) Train(*original, step);
  JobConfig resume = config_;
  resume.checkpoint.resume = true;
  auto resumed = NewServer(resume);
  Checkpointer checkpointer(resume, 0, resumed.get());
  ASSERT_TRUE(checkpointer.Restore().ok());
  for (int step = 6; step < 8; ++step) Train(*resumed, step);
  EXPECT_TRUE(Read(*resumed) == Read(*original));
}

TEST_F(CheckpointTest, FlippedByteIsRefusedNamingTheFileAndThePreviousLoads) {
  const std::string file = FileOf(second_, "table-emb.sparse");
  {
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    char c;
    f.seekg(100);
    f.get(c);
    f.seekp(100);
    f.put(static_cast<char>(c ^ 0x10));
  }
  auto verified = VerifyCheckpoint(second_);
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.status().message(), HasSubstr(file));
  EXPECT_THAT(verified.status().message(), HasSubstr("checksum"));
  std::vector<std::string> refused;
  auto newest = NewestCheckpoint(ServerCheckpointDir(dir_.path(), 0), &refused);
  ASSERT_TRUE(newest.ok()) << newest.status();
  EXPECT_EQ(newest->path, first_);
  ASSERT_EQ(refused.size(), 1u);
  EXPECT_THAT(refused[0], HasSubstr(file));
  auto restored = Resume(config_);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == at_first_);
}

TEST_F(CheckpointTest, TruncatedFileIsRefusedNamingTheFile) {
  const std::string file = FileOf(second_, "table-dense.dense");
  fs::resize_file(file, fs::file_size(file) - 4);
  auto verified = VerifyCheckpoint(second_);
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.status().message(), HasSubstr(file));
  EXPECT_THAT(verified.status().message(), HasSubstr("truncated"));
  auto restored = Resume(config_);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == at_first_);
}

TEST_F(CheckpointTest, MissingManifestIsRefusedAsUnfinished) {
  const std::string manifest = FileOf(second_, kManifestName);
  fs::remove(manifest);
  auto verified = VerifyCheckpoint(second_);
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.status().message(), HasSubstr(manifest));
  EXPECT_THAT(verified.status().message(), HasSubstr("not finished"));
  auto restored = Resume(config_);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(*restored == at_first_);
}

// A manifest that is valid JSON but holds a wrong type anywhere restore or
// export reads is refused as corrupt (DATA_LOSS naming it), never thrown,
// and the checkpoint before it loads.
TEST_F(CheckpointTest, ManifestWithWrongTypesIsRefusedAsCorrupt) {
  const std::string manifest = FileOf(second_, kManifestName);
  std::string original;
  {
    std::ifstream in(manifest);
    original.assign(std::istreambuf_iterator<char>(in), {});
  }
  const nlohmann::json good = nlohmann::json::parse(original);
  const std::vector<
      std::pair<std::string, std::function<void(nlohmann::json&)>>>
      breakages = {
          {"'seq'", [](auto& m) { m["seq"] = "seven"; }},
          {"'rank'", [](auto& m) { m["rank"] = -1; }},
          {"'num_servers'", [](auto& m) { m["num_servers"] = nullptr; }},
          {"'job'", [](auto& m) { m["job"] = 3; }},
          {"'files'", [](auto& m) { m["files"] = "all of them"; }},
          {"'files' entry", [](auto& m) { m["files"][0]["bytes"] = "many"; }},
          {"'files' entry", [](auto& m) { m["files"][0]["name"] = 12; }},
          {"'tables'", [](auto& m) { m.erase("tables"); }},
          {"'tables' entry", [](auto& m) { m["tables"][0]["dim"] = 3.5; }},
          {"'state_width'",
           [](auto& m) { m["tables"][0]["state_width"] = "wide"; }},
      };
  for (const auto& [field, breakage] : breakages) {
    SCOPED_TRACE(field);
    nlohmann::json broken = good;
    breakage(broken);
    std::ofstream(manifest, std::ios::trunc) << broken.dump();
    auto verified = VerifyCheckpoint(second_);
    EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(verified.status().message(), HasSubstr(manifest));
    EXPECT_THAT(verified.status().message(), HasSubstr(field));
    auto restored = Resume(config_);
    ASSERT_TRUE(restored.ok()) << restored.status();
    EXPECT_TRUE(*restored == at_first_);
  }
}

TEST_F(CheckpointTest, NoCheckpointThatVerifiesStopsTheServer) {
  fs::remove(FileOf(first_, kManifestName));
  fs::remove(FileOf(second_, "table-emb.sparse"));
  auto restored = Resume(config_);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(restored.status().message(), HasSubstr("none of its 2"));
}

TEST_F(CheckpointTest, CheckpointOfAnotherTableShapeIsRefused) {
  JobConfig other = config_;
  other.tables[0].dim = 4;
  auto restored = Resume(other);
  EXPECT_EQ(restored.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(restored.status().message(), HasSubstr("table 'emb'"));
}

TEST_F(CheckpointTest, OnlyTheNewestKeepArePruned) {
  JobConfig config = config_;
  config.checkpoint.keep = 2;
  auto ps = NewServer(config);
  Checkpointer checkpointer(config, 0, ps.get());
  auto third = checkpointer.Save();
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_THAT(*third, HasSubstr("ckpt-00000003"));
  EXPECT_FALSE(fs::exists(first_));
  EXPECT_TRUE(fs::exists(second_));
  EXPECT_TRUE(fs::exists(*third));
}

TEST_F(CheckpointTest, ResumeWithoutAnyCheckpointStartsFresh) {
  TempDir empty;
  JobConfig config = CheckpointJob(empty.path());
  auto restored = Resume(config);
  ASSERT_TRUE(restored.ok()) << restored.status();
  EXPECT_TRUE(restored->rows.empty());
  EXPECT_EQ(restored->dense.updates, 0u);
}

TEST_F(CheckpointTest, ExportWritesSortedRowsAndTheDenseArray) {
  TempDir out;
  auto model = ExportModel(dir_.path(), out.path());
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)["format"], "hetps-model-1");
  ASSERT_EQ((*model)["tables"].size(), 2u);
  EXPECT_EQ((*model)["tables"][0]["rows"], 150);
  std::ifstream rows(fs::path(out.path()) / "emb.rows", std::ios::binary);
  uint64_t previous = 0;
  for (size_t i = 0; i < 150; ++i) {
    uint64_t key;
    float w[3];
    ASSERT_TRUE(rows.read(reinterpret_cast<char*>(&key), 8));
    ASSERT_TRUE(rows.read(reinterpret_cast<char*>(w), sizeof(w)));
    if (i > 0) {
      EXPECT_GT(key, previous);
    }
    previous = key;
    const Row& want = at_second_.rows.at(key);
    EXPECT_EQ(std::vector<float>(w, w + 3), want.weights);
  }
  EXPECT_EQ(rows.peek(), EOF);
  std::ifstream dense(fs::path(out.path()) / "dense.dense", std::ios::binary);
  std::vector<float> values(5);
  ASSERT_TRUE(dense.read(reinterpret_cast<char*>(values.data()), 20));
  EXPECT_EQ(values, at_second_.dense.weights);
}

// Rank 0 keeps the coordinator's data progress beside its tables: what the
// save hook gives is what the restore hook gets back.
TEST(CheckpointProgressTest, ProgressHooksRoundTrip) {
  TempDir dir;
  JobConfig config = CheckpointJob(dir.path());
  rpc::JobProgress saved;
  saved.set_chunks_given(3);
  saved.set_finished_chunks(1);
  saved.set_finished_samples(10);
  saved.add_pending()->set_chunk(2);
  auto ps = NewServer(config);
  Checkpointer checkpointer(
      config, 0, ps.get(), {.save = [&] { return saved; }, .restore = nullptr});
  ASSERT_TRUE(checkpointer.Save().ok());

  config.checkpoint.resume = true;
  auto restarted_ps = NewServer(config);
  std::optional<rpc::JobProgress> restored;
  Checkpointer restore(
      config, 0, restarted_ps.get(),
      {.save = nullptr,
       .restore = [&](const rpc::JobProgress& p) { restored = p; }});
  ASSERT_TRUE(restore.Restore().ok());
  ASSERT_TRUE(restored.has_value());
  EXPECT_EQ(restored->SerializeAsString(), saved.SerializeAsString());
}

// Bucket moves (checkpoint.h, "Bucket moves"): a save on a server that a
// move involves waits until the move has settled; the rows moved to a
// server are written down as a move record; a resume gives each bucket to
// the server holding its newest rows and restores them there only; export
// takes each row once, from there.
// Between saves, a bucket that moves here again and again leaves one record,
// not one per move: a record each of whose buckets a newer record holds is
// deleted when the newer one is written; restores read the same rows.
TEST(CheckpointMovesTest, RecordsEveryBucketOfWhichIsInANewerOneAreDeleted) {
  TempDir dir;
  JobConfig config = CheckpointJob(dir.path());
  config.cluster.ps_endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  auto server = PsServer::Create(config, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  Checkpointer checkpointer(config, 1, server->get());
  const std::string server_dir = ServerCheckpointDir(dir.path(), 1);
  // Records of buckets (no rows needed), at map versions 2, 3, ...
  uint64_t version = 1;
  const auto record = [&](std::vector<uint32_t> buckets) {
    ++version;
    rpc::MovedRows rows;
    for (uint32_t b : buckets) rows.add_buckets(b);
    ASSERT_TRUE(checkpointer.RecordMovedIn(rows, version).ok());
  };
  const auto kept = [&] {
    std::vector<std::pair<uint64_t, std::vector<uint32_t>>> out;
    auto durable = ReadDurableRows(server_dir, /*verify_files=*/true, nullptr);
    EXPECT_TRUE(durable.ok()) << durable.status();
    if (!durable.ok()) return out;
    for (const VerifiedCheckpoint& r : durable->moved_in) {
      out.emplace_back(r.manifest["map_version"].get<uint64_t>(),
                       r.manifest["buckets"].get<std::vector<uint32_t>>());
    }
    return out;
  };
  using Kept = std::vector<std::pair<uint64_t, std::vector<uint32_t>>>;
  record({1, 2});  // v2
  record({2});     // v3: bucket 1 is only in v2's record, which stays
  EXPECT_EQ(kept(), (Kept{{2, {1, 2}}, {3, {2}}}));
  record({1});  // v4: v2's buckets are all in newer records now
  EXPECT_EQ(kept(), (Kept{{3, {2}}, {4, {1}}}));
  record({5, 2});  // v5 covers v3 (bucket 2); v4 holds bucket 1
  EXPECT_EQ(kept(), (Kept{{4, {1}}, {5, {5, 2}}}));
  for (int i = 0; i < 20; ++i) record({1});
  EXPECT_EQ(kept(), (Kept{{5, {5, 2}}, {25, {1}}}))
      << "twenty moves of bucket 1 leave its newest record only";
}

// A save runs beside TakeOvers: while it tidies the move records up, a
// record being written (a .tmp) is not one a crash left, and stays.
TEST(CheckpointMovesTest, RecordsWrittenWhileSavesRunAreAllKept) {
  TempDir dir;
  JobConfig config = CheckpointJob(dir.path());
  config.cluster.ps_endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  auto server = PsServer::Create(config, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  Checkpointer checkpointer(config, 1, server->get());
  std::atomic<bool> recording{true};
  std::atomic<int> saves{0};
  std::thread saver([&] {
    while (recording.load()) {
      ASSERT_TRUE(checkpointer.Save().ok());
      ++saves;
    }
  });
  // Each record holds a bucket of its own, so none covers another.
  constexpr uint32_t kRecords = 200;
  for (uint32_t b = 0; b < kRecords; ++b) {
    rpc::MovedRows rows;
    rows.add_buckets(b);
    absl::Status s = checkpointer.RecordMovedIn(rows, 2 + b);
    ASSERT_TRUE(s.ok()) << "record " << b << " (after " << saves.load()
                        << " saves): " << s;
  }
  recording = false;
  saver.join();
  EXPECT_GT(saves, 0);
  auto durable = ReadDurableRows(ServerCheckpointDir(dir.path(), 1),
                                 /*verify_files=*/true, nullptr);
  ASSERT_TRUE(durable.ok()) << durable.status();
  EXPECT_EQ(durable->moved_in.size(), kRecords);
}

TEST(CheckpointMovesTest, SavesWaitForMovesAndMovedRowsResumeWhereTheyWent) {
  TempDir dir;
  JobConfig config = CheckpointJob(dir.path());
  config.cluster.ps_endpoints = {"127.0.0.1:1", "127.0.0.1:2"};
  auto from = PsServer::Create(config, 0);
  auto to = PsServer::Create(config, 1);
  ASSERT_TRUE(from.ok() && to.ok());
  Checkpointer save_from(config, 0, from->get());
  Checkpointer save_to(config, 1, to->get());
  (*to)->SetMovedInRecorder(
      [&](const rpc::MovedRows& rows, uint64_t version) {
        return save_to.RecordMovedIn(rows, version);
      });
  const ShardMap v1 = (*from)->shard_map();
  uint64_t moving = 0;
  while (v1.ServerOf(moving) != 0) ++moving;
  const uint32_t bucket = v1.BucketOf(moving);
  uint64_t stays = moving + 1;
  while (v1.ServerOf(stays) != 0 || v1.BucketOf(stays) == bucket) ++stays;
  const std::vector<uint64_t> keys = {moving, stays};
  (*from)->sparse_table("emb")->Push(
      keys, std::vector<float>{0.5f, 0.25f, 0.125f, 1, 2, 3});
  std::vector<float> moved_row(3), kept_row(3);
  ASSERT_TRUE((*from)->sparse_table("emb")->Lookup(moving, moved_row));
  ASSERT_TRUE((*from)->sparse_table("emb")->Lookup(stays, kept_row));
  ASSERT_TRUE(save_from.Save().ok());
  ASSERT_TRUE(save_to.Save().ok());

  auto v2 = v1.WithHandover({{bucket, 1}}, {});
  ASSERT_TRUE(v2.ok());
  ASSERT_TRUE((*from)->AdoptMap(*v2));
  ASSERT_TRUE((*to)->AdoptMap(*v2));
  // Saved from here on, server 0's checkpoint would hold a bucket that is
  // leaving: the save waits for the settled map.
  absl::StatusOr<std::string> saved;
  std::thread saver([&] { saved = save_from.Save(); });
  rpc::HandOverRequest hand;
  hand.set_protocol_version(kProtocolVersion);
  hand.add_buckets(bucket);
  rpc::MovedRows rows;
  grpc::ServerContext hand_ctx;
  ASSERT_TRUE((*from)->HandOver(&hand_ctx, &hand, &rows).ok());
  rpc::TakeOverRequest take;
  take.set_protocol_version(kProtocolVersion);
  *take.mutable_rows() = rows;
  rpc::TakeOverResponse taken;
  grpc::ServerContext take_ctx;
  ASSERT_TRUE((*to)->TakeOver(&take_ctx, &take, &taken).ok());
  const ShardMap v3 = v2->Settled({bucket});
  ASSERT_TRUE((*from)->AdoptMap(v3));
  ASSERT_TRUE((*to)->AdoptMap(v3));
  saver.join();
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto ckpt = VerifyCheckpoint(*saved);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(ckpt->manifest["shard_map"]["version"], 3u);
  EXPECT_EQ(ckpt->manifest["tables"][0]["rows"], 1u) << "only the row that stays";

  // Server 1's durable rows: its checkpoint of map 1 and the record of the
  // move (map 2), which holds the moved row.
  auto durable = ReadDurableRows(ServerCheckpointDir(dir.path(), 1),
                                 /*verify_files=*/true, nullptr);
  ASSERT_TRUE(durable.ok()) << durable.status();
  ASSERT_EQ(durable->moved_in.size(), 1u);
  EXPECT_EQ(durable->moved_in[0].manifest["map_version"], 2u);
  EXPECT_EQ(durable->moved_in[0].manifest["buckets"],
            nlohmann::json::array({bucket}));

  const uint32_t buckets = config.server.num_buckets;
  auto map = ResumedShardMap(dir.path(), 2, buckets);
  ASSERT_TRUE(map.ok()) << map.status();
  EXPECT_EQ(map->version(), 4u) << "newer than every saved map";
  EXPECT_EQ(map->owner(bucket), 1u);
  const ShardMap first = ShardMap::Uniform(2, buckets);
  for (uint32_t b = 0; b < buckets; ++b) {
    if (b != bucket) {
      ASSERT_EQ(map->owner(b), first.owner(b)) << b;
    }
  }

  config.checkpoint.resume = true;
  auto again_from = PsServer::Create(config, 0);
  auto again_to = PsServer::Create(config, 1);
  ASSERT_TRUE(again_from.ok() && again_to.ok());
  ASSERT_TRUE(Checkpointer(config, 0, again_from->get()).Restore().ok());
  ASSERT_TRUE(Checkpointer(config, 1, again_to->get()).Restore().ok());
  EXPECT_EQ((*again_from)->map_version(), 4u);
  EXPECT_EQ((*again_to)->map_version(), 4u);
  std::vector<float> row(3);
  EXPECT_FALSE((*again_from)->sparse_table("emb")->Lookup(moving, row));
  ASSERT_TRUE((*again_from)->sparse_table("emb")->Lookup(stays, row));
  EXPECT_EQ(row, kept_row);
  ASSERT_TRUE((*again_to)->sparse_table("emb")->Lookup(moving, row));
  EXPECT_EQ(row, moved_row);
  EXPECT_EQ((*again_to)->sparse_table("emb")->size(), 1u);

  auto model = ExportModel(dir.path(), dir.path() + "/model");
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)["tables"][0]["rows"], 2u) << "each row once";
}

}  // namespace
}  // namespace hetps
