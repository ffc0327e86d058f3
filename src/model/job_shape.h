// JobShape: what a job's model and data come to, worked out once per process
// from its config and handed down as values: the data's slots and dense
// features, the model's row and dense widths, its tables, and the memory a
// sample takes on a worker. The CLI resolves it right after validation; the
// server node, the coordinator's planner and the worker read it instead of
// looking at the data config or building a model of their own.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "data/reader.h"
#include "hetps/config.h"

namespace hetps {

struct JobShape {
  DataShape data;        // ShapeOf(train.data); zeros when unknown ("none")
  uint64_t row_dim = 0;  // floats per row of the model's sparse table
  uint64_t dense_size = 0;
  // Memory one sample of a batch takes on a worker (keys, pulled rows and
  // their gradients, pooled slots, dense features, activations): what the
  // planner caps batches by and a DeviceProfile's emulated out-of-memory
  // checks, so the two agree. 0: unknown, nothing is capped.
  uint64_t bytes_per_sample = 0;
};

// Resolves `config` (validated): for a built-in model, its two tables
// (shaped by the data) go into config.tables when that is empty, or a
// listed set is checked to contain them with the right kind and dim (extra
// tables are allowed); train.model "none" (the caller drives PsClient
// itself) needs a non-empty list. INVALID_ARGUMENT names the field. Call on
// every node before any table is built.
absl::StatusOr<JobShape> ResolveJob(JobConfig& config);

}  // namespace hetps
