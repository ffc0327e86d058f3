#include "model/job_shape.h"

#include "absl/strings/str_cat.h"
#include "model/model.h"

namespace hetps {
namespace {

// keys (8 B), rows + row gradients + pooled slot vectors (3 floats per row
// float), dense features, activations and their gradients.
uint64_t BytesPerSample(const DataShape& data, uint64_t row_dim,
                        uint64_t activation_floats) {
  const uint64_t slots = static_cast<uint64_t>(data.num_slots);
  return slots * 8 + slots * row_dim * 3 * 4 +
         static_cast<uint64_t>(data.num_dense) * 4 + activation_floats * 4;
}

absl::Status CheckListedTables(const JobConfig& config,
                               const std::vector<TableConfig>& needed) {
  for (const TableConfig& want : needed) {
    const TableConfig* have = nullptr;
    for (const TableConfig& t : config.tables) {
      if (t.name == want.name) have = &t;
    }
    if (have == nullptr || have->kind != want.kind || have->dim != want.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tables: model '", config.train.model, "' needs ",
          want.kind == TableKind::kSparse ? "sparse" : "dense", " table '",
          want.name, "' with dim ", want.dim,
          have == nullptr ? " (missing)" : " (listed with another shape)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<JobShape> ResolveJob(JobConfig& config) {
  JobShape shape;
  absl::StatusOr<DataShape> data = ShapeOf(config.train.data);
  if (config.train.model == "none") {
    if (config.tables.empty()) {
      return absl::InvalidArgumentError(
          "tables: train.model 'none' has no tables of its own; list them");
    }
    // The caller's own model: its data, if any, still sizes a sample (one
    // float per row, as a lower bound).
    if (data.ok()) {
      shape.data = *data;
      shape.bytes_per_sample = BytesPerSample(*data, 1, 0);
    }
    return shape;
  }
  if (!data.ok()) return data.status();
  auto model = Model::Create(config.train, data->num_slots, data->num_dense);
  if (!model.ok()) return model.status();
  const std::vector<TableConfig> needed = (*model)->Tables();
  if (config.tables.empty()) {
    config.tables = needed;
  } else if (absl::Status s = CheckListedTables(config, needed); !s.ok()) {
    return s;
  }
  shape.data = *data;
  shape.row_dim = (*model)->row_dim();
  shape.dense_size = (*model)->dense_size();
  shape.bytes_per_sample =
      BytesPerSample(*data, shape.row_dim, (*model)->activation_floats());
  return shape;
}

}  // namespace hetps
