// The Checkpointer (checkpoint.h): one server's saves and restores.
#include <filesystem>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "server/checkpoint.h"
#include "server/checkpoint_files.h"
#include "server/ps_server.h"

namespace hetps {
namespace fs = std::filesystem;
using namespace checkpoint_internal;
namespace {

// How often the periodic saver looks at the applied round count.
constexpr absl::Duration kSavePoll = absl::Milliseconds(20);

}  // namespace

Checkpointer::Checkpointer(const JobConfig& config, uint32_t rank,
                           PsServer* server, JobProgressHooks progress,
                           Clock& clock)
    : config_(config),
      rank_(rank),
      server_dir_(ServerCheckpointDir(config.checkpoint.dir, rank)),
      server_(server),
      progress_(std::move(progress)),
      clock_(clock) {
  const auto found = ListCheckpoints(server_dir_);
  if (!found.empty()) next_seq_ = found.front().first + 1;
  const auto records = ListCheckpoints(MoveRecordDir(server_dir_));
  if (!records.empty()) next_record_ = records.front().first + 1;
}

Checkpointer::~Checkpointer() { Stop(); }

// What a save takes while applies wait: a snapshot of every table, the
// map and the data progress, all of one instant.
struct Checkpointer::Frozen {
  uint64_t applied = 0;
  absl::flat_hash_map<std::string, std::unique_ptr<SparseTable::Snapshot>>
      sparse;
  absl::flat_hash_map<std::string, DenseTable::Snapshot> dense;
  std::optional<ShardMap> map;
  std::string progress;  // rank 0: rpc::JobProgress
};

absl::StatusOr<std::string> Checkpointer::Save() {
  if (config_.checkpoint.dir.empty()) {
    return absl::FailedPreconditionError("checkpoint.dir is not set");
  }
  absl::MutexLock lock(&mu_);
  Frozen frozen;
  absl::Duration pause;
  absl::Status quiet = server_->RunWithoutMoves([&] {
    server_->RunBetweenApplies([&](uint64_t applied) {
      const absl::Time start = clock_.Now();
      frozen.applied = applied;
      for (const TableConfig& table : config_.tables) {
        if (SparseTable* sparse = server_->sparse_table(table.name)) {
          frozen.sparse[table.name] = sparse->TakeSnapshot();
        } else if (DenseTable* dense = server_->dense_table(table.name)) {
          frozen.dense[table.name] = dense->Save();
        }
      }
      // RunWithoutMoves: no move to or from here is pending, so the
      // snapshot holds exactly the buckets this map gives this server.
      frozen.map = server_->shard_map();
      if (progress_.save) {
        frozen.progress = progress_.save().SerializeAsString();
      }
      pause = clock_.Now() - start;
    });
  });
  if (!quiet.ok()) return quiet;
  last_pause_ = pause;
  return Write(frozen);
}

absl::Status Checkpointer::RecordMovedIn(const rpc::MovedRows& rows,
                                         uint64_t map_version) {
  absl::MutexLock lock(&records_mu_);
  const std::string dir = MoveRecordDir(server_dir_);
  auto writer = CheckpointWriter::Begin(dir, next_record_);
  if (!writer.ok()) return writer.status();
  const std::string bytes = rows.SerializeAsString();
  absl::Status written = (*writer)->AddFile(
      kMovedRowsFile,
      [&](const auto& append) { append(bytes.data(), bytes.size()); });
  if (!written.ok()) return written;
  nlohmann::json manifest = {
      {"job", config_.name},
      {"rank", rank_},
      {"num_servers", config_.num_servers()},
      {"map_version", map_version},
      {"buckets", std::vector<uint32_t>(rows.buckets().begin(),
                                        rows.buckets().end())},
      {"created_unix_s", absl::ToUnixSeconds(clock_.WallNow())},
      {"tables", nlohmann::json::array()}};
  auto path = (*writer)->Commit(std::move(manifest));
  if (!path.ok()) return path.status();
  ++next_record_;
  DropCoveredMoveRecords(server_dir_);
  return absl::OkStatus();
}

void Checkpointer::DropMoveRecordsBefore(uint64_t map_version) {
  // Under records_mu_: a TakeOver may be writing its record (a .tmp) now.
  absl::MutexLock lock(&records_mu_);
  std::error_code ec;
  for (const auto& entry :
       fs::directory_iterator(MoveRecordDir(server_dir_), ec)) {
    if (entry.path().extension() == ".tmp") fs::remove_all(entry.path(), ec);
  }
  for (const auto& [seq, record] : ListCheckpoints(MoveRecordDir(server_dir_))) {
    auto m = ReadManifest(record);
    if (m.ok() && m->manifest.value("map_version", uint64_t{0}) < map_version) {
      fs::remove_all(record, ec);
    }
  }
}

absl::StatusOr<std::string> Checkpointer::Write(Frozen& frozen) {
  const absl::Time start = clock_.Now();
  auto writer = CheckpointWriter::Begin(server_dir_, next_seq_);
  if (!writer.ok()) return writer.status();
  nlohmann::json tables = nlohmann::json::array();
  for (const TableConfig& table : config_.tables) {
    nlohmann::json entry = {{"name", table.name},
                            {"dim", table.dim},
                            {"optimizer", table.optimizer.type},
                            {"file", TableFileName(table)}};
    absl::Status written;
    if (auto it = frozen.sparse.find(table.name); it != frozen.sparse.end()) {
      SparseTable* sparse = server_->sparse_table(table.name);
      entry["kind"] = "sparse";
      entry["state_width"] = sparse->state_width();
      uint64_t rows = 0;
      written =
          (*writer)->AddFile(TableFileName(table), [&](const auto& append) {
            const uint64_t header[2] = {sparse->dim(), sparse->state_width()};
            append(kSparseMagic, sizeof(kSparseMagic));
            append(header, sizeof(header));
            it->second->ForEachRow(
                [&](uint64_t key, std::span<const float> w,
                    std::span<const float> state, uint64_t updates) {
                  append(&key, sizeof(key));
                  append(&updates, sizeof(updates));
                  append(w.data(), w.size_bytes());
                  append(state.data(), state.size_bytes());
                  ++rows;
                });
          });
      entry["rows"] = rows;
    } else if (auto d = frozen.dense.find(table.name);
               d != frozen.dense.end()) {
      DenseTable* dense = server_->dense_table(table.name);
      const DenseTable::Snapshot& snap = d->second;
      entry["kind"] = "dense";
      entry["offset"] = dense->offset();
      entry["length"] = dense->length();
      written =
          (*writer)->AddFile(TableFileName(table), [&](const auto& append) {
            const uint64_t header[4] = {dense->offset(), dense->length(),
                                        snap.state.size(), snap.updates};
            append(kDenseMagic, sizeof(kDenseMagic));
            append(header, sizeof(header));
            append(snap.weights.data(), snap.weights.size() * sizeof(float));
            append(snap.state.data(), snap.state.size() * sizeof(float));
          });
    }
    if (!written.ok()) return written;
    tables.push_back(std::move(entry));
  }
  if (progress_.save) {
    absl::Status written =
        (*writer)->AddFile(kProgressFile, [&](const auto& append) {
          append(frozen.progress.data(), frozen.progress.size());
        });
    if (!written.ok()) return written;
  }
  const ShardMap& map = *frozen.map;
  std::vector<uint32_t> owners(map.num_buckets());
  for (uint32_t b = 0; b < owners.size(); ++b) owners[b] = map.owner(b);
  nlohmann::json manifest = {
      {"job", config_.name},
      {"rank", rank_},
      {"num_servers", config_.num_servers()},
      {"mode", ConsistencyModeName(config_.mode)},
      {"applied_rounds", frozen.applied},
      {"created_unix_s", absl::ToUnixSeconds(clock_.WallNow())},
      {"shard_map", {{"version", map.version()}, {"owners", owners}}},
      {"tables", std::move(tables)}};
  auto path = (*writer)->Commit(std::move(manifest));
  if (!path.ok()) return path.status();
  ++next_seq_;
  // Keep the newest `keep` checkpoints; a .tmp left by a crash goes too.
  const auto found = ListCheckpoints(server_dir_);
  std::error_code ec;
  for (size_t i = static_cast<size_t>(config_.checkpoint.keep);
       i < found.size(); ++i) {
    fs::remove_all(found[i].second, ec);
  }
  for (const auto& entry : fs::directory_iterator(server_dir_, ec)) {
    if (entry.path().extension() == ".tmp") fs::remove_all(entry.path(), ec);
  }
  // Move records older than the oldest checkpoint kept are in it.
  const size_t oldest =
      std::min(found.size(), static_cast<size_t>(config_.checkpoint.keep)) - 1;
  auto kept = ReadManifest(found[oldest].second);
  const uint64_t covered =
      kept.ok() && kept->manifest.contains("shard_map")
          ? kept->manifest["shard_map"].value("version", uint64_t{0})
          : 0;
  DropMoveRecordsBefore(covered);
  spdlog::info(
      "server {}: checkpoint {} saved at round {} in {:.2f} s (applies "
      "paused {:.1f} ms)",
      rank_, *path, frozen.applied, absl::ToDoubleSeconds(clock_.Now() - start),
      absl::ToDoubleMilliseconds(last_pause_));
  return path;
}

absl::Status Checkpointer::Restore(
    const std::function<absl::StatusOr<ShardMap>()>& job_map) {
  if (!config_.checkpoint.resume) return absl::OkStatus();
  std::vector<std::string> refused;
  auto durable = ReadDurableRows(server_dir_, /*verify_files=*/true, &refused);
  for (const std::string& reason : refused) {
    spdlog::error("server {}: checkpoint refused: {}", rank_, reason);
  }
  if (!durable.ok()) return durable.status();
  const uint32_t num_buckets = config_.server.num_buckets;
  auto map = job_map ? job_map()
                     : ResumedShardMap(config_.checkpoint.dir,
                                       config_.num_servers(), num_buckets);
  if (!map.ok()) return map.status();
  if (map->num_buckets() != num_buckets ||
      map->num_servers() != static_cast<uint32_t>(config_.num_servers())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the shard map to resume with has ", map->num_buckets(),
        " buckets and ", map->num_servers(), " servers, the job ", num_buckets,
        " and ", config_.num_servers()));
  }
  // A server joining a running job may find moves open: it keeps the rows
  // of a bucket it is handing over (the mover may ask for them), and of a
  // bucket moving here only those its move record of that very handover
  // holds (then they arrived; otherwise the mover's TakeOver brings them).
  absl::flat_hash_set<uint32_t> arrived;
  for (const auto& [bucket, pending] : map->pending()) {
    if (map->owner(bucket) != rank_) continue;
    for (const VerifiedCheckpoint& record : durable->moved_in) {
      if (record.manifest.value("map_version", uint64_t{0}) !=
          pending.version) {
        continue;
      }
      for (const auto& b :
           record.manifest.value("buckets", nlohmann::json::array())) {
        if (b.get<uint64_t>() == bucket) arrived.insert(bucket);
      }
    }
  }
  auto keep = [&](uint32_t bucket) {
    const auto it = map->pending().find(bucket);
    if (it == map->pending().end()) return map->owner(bucket) == rank_;
    return it->second.from == rank_ || arrived.contains(bucket);
  };
  if (!durable->checkpoint && durable->moved_in.empty()) {
    spdlog::warn("server {}: --resume but {}: no checkpoint yet: starting "
                 "from initial values",
                 rank_, server_dir_);
    server_->AdoptMap(*map, arrived);
    return absl::OkStatus();
  }
  const VerifiedCheckpoint* ckpt =
      durable->checkpoint ? &*durable->checkpoint : nullptr;
  const nlohmann::json m = ckpt ? ckpt->manifest : nlohmann::json::object();
  const std::string from = ckpt ? ckpt->path : server_dir_;
  if (ckpt != nullptr &&
      (m.value("rank", -1) != static_cast<int>(rank_) ||
       m.value("num_servers", -1) != config_.num_servers())) {
    return absl::FailedPreconditionError(
        absl::StrCat(ckpt->path, ": saved by server ", m.value("rank", -1),
                     " of ", m.value("num_servers", -1), ", this is server ",
                     rank_, " of ", config_.num_servers()));
  }
  uint64_t restored_rows = 0;
  for (const TableConfig& table : config_.tables) {
    const nlohmann::json* saved = nullptr;
    if (m.contains("tables") && m["tables"].is_array()) {
      for (const auto& t : m["tables"]) {
        if (t.is_object() && t.value("name", "") == table.name) saved = &t;
      }
    }
    const bool sparse = table.kind == TableKind::kSparse;
    if (ckpt != nullptr &&
        (saved == nullptr || saved->value("dim", uint64_t{0}) != table.dim ||
         saved->value("kind", "") != (sparse ? "sparse" : "dense") ||
         saved->value("optimizer", "") != table.optimizer.type)) {
      return absl::FailedPreconditionError(absl::StrCat(
          ckpt->path, ": table '", table.name,
          "' is missing or has another kind, dim or optimizer than the job's"));
    }
    const std::string name = TableFileName(table);
    if (sparse) {
      SparseTable* t = server_->sparse_table(table.name);
      std::optional<uint64_t> state_width;
      absl::Status read = ForEachDurableRow(
          *durable, table.name, name, t->dim(), num_buckets,
          keep,
          &state_width,
          [&](uint64_t key, uint64_t updates, std::span<const float> w,
              std::span<const float> state) {
            if (state.size() != t->state_width()) return;
            t->RestoreRow(key, w, state, updates);
            ++restored_rows;
          });
      if (!read.ok()) return read;
      if (state_width.has_value() && *state_width != t->state_width()) {
        return absl::DataLossError(absl::StrCat(
            from, ": rows of '", table.name, "' carry ", *state_width,
            " floats of optimizer state, '", table.optimizer.type, "' keeps ",
            t->state_width()));
      }
    } else if (ckpt != nullptr) {
      DenseTable* t = server_->dense_table(table.name);
      auto bytes = ReadCheckpointFile(*ckpt, name);
      if (!bytes.ok()) return bytes.status();
      const std::string path = absl::StrCat(ckpt->path, "/", name);
      auto file = ReadDenseFile(*bytes, path);
      if (!file.ok()) return file.status();
      if (file->offset != t->offset()) {
        return absl::DataLossError(
            absl::StrCat(path, ": the slice at ", file->offset,
                         ", this server holds ", t->offset()));
      }
      if (absl::Status s = t->Restore(std::move(file->slice)); !s.ok()) {
        return s;
      }
    }
  }
  if (ckpt != nullptr && progress_.restore &&
      FileEntry(m, kProgressFile) != nullptr) {
    auto bytes = ReadCheckpointFile(*ckpt, kProgressFile);
    if (!bytes.ok()) return bytes.status();
    rpc::JobProgress progress;
    if (!progress.ParseFromString(*bytes)) {
      return absl::DataLossError(
          absl::StrCat(ckpt->path, "/", kProgressFile, ": unreadable"));
    }
    progress_.restore(progress);
  }
  server_->AdoptMap(*map, arrived);
  server_->TablesRestored();
  spdlog::info(
      "server {}: restored {} (saved at round {}) and {} move records after "
      "it: {} sparse rows of the buckets shard map version {} gives it; "
      "updates applied after them were lost on this server",
      rank_, from, m.value("applied_rounds", uint64_t{0}),
      durable->moved_in.size(), restored_rows, map->version());
  return absl::OkStatus();
}

void Checkpointer::Start() {
  if (config_.checkpoint.dir.empty() || config_.checkpoint.every_rounds == 0) {
    return;
  }
  thread_ = std::thread([this] {
    const uint64_t every = config_.checkpoint.every_rounds;
    // The round count restarts at 0 in a restarted server (see
    // aggregator.h); saves follow this process's own count.
    uint64_t next = every;
    absl::MutexLock lock(&stop_mu_);
    while (!stop_) {
      clock_.WaitUntil(stop_cv_, stop_mu_, clock_.Now() + kSavePoll);
      if (stop_) break;
      stop_mu_.Unlock();
      if (server_->applied_rounds() >= next) {
        auto saved = Save();
        if (!saved.ok()) {
          spdlog::error("server {}: checkpoint failed: {}", rank_,
                        saved.status().message());
        }
        next = server_->applied_rounds() + every;
      }
      stop_mu_.Lock();
    }
  });
}

void Checkpointer::Stop() {
  {
    absl::MutexLock lock(&stop_mu_);
    stop_ = true;
    stop_cv_.SignalAll();
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace hetps
