#include "server/checkpoint.h"

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <span>
#include <system_error>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/file.h"
#include "common/logging.h"
#include "server/checkpoint_files.h"
#include "server/ps_server.h"

namespace hetps {
namespace fs = std::filesystem;
using namespace checkpoint_internal;

namespace {
constexpr size_t kWriteBuffer = 1 << 20;

std::string Hex64(uint64_t v) { return absl::StrFormat("%016x", v); }

std::string ErrnoText() { return std::strerror(errno); }

absl::Status FsyncPath(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(path, ": open: ", ErrnoText()));
  }
  const int rc = ::fsync(fd);
  const std::string error = rc == 0 ? "" : ErrnoText();
  ::close(fd);
  if (rc != 0)
    return absl::InternalError(absl::StrCat(path, ": fsync: ", error));
  return absl::OkStatus();
}

// "ckpt-<seq>" → seq; nullopt for anything else (the .tmp of a write that
// never finished included).
std::optional<uint64_t> SeqOf(const std::string& name) {
  if (name.size() <= 5 || !absl::StartsWith(name, "ckpt-")) return std::nullopt;
  uint64_t seq;
  if (!absl::SimpleAtoi(absl::string_view(name).substr(5), &seq)) {
    return std::nullopt;
  }
  return seq;
}

std::string CheckpointName(uint64_t seq) {
  return absl::StrFormat("ckpt-%08d", seq);
}

absl::Status CheckBytes(const std::string& path, const nlohmann::json& entry,
                        const std::string& bytes) {
  const uint64_t want_size = entry.value("bytes", uint64_t{0});
  if (bytes.size() != want_size) {
    return absl::DataLossError(absl::StrCat(path, ": ", bytes.size(),
                                            " bytes, the manifest says ",
                                            want_size, " (truncated?)"));
  }
  const std::string got = Hex64(XXH64(bytes.data(), bytes.size(), 0));
  if (got != entry.value("xxh64", "")) {
    return absl::DataLossError(absl::StrCat(
        path, ": checksum ", got, " does not match the manifest's ",
        entry.value("xxh64", ""), " (corrupt)"));
  }
  return absl::OkStatus();
}

// Reads fixed-size values from a table file, failing (not crashing) when
// the file is shorter than its header says.
class ByteReader {
 public:
  ByteReader(const std::string& bytes) : bytes_(bytes) {}
  template <typename T>
  bool Read(T* out, size_t count = 1) {
    const size_t n = sizeof(T) * count;
    if (n == 0) return true;  // `out` may be null (no optimizer state)
    if (bytes_.size() - pos_ < n) return false;
    std::memcpy(out, bytes_.data() + pos_, n);
    pos_ += n;
    return true;
  }
  size_t left() const { return bytes_.size() - pos_; }

 private:
  const std::string& bytes_;
  size_t pos_ = 0;
};

}  // namespace

