// `hetps calibrate JOB.yaml` (SPEC §6): a short stress run of the job's own
// cluster, data and model in which every worker measures itself
// (worker/calibration.h: compute rate at several batch sizes, the largest
// batch its memory holds, its link to each server, drift over a sustained
// run), then a tuned job file with a comment per choice:
//
//   device_profiles   each worker's measured compute rate (two significant
//                     digits), its memory setting kept, an emulated link
//                     (bandwidth_mbps) as measured;
//   train.batch_size  kept, unless the slowest worker's proportional share
//                     falls below its best batch (the smallest within 90%
//                     of its fastest rate): then raised to give it that;
//   push_freq         left to the planner (it accumulates where memory
//                     caps a batch);
//   window            the initial window for the measured rates (sum /
//                     slowest), still adapting;
//   cluster.servers   a quarter of the workers, within [workers/5,
//                     workers/3] rounded up, one more if a server was
//                     saturated during calibration (its diagnostic) or
//                     used ≥ 70% of the CPUs it may use over the run;
//   compress.codec    adaptive when some worker's push would take more than
//                     a quarter of its compute over its measured link, else
//                     as it was.
//
// A worker whose sustained rate drifted below 85% of its start is reported
// (a device that throttles, a neighbour that arrived). With --compare the
// original and the tuned job run one after the other and their time to the
// target AUC (99.5% of the better final AUC) is printed side by side.
#pragma once

#include <string>
#include <vector>

#include "hetps/config.h"
#include "nlohmann/json.hpp"

namespace hetps {

struct CalibrateOptions {
  std::string self_path;    // the hetps binary
  std::string config_path;  // the job's YAML
  std::vector<std::string> overrides;
  double seconds = 20;  // each worker's measurement
  std::string out;      // the tuned YAML (default: JOB.tuned.yaml)
  std::string run_dir;  // the calibration's (and comparison's) runs
  bool compare = false;
};

// The tuned job from the calibration run's summary (summary.json of
// `launch`, per_worker[].calibration) for `config` (the job as calibrated,
// without the calibration's own overrides): the tuned YAML document's
// fields to set, as JSON (`device_profiles`, `train.batch_size`, ...), and
// a comment line per choice under "comments"; "drift" lists the workers
// that drifted.
nlohmann::json TuneJob(const JobConfig& config, const nlohmann::json& summary);

int RunCalibrate(const JobConfig& config, const CalibrateOptions& options);

}  // namespace hetps
