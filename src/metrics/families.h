// The Prometheus series of a job, made from status values only (the same
// rpc::StatusResponse / rpc::ServerStatus that `hetps status` prints; this
// file computes nothing of its own). Names follow Prometheus conventions:
// `hetps_` prefix, base units (seconds, bytes, ratios in [0, 1]), `_total`
// on counters, labels `worker`, `server`, `table`, `trigger`.
// docs/OPERATING.md lists every series.
#pragma once

#include <string>
#include <vector>

#include "hetps.pb.h"
#include "prometheus/metric_family.h"

namespace hetps {

using MetricFamilies = std::vector<prometheus::MetricFamily>;

// One server's series (labelled server="<rank>"): queue length, applies by
// trigger, pushes, pulls, staleness, CPU, rows per table, pull and push
// latency histograms.
void AddServerFamilies(const rpc::ServerStatus& server, MetricFamilies& out);

// The job's series from the coordinator's status: window, data progress,
// and per worker (worker="<rank>") liveness, throughput, busy ratio,
// staleness, batch, push_freq, gradient bytes and codec. Not the servers':
// each server exports its own.
void AddJobFamilies(const rpc::StatusResponse& status, MetricFamilies& out);

// The text exposition format (version 0.0.4).
std::string Exposition(const MetricFamilies& families);

}  // namespace hetps