namespace checkpoint_internal {

// Completed checkpoints (by name) in `server_dir`, newest first.
std::vector<std::pair<uint64_t, std::string>> ListCheckpoints(
    const std::string& server_dir) {
  std::vector<std::pair<uint64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(server_dir, ec)) {
    if (!entry.is_directory()) continue;
    const std::string name = entry.path().filename().string();
    if (auto seq = SeqOf(name)) found.emplace_back(*seq, entry.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  return found;
}

// The manifest's entry for `name`, or null.
const nlohmann::json* FileEntry(const nlohmann::json& manifest,
                                const std::string& name) {
  for (const auto& f : manifest["files"]) {
    if (f.value("name", "") == name) return &f;
  }
  return nullptr;
}

std::string TableFileName(const TableConfig& table) {
  return absl::StrCat("table-", table.name,
                      table.kind == TableKind::kSparse ? ".sparse" : ".dense");
}

// The rows of a `.sparse` table file (`path` names it in errors): calls
// `row(key, update count, weights, state)` for each. Its dim must be `dim`;
// its state width is returned through `state_width`.
absl::Status ReadSparseFile(
    const std::string& bytes, const std::string& path, uint64_t dim,
    uint64_t* state_width,
    const std::function<void(uint64_t, uint64_t, std::span<const float>,
                             std::span<const float>)>& row) {
  ByteReader in(bytes);
  char magic[8];
  uint64_t header[2];
  if (!in.Read(magic, 8) || std::memcmp(magic, kSparseMagic, 8) != 0 ||
      !in.Read(header, 2) || header[0] != dim || header[1] > (1u << 20)) {
    return absl::DataLossError(absl::StrCat(
        path, ": not a sparse table file of rows of ", dim, " floats"));
  }
  *state_width = header[1];
  std::vector<float> w(dim), state(header[1]);
  uint64_t key, updates;
  while (in.left() > 0) {
    if (!in.Read(&key) || !in.Read(&updates) || !in.Read(w.data(), w.size()) ||
        !in.Read(state.data(), state.size())) {
      return absl::DataLossError(absl::StrCat(path, ": ends inside a row"));
    }
    row(key, updates, w, state);
  }
  return absl::OkStatus();
}

absl::StatusOr<DenseFile> ReadDenseFile(const std::string& bytes,
                                        const std::string& path) {
  ByteReader in(bytes);
  char magic[8];
  uint64_t header[4];
  DenseFile file;
  if (!in.Read(magic, 8) || std::memcmp(magic, kDenseMagic, 8) != 0 ||
      !in.Read(header, 4) ||
      (header[1] + header[2]) * sizeof(float) != in.left()) {
    return absl::DataLossError(absl::StrCat(
        path, ": not a dense slice file, or not as long as its header says"));
  }
  file.offset = header[0];
  file.slice.weights.resize(header[1]);
  file.slice.state.resize(header[2]);
  file.slice.updates = header[3];
  in.Read(file.slice.weights.data(), file.slice.weights.size());
  in.Read(file.slice.state.data(), file.slice.state.size());
  return file;
}

}  // namespace checkpoint_internal

std::string ServerCheckpointDir(const std::string& root, uint32_t rank) {
  return (fs::path(root) / absl::StrCat("server-", rank)).string();
}

// ---------------------------------------------------------------------------
// Verifying and reading.

// Every manifest field that restore and export read, with its type, so that
// a manifest that parses but holds a wrong type is refused here (DATA_LOSS)
// instead of throwing where a field is read.
absl::Status CheckManifestTypes(const nlohmann::json& m,
                                const std::string& manifest_path) {
  using Json = nlohmann::json;
  const auto bad = [&](const std::string& what) {
    return absl::DataLossError(
        absl::StrCat(manifest_path, ": ", what, " (corrupt)"));
  };
  const auto is_count = [](const Json& o, const char* field, bool required) {
    if (!o.contains(field)) return !required;
    return o[field].is_number_unsigned();
  };
  const auto is_text = [](const Json& o, const char* field, bool required) {
    if (!o.contains(field)) return !required;
    return o[field].is_string();
  };
  if (!m.is_object()) return bad("not a JSON object");
  for (const char* f : {"seq", "rank", "num_servers", "applied_rounds"}) {
    if (!is_count(m, f, /*required=*/std::string(f) != "applied_rounds")) {
      return bad(absl::StrCat("'", f, "' is not a non-negative integer"));
    }
  }
  for (const char* f : {"format", "job", "mode"}) {
    if (!is_text(m, f, std::string(f) == "format")) {
      return bad(absl::StrCat("'", f, "' is not a string"));
    }
  }
  if (!m.contains("files") || !m["files"].is_array()) {
    return bad("'files' is not a list");
  }
  for (const Json& f : m["files"]) {
    if (!f.is_object() || !is_text(f, "name", true) ||
        !is_count(f, "bytes", true) || !is_text(f, "xxh64", true)) {
      return bad(
          "a 'files' entry lacks a string name and xxh64 or a byte count");
    }
  }
  if (!m.contains("tables") || !m["tables"].is_array()) {
    return bad("'tables' is not a list");
  }
  if (!is_count(m, "map_version", false)) {
    return bad("'map_version' is not a non-negative integer");
  }
  if (m.contains("buckets") &&
      (!m["buckets"].is_array() ||
       !std::all_of(m["buckets"].begin(), m["buckets"].end(),
                    [](const Json& b) { return b.is_number_unsigned(); }))) {
    return bad("'buckets' is not a list of bucket numbers");
  }
  if (m.contains("shard_map")) {
    const Json& map = m["shard_map"];
    if (!map.is_object() || !is_count(map, "version", true) ||
        !map.contains("owners") || !map["owners"].is_array() ||
        !std::all_of(map["owners"].begin(), map["owners"].end(),
                     [](const Json& o) { return o.is_number_unsigned(); })) {
      return bad("'shard_map' lacks a version or a list of owners");
    }
  }
  for (const Json& t : m["tables"]) {
    if (!t.is_object() || !is_text(t, "name", true) ||
        !is_text(t, "kind", true) || !is_text(t, "optimizer", true) ||
        !is_text(t, "file", true) || !is_count(t, "dim", true)) {
      return bad(
          "a 'tables' entry lacks a string name, kind, optimizer or file, or "
          "a dim");
    }
    for (const char* f : {"state_width", "rows", "offset", "length"}) {
      if (!is_count(t, f, false)) {
        return bad(absl::StrCat("table '", t["name"].get<std::string>(), "': '",
                                f, "' is not a non-negative integer"));
      }
    }
  }
  return absl::OkStatus();
}

namespace checkpoint_internal {

absl::StatusOr<VerifiedCheckpoint> ReadManifest(const std::string& path) {
  const std::string manifest_path = (fs::path(path) / kManifestName).string();
  auto text = ReadFile(manifest_path);
  if (!text.ok()) {
    return absl::DataLossError(absl::StrCat(
        manifest_path, ": missing (the checkpoint was not finished)"));
  }
  VerifiedCheckpoint ckpt;
  ckpt.path = path;
  ckpt.manifest = nlohmann::json::parse(*text, nullptr, false);
  if (ckpt.manifest.is_discarded() || !ckpt.manifest.is_object() ||
      !ckpt.manifest.contains("format") ||
      ckpt.manifest["format"] != kCheckpointFormat) {
    return absl::DataLossError(absl::StrCat(
        manifest_path, ": not a ", kCheckpointFormat, " manifest (corrupt)"));
  }
  if (absl::Status s = CheckManifestTypes(ckpt.manifest, manifest_path);
      !s.ok()) {
    return s;
  }
  ckpt.seq = ckpt.manifest["seq"].get<uint64_t>();
  return ckpt;
}

}  // namespace checkpoint_internal

absl::StatusOr<VerifiedCheckpoint> VerifyCheckpoint(const std::string& path) {
  auto ckpt = ReadManifest(path);
  if (!ckpt.ok()) return ckpt.status();
  for (const auto& entry : ckpt->manifest["files"]) {
    const std::string file =
        (fs::path(path) / entry.value("name", "")).string();
    auto bytes = ReadFile(file);
    if (!bytes.ok()) return absl::DataLossError(bytes.status().message());
    if (absl::Status s = CheckBytes(file, entry, *bytes); !s.ok()) return s;
  }
  return ckpt;
}

absl::StatusOr<VerifiedCheckpoint> NewestCheckpoint(
    const std::string& server_dir, std::vector<std::string>* refused) {
  const auto found = ListCheckpoints(server_dir);
  if (found.empty()) {
    return absl::NotFoundError(absl::StrCat(server_dir, ": no checkpoint yet"));
  }
  for (const auto& [seq, path] : found) {
    auto ckpt = VerifyCheckpoint(path);
    if (ckpt.ok()) return ckpt;
    if (refused) refused->push_back(std::string(ckpt.status().message()));
  }
  return absl::DataLossError(
      absl::StrCat(server_dir, ": none of its ", found.size(),
                   " checkpoints verifies (each refused above)"));
}

absl::StatusOr<std::string> ReadCheckpointFile(const VerifiedCheckpoint& ckpt,
                                               const std::string& name) {
  const std::string path = (fs::path(ckpt.path) / name).string();
  const nlohmann::json* entry = FileEntry(ckpt.manifest, name);
  if (entry == nullptr) {
    return absl::DataLossError(
        absl::StrCat(path, ": not listed in the manifest"));
  }
  auto bytes = ReadFile(path);
  if (!bytes.ok()) return absl::DataLossError(bytes.status().message());
  if (absl::Status s = CheckBytes(path, *entry, *bytes); !s.ok()) return s;
  return bytes;
}

// ---------------------------------------------------------------------------
// Writing.

CheckpointWriter::CheckpointWriter(std::string server_dir, uint64_t seq)
    : server_dir_(std::move(server_dir)),
      seq_(seq),
      tmp_path_(
          (fs::path(server_dir_) / (CheckpointName(seq) + ".tmp")).string()) {}

CheckpointWriter::~CheckpointWriter() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_path_, ec);
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Begin(
    const std::string& server_dir, uint64_t seq) {
  std::unique_ptr<CheckpointWriter> writer(
      new CheckpointWriter(server_dir, seq));
  std::error_code ec;
  fs::create_directories(server_dir, ec);
  fs::remove_all(writer->tmp_path_, ec);
  if (!fs::create_directory(writer->tmp_path_, ec) || ec) {
    return absl::InternalError(
        absl::StrCat(writer->tmp_path_, ": cannot create: ", ec.message()));
  }
  return writer;
}

