// The run's report: `launch` samples the coordinator's status once a second
// (JobTimeline) and writes report.html into the run directory at the end —
// one self-contained page (the chart library, our script and the data
// inlined; opens offline) with test AUC over time, samples/s, busy fraction
// and batch per worker, the window, queue length per server, gradient bytes
// per codec, the summary and the job's configuration.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "hetps.pb.h"
#include "nlohmann/json.hpp"

namespace hetps {

class JobTimeline {
 public:
  // One status sample, `t_s` seconds after the job started.
  void Add(double t_s, const rpc::StatusResponse& status);

  // {"t": [...], "window": [...], "workers": {"0": {"samples_per_s": [...],
  // "busy": [...], "batch": [...]}}, "servers": {"0": {"queue": [...]}},
  // "codec_bytes": {"int8": [...]}}: columns aligned with "t"; a value
  // missing at a sample is null. codec_bytes: gradient bytes sent so far per
  // codec (a worker's growth between two samples counts for the codec it
  // used at the later one).
  nlohmann::json ToJson() const;

 private:
  nlohmann::json columns_ = {{"t", nlohmann::json::array()},
                             {"window", nlohmann::json::array()},
                             {"workers", nlohmann::json::object()},
                             {"servers", nlohmann::json::object()},
                             {"codec_bytes", nlohmann::json::object()}};
  size_t samples_ = 0;
  std::vector<uint64_t> sent_bytes_;  // per worker, at the last sample
  std::map<std::string, uint64_t> codec_total_;
};

// Writes report.html to `path`: the timeline, the summary (summary.json's
// contents) and `config_text` (the job's configuration as given).
absl::Status WriteReport(const std::string& path, const JobTimeline& timeline,
                         const nlohmann::json& summary,
                         const std::string& config_text);

}  // namespace hetps
