// Calibration (`hetps calibrate`, SPEC §6): a worker that, instead of
// training its share to the end, measures itself for a few seconds while
// training on the job's real data, model and servers:
//
//  1. Links, first (at clock 0 no pull waits for other workers): per
//     server, the time to pull 4096 rows it owns: payload bits per second,
//     the median of three pulls.
//  2. Memory: the largest batch (doubling from the plan's smallest, up to
//     65536) the device holds (the emulated device's check; a real one's
//     RESOURCE_EXHAUSTED in the sweep).
//  3. Batch sweep: the compute rate (samples per busy second: pulls and
//     pushes excluded) at each batch size of the plan it holds, a slice of
//     time each; a batch whose step would take more than half a slice is
//     not tried. The best batch: the smallest within 90% of the fastest.
//  4. Drift: a sustained run at the best batch, cut into slices; drift =
//     the median rate of the last three slices / the best batch's rate in
//     the sweep (a device that throttles or a neighbour that arrives shows
//     below 1).
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
