// Checkpoints and bucket moves (checkpoint.h, "Bucket moves"): a server's
// durable rows, the shard map a resumed job starts from, and the rows of a
// table as the checkpoints and move records leave them.
#include <algorithm>
#include <filesystem>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/bytes.h"
#include "hetps.pb.h"
#include "server/checkpoint.h"
#include "server/checkpoint_files.h"

namespace hetps {
namespace fs = std::filesystem;
using namespace checkpoint_internal;
namespace {

// The map version a checkpoint was saved at (one saved before moves were
// recorded: the first map's).
uint64_t CheckpointMapVersion(const nlohmann::json& manifest) {
  if (!manifest.contains("shard_map")) return 1;
  return manifest["shard_map"].value("version", uint64_t{1});
}

uint64_t RecordMapVersion(const VerifiedCheckpoint& record) {
  return record.manifest.value("map_version", uint64_t{0});
}

}  // namespace

std::string MoveRecordDir(const std::string& server_dir) {
  return (fs::path(server_dir) / "moved-in").string();
}

size_t DropCoveredMoveRecords(const std::string& server_dir) {
  struct Record {
    uint64_t version = 0;
    uint64_t seq = 0;
    std::string path;
    std::vector<uint32_t> buckets;
  };
  std::vector<Record> records;
  for (const auto& [seq, path] : ListCheckpoints(MoveRecordDir(server_dir))) {
    auto manifest = ReadManifest(path);
    // A record whose manifest does not read stays: ReadDurableRows reports
    // it, and nothing here can say what it covers.
    if (!manifest.ok() || !manifest->manifest.contains("buckets")) continue;
    records.push_back(
        {RecordMapVersion(*manifest), seq, path,
         manifest->manifest["buckets"].get<std::vector<uint32_t>>()});
  }
  std::sort(records.begin(), records.end(), [](const Record& a, const Record& b) {
    return std::make_pair(a.version, a.seq) > std::make_pair(b.version, b.seq);
  });
  absl::flat_hash_set<uint32_t> newer;  // buckets of the records seen so far
  size_t dropped = 0;
  for (const Record& record : records) {
    const bool covered = std::all_of(
        record.buckets.begin(), record.buckets.end(),
        [&newer](uint32_t b) { return newer.contains(b); });
    if (covered) {
      std::error_code ec;
      fs::remove_all(record.path, ec);
      if (!ec) ++dropped;
      continue;
    }
    newer.insert(record.buckets.begin(), record.buckets.end());
  }
  return dropped;
}

absl::StatusOr<DurableRows> ReadDurableRows(const std::string& server_dir,
                                            bool verify_files,
                                            std::vector<std::string>* refused) {
  auto read = [&](const std::string& path) {
    return verify_files ? VerifyCheckpoint(path) : ReadManifest(path);
  };
  DurableRows out;
  const auto found = ListCheckpoints(server_dir);
  for (const auto& [seq, path] : found) {
    auto ckpt = read(path);
    if (ckpt.ok()) {
      out.checkpoint = *std::move(ckpt);
      break;
    }
    if (refused) refused->push_back(std::string(ckpt.status().message()));
  }
  if (!found.empty() && !out.checkpoint) {
    return absl::DataLossError(
        absl::StrCat(server_dir, ": none of its ", found.size(),
                     " checkpoints verifies (each refused above)"));
  }
  const uint64_t after =
      out.checkpoint ? CheckpointMapVersion(out.checkpoint->manifest) : 0;
  for (const auto& [seq, path] : ListCheckpoints(MoveRecordDir(server_dir))) {
    auto record = read(path);
    if (!record.ok()) {
      if (refused) {
        refused->push_back(absl::StrCat("move record refused (its rows are "
                                        "lost): ",
                                        record.status().message()));
      }
      continue;
    }
    if (RecordMapVersion(*record) > after) {
      out.moved_in.push_back(*std::move(record));
    }
  }
  std::sort(out.moved_in.begin(), out.moved_in.end(),
            [](const VerifiedCheckpoint& a, const VerifiedCheckpoint& b) {
              return std::make_pair(RecordMapVersion(a), a.seq) <
                     std::make_pair(RecordMapVersion(b), b.seq);
            });
  return out;
}

absl::StatusOr<ShardMap> ResumedShardMap(const std::string& root,
                                         uint32_t num_servers,
                                         uint32_t num_buckets) {
  const ShardMap first = ShardMap::Uniform(num_servers, num_buckets);
  std::vector<uint32_t> owner(num_buckets);
  std::vector<uint64_t> newest(num_buckets, 0);
  for (uint32_t b = 0; b < num_buckets; ++b) owner[b] = first.owner(b);
  uint64_t top = 1;
  auto hold = [&](uint32_t bucket, uint64_t version, uint32_t server) {
    if (version > newest[bucket]) {
      newest[bucket] = version;
      owner[bucket] = server;
    }
    top = std::max(top, version);
  };
  for (uint32_t s = 0; s < num_servers; ++s) {
    const std::string dir = ServerCheckpointDir(root, s);
    auto rows = ReadDurableRows(dir, /*verify_files=*/false, nullptr);
    if (!rows.ok()) return rows.status();
    if (const auto& ckpt = rows->checkpoint) {
      const nlohmann::json& m = ckpt->manifest;
      const uint64_t version = CheckpointMapVersion(m);
      if (m.contains("shard_map")) {
        const nlohmann::json& owners = m["shard_map"]["owners"];
        if (owners.size() != num_buckets) {
          return absl::FailedPreconditionError(
              absl::StrCat(ckpt->path, ": saved with ", owners.size(),
                           " buckets, the job has ", num_buckets));
        }
        for (uint32_t b = 0; b < num_buckets; ++b) {
          if (owners[b].get<uint64_t>() == s) hold(b, version, s);
        }
      } else {
        for (uint32_t b = 0; b < num_buckets; ++b) {
          if (first.owner(b) == s) hold(b, version, s);
        }
      }
    }
    for (const VerifiedCheckpoint& record : rows->moved_in) {
      for (const auto& b : record.manifest.value("buckets",
                                                 nlohmann::json::array())) {
        const uint64_t bucket = b.get<uint64_t>();
        if (bucket >= num_buckets) {
          return absl::DataLossError(
              absl::StrCat(record.path, ": bucket ", bucket, " of ",
                           num_buckets, " (corrupt)"));
        }
        hold(static_cast<uint32_t>(bucket), RecordMapVersion(record), s);
      }
    }
  }
  bool moved = false;
  for (uint32_t b = 0; b < num_buckets; ++b) {
    moved = moved || owner[b] != first.owner(b);
  }
  if (!moved) return first;
  return ShardMap::Resumed(top + 1, num_servers, std::move(owner));
}

absl::Status ForEachDurableRow(
    const DurableRows& rows, const std::string& table, const std::string& file,
    uint64_t dim, uint32_t num_buckets,
    const std::function<bool(uint32_t)>& keep,
    std::optional<uint64_t>* state_width,
    const std::function<void(uint64_t, uint64_t, std::span<const float>,
                             std::span<const float>)>& row) {
  // The record holding each bucket's newest rows (records are by version).
  absl::flat_hash_map<uint32_t, size_t> newest;
  for (size_t i = 0; i < rows.moved_in.size(); ++i) {
    for (const auto& b : rows.moved_in[i].manifest.value(
             "buckets", nlohmann::json::array())) {
      newest[static_cast<uint32_t>(b.get<uint64_t>())] = i;
    }
  }
  state_width->reset();
  if (rows.checkpoint) {
    auto bytes = ReadCheckpointFile(*rows.checkpoint, file);
    if (!bytes.ok()) return bytes.status();
    uint64_t width = 0;
    absl::Status read = ReadSparseFile(
        *bytes, absl::StrCat(rows.checkpoint->path, "/", file), dim, &width,
        [&](uint64_t key, uint64_t updates, std::span<const float> w,
            std::span<const float> state) {
          const uint32_t bucket = BucketOfKey(key, num_buckets);
          if (newest.contains(bucket) || !keep(bucket)) return;
          row(key, updates, w, state);
        });
    if (!read.ok()) return read;
    *state_width = width;
  }
  for (size_t i = 0; i < rows.moved_in.size(); ++i) {
    const VerifiedCheckpoint& record = rows.moved_in[i];
    const std::string path = absl::StrCat(record.path, "/", kMovedRowsFile);
    auto bytes = ReadCheckpointFile(record, kMovedRowsFile);
    if (!bytes.ok()) return bytes.status();
    rpc::MovedRows moved;
    if (!moved.ParseFromString(*bytes)) {
      return absl::DataLossError(absl::StrCat(path, ": unreadable"));
    }
    for (const rpc::MovedTable& t : moved.tables()) {
      if (t.table() != table) continue;
      const size_t n = t.keys().size() / sizeof(uint64_t);
      if (n == 0) continue;
      const size_t width = t.state().size() / sizeof(float) / n;
      if (t.keys().size() != n * sizeof(uint64_t) ||
          t.weights().size() != n * dim * sizeof(float) ||
          t.state().size() != n * width * sizeof(float) ||
          static_cast<size_t>(t.update_counts_size()) != n ||
          (state_width->has_value() && **state_width != width)) {
        return absl::DataLossError(absl::StrCat(
            path, ": table '", table, "' is not ", n, " rows of dim ", dim,
            state_width->has_value()
                ? absl::StrCat(" with ", **state_width, " floats of state")
                : ""));
      }
      *state_width = width;
      std::vector<uint64_t> key_scratch;
      std::vector<float> weight_scratch, state_scratch;
      auto keys = ViewAs<uint64_t>(t.keys(), key_scratch);
      auto weights = ViewAs<float>(t.weights(), weight_scratch);
      auto state = ViewAs<float>(t.state(), state_scratch);
      for (size_t k = 0; k < n; ++k) {
        const uint32_t bucket = BucketOfKey(keys[k], num_buckets);
        const auto it = newest.find(bucket);
        if (it == newest.end() || it->second != i || !keep(bucket)) continue;
        row(keys[k], t.update_counts(static_cast<int>(k)),
            weights.subspan(k * dim, dim), state.subspan(k * width, width));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace hetps
