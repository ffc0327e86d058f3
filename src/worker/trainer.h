// Trainer: the worker loop of the built-in models (model/model.h), on a
// WorkerSession (worker/session.h: registration, chunks of the train split
// from the coordinator, the plan's batch size and push_freq, pushes through
// the job's codec, the emulated device, progress and the report). Per
// batch: one sparse pull of the batch's unique keys, one dense pull,
// forward/backward; every push_freq batches one push of the accumulated
// gradients. Rank 0 evaluates on the held-out split when it starts a new
// epoch's chunks (every train.eval_every_epochs) and, from a separate
// thread, every train.eval_every_s seconds. When no chunk is left a worker
// leaves the live set; once every worker has left, the model is final and
// rank 0 evaluates it.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "hetps/config.h"
#include "model/job_shape.h"
#include "worker/session.h"

namespace hetps {

// `config` validated and resolved into `shape` (ResolveJob), with
// cluster.ps_endpoints filled in.
absl::StatusOr<TrainReport> RunWorker(const JobConfig& config,
                                      const JobShape& shape, uint32_t rank,
                                      Clock& clock = Clock::Real());

}  // namespace hetps
