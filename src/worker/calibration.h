// Calibration (`hetps calibrate`, SPEC §6): a worker that, instead of
// training its share to the end, measures itself for a few seconds while
// training on the job's real data, model and servers:
//
//  1. Batch sweep: the compute rate (samples per busy second: pulls and
//     pushes excluded) at each batch size of the plan, a slice of time each,
//     stopping at the first batch its memory does not hold (the emulated
//     device's check, RESOURCE_EXHAUSTED from a real one).
//  2. Links: per server, the time to pull rows of its own (keys of the
//     batches trained, grouped by owner): bytes per second of payload, the
//     median of three pulls.
//  3. Drift: a sustained run at the sweep's best batch, cut into slices;
//     drift = median rate of the last three slices / the first three (a
//     device that throttles or a neighbour that arrives shows below 1).
//
// The worker then leaves like a trained one; its report carries the numbers
// (TrainReport::calibration) for the calibrate command (cli/calibrate.h).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/clock.h"
#include "hetps/config.h"
#include "model/job_shape.h"
#include "worker/session.h"

namespace hetps {

struct CalibrationPlan {
  double seconds = 20;  // the whole measurement, all three parts
  std::vector<uint32_t> batches = {16, 32, 64, 128, 256, 512};
};

// Runs worker `rank` in calibration (config as for RunWorker, with enough
// epochs of data for `plan.seconds`).
absl::StatusOr<TrainReport> RunCalibration(const JobConfig& config,
                                           const JobShape& shape, uint32_t rank,
                                           const CalibrationPlan& plan,
                                           Clock& clock = Clock::Real());

}  // namespace hetps