absl::Status CheckpointWriter::AddFile(
    const std::string& name, const std::function<void(const Append&)>& write) {
  const std::string path = (fs::path(tmp_path_) / name).string();
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(path, ": open: ", ErrnoText()));
  }
  XXH64_state_t* hash = XXH64_createState();
  XXH64_reset(hash, 0);
  uint64_t total = 0;
  std::string buffer;
  buffer.reserve(kWriteBuffer);
  std::string error;
  auto flush = [&] {
    size_t done = 0;
    while (error.empty() && done < buffer.size()) {
      const ssize_t n = ::write(fd, buffer.data() + done, buffer.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0)
        error = ErrnoText();
      else
        done += static_cast<size_t>(n);
    }
    buffer.clear();
  };
  write([&](const void* data, size_t bytes) {
    if (bytes == 0) return;  // `data` may be null (no optimizer state)
    XXH64_update(hash, data, bytes);
    total += bytes;
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const size_t take = std::min(bytes, kWriteBuffer - buffer.size());
      buffer.append(p, take);
      p += take;
      bytes -= take;
      if (buffer.size() == kWriteBuffer) flush();
    }
  });
  flush();
  if (error.empty() && ::fsync(fd) != 0) error = ErrnoText();
  ::close(fd);
  const uint64_t digest = XXH64_digest(hash);
  XXH64_freeState(hash);
  if (!error.empty()) {
    return absl::InternalError(absl::StrCat(path, ": write: ", error));
  }
  files_.push_back(
      {{"name", name}, {"bytes", total}, {"xxh64", Hex64(digest)}});
  return absl::OkStatus();
}

