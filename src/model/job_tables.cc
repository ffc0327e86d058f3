#include "absl/strings/str_cat.h"
#include "data/reader.h"
#include "model/model.h"

namespace hetps {

absl::Status ResolveModelTables(JobConfig& config) {
  if (config.train.model == "none") {
    if (config.tables.empty()) {
      return absl::InvalidArgumentError(
          "tables: train.model 'none' has no tables of its own; list them");
    }
    return absl::OkStatus();
  }
  auto shape = ShapeOf(config.train.data);
  if (!shape.ok()) return shape.status();
  auto model = Model::Create(config.train, shape->num_slots, shape->num_dense);
  if (!model.ok()) return model.status();
  std::vector<TableConfig> needed = (*model)->Tables();
  if (config.tables.empty()) {
    config.tables = std::move(needed);
    return absl::OkStatus();
  }
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

}  // namespace hetps
