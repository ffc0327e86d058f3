// The Checkpointer (checkpoint.h): one server's saves and restores.
#include <filesystem>

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
}

Checkpointer::~Checkpointer() { Stop(); }

absl::StatusOr<std::string> Checkpointer::Save() {
  absl::StatusOr<std::string> result =
      absl::FailedPreconditionError("checkpoint.dir is not set");
  if (config_.checkpoint.dir.empty()) return result;
  server_->RunBetweenApplies(
      [&](uint64_t applied) { result = SaveLocked(applied); });
  return result;
}

absl::StatusOr<std::string> Checkpointer::SaveLocked(uint64_t applied) {
  absl::MutexLock lock(&mu_);
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
    if (SparseTable* sparse = server_->sparse_table(table.name)) {
      entry["kind"] = "sparse";
      entry["state_width"] = sparse->state_width();
      uint64_t rows = 0;
      written =
          (*writer)->AddFile(TableFileName(table), [&](const auto& append) {
            const uint64_t header[2] = {sparse->dim(), sparse->state_width()};
            append(kSparseMagic, sizeof(kSparseMagic));
            append(header, sizeof(header));
            sparse->ForEachRowWithState(
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
    } else if (DenseTable* dense = server_->dense_table(table.name)) {
      entry["kind"] = "dense";
      const DenseTable::Snapshot snap = dense->Save();
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
    const std::string progress = progress_.save().SerializeAsString();
    absl::Status written = (*writer)->AddFile(
        kProgressFile,
        [&](const auto& append) { append(progress.data(), progress.size()); });
    if (!written.ok()) return written;
  }
  nlohmann::json manifest = {
      {"job", config_.name},
      {"rank", rank_},
      {"num_servers", config_.num_servers()},
      {"mode", ConsistencyModeName(config_.mode)},
      {"applied_rounds", applied},
      {"created_unix_s", absl::ToUnixSeconds(clock_.WallNow())},
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
  spdlog::info("server {}: checkpoint {} saved at round {} in {:.2f} s", rank_,
               *path, applied, absl::ToDoubleSeconds(clock_.Now() - start));
  return path;
}

absl::Status Checkpointer::Restore() {
  if (!config_.checkpoint.resume) return absl::OkStatus();
  std::vector<std::string> refused;
  auto ckpt = NewestCheckpoint(server_dir_, &refused);
  for (const std::string& reason : refused) {
    spdlog::error("server {}: checkpoint refused: {}", rank_, reason);
  }
  if (absl::IsNotFound(ckpt.status())) {
    spdlog::warn("server {}: --resume but {}: starting from initial values",
                 rank_, ckpt.status().message());
    return absl::OkStatus();
  }
  if (!ckpt.ok()) return ckpt.status();
  const nlohmann::json& m = ckpt->manifest;
  if (m.value("rank", -1) != static_cast<int>(rank_) ||
      m.value("num_servers", -1) != config_.num_servers()) {
    return absl::FailedPreconditionError(
        absl::StrCat(ckpt->path, ": saved by server ", m.value("rank", -1),
                     " of ", m.value("num_servers", -1), ", this is server ",
                     rank_, " of ", config_.num_servers()));
  }
  for (const TableConfig& table : config_.tables) {
    const nlohmann::json* saved = nullptr;
    if (m.contains("tables") && m["tables"].is_array()) {
      for (const auto& t : m["tables"]) {
        if (t.is_object() && t.value("name", "") == table.name) saved = &t;
      }
    }
    const bool sparse = table.kind == TableKind::kSparse;
    if (saved == nullptr || saved->value("dim", uint64_t{0}) != table.dim ||
        saved->value("kind", "") != (sparse ? "sparse" : "dense") ||
        saved->value("optimizer", "") != table.optimizer.type) {
      return absl::FailedPreconditionError(absl::StrCat(
          ckpt->path, ": table '", table.name,
          "' is missing or has another kind, dim or optimizer than the job's"));
    }
    const std::string name = TableFileName(table);
    auto bytes = ReadCheckpointFile(*ckpt, name);
    if (!bytes.ok()) return bytes.status();
    const std::string path = absl::StrCat(ckpt->path, "/", name);
    if (sparse) {
      SparseTable* t = server_->sparse_table(table.name);
      uint64_t state_width;
      absl::Status read = ReadSparseFile(
          *bytes, path, t->dim(), &state_width,
          [&](uint64_t key, uint64_t updates, std::span<const float> w,
              std::span<const float> state) {
            if (state_width == t->state_width()) {
              t->RestoreRow(key, w, state, updates);
            }
          });
      if (!read.ok()) return read;
      if (state_width != t->state_width()) {
        return absl::DataLossError(absl::StrCat(
            path, ": rows carry ", state_width, " floats of optimizer state, '",
            table.optimizer.type, "' keeps ", t->state_width()));
      }
    } else {
      DenseTable* t = server_->dense_table(table.name);
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
  if (progress_.restore && FileEntry(m, kProgressFile) != nullptr) {
    auto bytes = ReadCheckpointFile(*ckpt, kProgressFile);
    if (!bytes.ok()) return bytes.status();
    rpc::JobProgress progress;
    if (!progress.ParseFromString(*bytes)) {
      return absl::DataLossError(
          absl::StrCat(ckpt->path, "/", kProgressFile, ": unreadable"));
    }
    progress_.restore(progress);
  }
  server_->TablesRestored();
  spdlog::info(
      "server {}: restored {} (saved at round {}); updates applied after it "
      "were lost on this server",
      rank_, ckpt->path, m.value("applied_rounds", uint64_t{0}));
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