absl::StatusOr<std::string> CheckpointWriter::Commit(nlohmann::json manifest) {
  manifest["format"] = kCheckpointFormat;
  manifest["seq"] = seq_;
  manifest["files"] = files_;
  const std::string text = manifest.dump(1);
  const std::string manifest_path =
      (fs::path(tmp_path_) / kManifestName).string();
  {
    std::ofstream out(manifest_path, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      return absl::InternalError(absl::StrCat(manifest_path, ": write failed"));
    }
  }
  if (absl::Status s = FsyncPath(manifest_path, O_RDONLY); !s.ok()) return s;
  if (absl::Status s = FsyncPath(tmp_path_, O_RDONLY | O_DIRECTORY); !s.ok()) {
    return s;
  }
  const std::string final_path =
      (fs::path(server_dir_) / CheckpointName(seq_)).string();
  std::error_code ec;
  fs::remove_all(final_path, ec);
  fs::rename(tmp_path_, final_path, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat(tmp_path_, ": rename to ",
                                            final_path, ": ", ec.message()));
  }
  committed_ = true;
  if (absl::Status s = FsyncPath(server_dir_, O_RDONLY | O_DIRECTORY);
      !s.ok()) {
    return s;
  }
  return final_path;
}

// ---------------------------------------------------------------------------
// Export.

