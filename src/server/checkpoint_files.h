// The checkpoint's files, shared by the format (checkpoint.cc: verify,
// write, export) and the Checkpointer (checkpointer.cc: save, restore).
// Private to src/server/; docs/CHECKPOINTS.md has the layouts.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hetps/config.h"
#include "nlohmann/json.hpp"
#include "server/checkpoint.h"
#include "table/dense_table.h"

namespace hetps::checkpoint_internal {

inline constexpr char kSparseMagic[8] = {'H', 'P', 'S', 'P',
                                         'A', 'R', 'S', '1'};
inline constexpr char kDenseMagic[8] = {'H', 'P', 'D', 'E', 'N', 'S', 'E', '1'};
// Rank 0's copy of the coordinator's data progress (rpc::JobProgress).
inline constexpr const char* kProgressFile = "coordinator.pb";
// A move record's rows (rpc::MovedRows).
inline constexpr const char* kMovedRowsFile = "rows.pb";

// The manifest of the checkpoint at `path`, its fields type-checked; the
// files it lists are not read (VerifyCheckpoint reads them).
absl::StatusOr<VerifiedCheckpoint> ReadManifest(const std::string& path);

// Completed checkpoints (by name) in `server_dir`, newest first.
std::vector<std::pair<uint64_t, std::string>> ListCheckpoints(
    const std::string& server_dir);

// The manifest's entry for `name`, or null.
const nlohmann::json* FileEntry(const nlohmann::json& manifest,
                                const std::string& name);

// "table-<name>.sparse" / ".dense".
std::string TableFileName(const TableConfig& table);

// The rows of a `.sparse` table file (`path` names it in errors): calls
// `row(key, update count, weights, state)` for each. Its dim must be `dim`;
// its state width is returned through `state_width`.
absl::Status ReadSparseFile(
    const std::string& bytes, const std::string& path, uint64_t dim,
    uint64_t* state_width,
    const std::function<void(uint64_t, uint64_t, std::span<const float>,
                             std::span<const float>)>& row);

// A `.dense` slice file: its offset in the whole array and the slice.
struct DenseFile {
  uint64_t offset = 0;
  DenseTable::Snapshot slice;
};
absl::StatusOr<DenseFile> ReadDenseFile(const std::string& bytes,
                                        const std::string& path);

}  // namespace hetps::checkpoint_internal