absl::StatusOr<nlohmann::json> ExportModel(const std::string& root,
                                           const std::string& out_dir) {
  // Every server's newest verified checkpoint and the move records after it.
  std::vector<DurableRows> durable;
  std::vector<VerifiedCheckpoint> ckpts;
  int num_servers = -1;
  for (uint32_t rank = 0;; ++rank) {
    const std::string dir = ServerCheckpointDir(root, rank);
    if (!fs::is_directory(dir)) break;
    std::vector<std::string> refused;
    auto rows = ReadDurableRows(dir, /*verify_files=*/true, &refused);
    for (const std::string& r : refused) spdlog::warn("refused: {}", r);
    if (!rows.ok()) return rows.status();
    if (!rows->checkpoint) {
      return absl::NotFoundError(absl::StrCat(dir, ": no checkpoint yet"));
    }
    num_servers = rows->checkpoint->manifest.value("num_servers", -1);
    ckpts.push_back(*rows->checkpoint);
    durable.push_back(*std::move(rows));
  }
  if (ckpts.empty() || num_servers != static_cast<int>(ckpts.size())) {
    return absl::NotFoundError(absl::StrCat(
        root, ": expected server-0 .. server-", std::max(num_servers, 1) - 1,
        " checkpoint directories, found ", ckpts.size()));
  }
  // Where the buckets are (checkpoints saved before shard maps were
  // recorded: each server's rows are its own).
  uint32_t num_buckets = 0;
  for (const auto& c : ckpts) {
    if (c.manifest.contains("shard_map")) {
      num_buckets =
          static_cast<uint32_t>(c.manifest["shard_map"]["owners"].size());
    }
  }
  std::optional<ShardMap> map;
  if (num_buckets > 0) {
    auto resumed = ResumedShardMap(root, num_servers, num_buckets);
    if (!resumed.ok()) return resumed.status();
    map = *std::move(resumed);
  }
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(out_dir, ": ", ec.message()));
  nlohmann::json model = {{"format", "hetps-model-1"},
                          {"job", ckpts[0].manifest.value("job", "")},
                          {"tables", nlohmann::json::array()},
                          {"checkpoints", nlohmann::json::array()}};
  for (const auto& c : ckpts) model["checkpoints"].push_back(c.path);
  for (const auto& table : ckpts[0].manifest["tables"]) {
    const std::string name = table.value("name", "");
    const std::string kind = table.value("kind", "");
    const uint64_t dim = table.value("dim", uint64_t{0});
    const std::string file = table.value("file", "");
    nlohmann::json entry = {{"name", name}, {"kind", kind}, {"dim", dim}};
    if (kind == "sparse") {
      std::vector<std::pair<uint64_t, std::vector<float>>> rows;
      for (uint32_t s = 0; s < durable.size(); ++s) {
        std::optional<uint64_t> state_width;
        absl::Status read = ForEachDurableRow(
            durable[s], name, file, dim, std::max(num_buckets, 1u),
            [&](uint32_t bucket) { return !map || map->owner(bucket) == s; },
            &state_width,
            [&](uint64_t key, uint64_t, std::span<const float> w,
                std::span<const float>) {
              rows.emplace_back(key, std::vector<float>(w.begin(), w.end()));
            });
        if (!read.ok()) return read;
      }
      std::sort(rows.begin(), rows.end());
      entry["file"] = name + ".rows";
      entry["rows"] = rows.size();
      std::ofstream out(fs::path(out_dir) / (name + ".rows"), std::ios::binary);
      for (const auto& [key, w] : rows) {
        out.write(reinterpret_cast<const char*>(&key), sizeof(key));
        out.write(reinterpret_cast<const char*>(w.data()),
                  static_cast<std::streamsize>(w.size() * sizeof(float)));
      }
      if (!out)
        return absl::InternalError(
            absl::StrCat(out_dir, "/", name, ".rows: write failed"));
    } else {
      std::vector<float> whole(dim);
      for (const auto& c : ckpts) {
        auto bytes = ReadCheckpointFile(c, file);
        if (!bytes.ok()) return bytes.status();
        const std::string path = absl::StrCat(c.path, "/", file);
        auto slice = ReadDenseFile(*bytes, path);
        if (!slice.ok()) return slice.status();
        const std::vector<float>& w = slice->slice.weights;
        if (slice->offset > dim || w.size() > dim - slice->offset) {
          return absl::DataLossError(absl::StrCat(
              path, ": slice beyond the table's ", dim, " floats"));
        }
        std::copy(w.begin(), w.end(), whole.begin() + slice->offset);
      }
      entry["file"] = name + ".dense";
      std::ofstream out(fs::path(out_dir) / (name + ".dense"),
                        std::ios::binary);
      out.write(reinterpret_cast<const char*>(whole.data()),
                static_cast<std::streamsize>(whole.size() * sizeof(float)));
      if (!out)
        return absl::InternalError(
            absl::StrCat(out_dir, "/", name, ".dense: write failed"));
    }
    model["tables"].push_back(std::move(entry));
  }
  std::ofstream out(fs::path(out_dir) / "model.json");
  out << model.dump(2) << "\n";
  if (!out)
    return absl::InternalError(
        absl::StrCat(out_dir, "/model.json: write failed"));
  return model;
}

}  // namespace hetps
