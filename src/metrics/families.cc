#include "metrics/families.h"

#include <string>
#include <utility>

#include "prometheus/text_serializer.h"
#include "shard/access_stats.h"

namespace hetps {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// Adds a sample to the family `name` in `out`, creating the family (with
// `help` and `type`) on first use.
class Builder {
 public:
  explicit Builder(MetricFamilies& out) : out_(out) {}

  void Gauge(const std::string& name, const std::string& help, double value,
             Labels labels = {}) {
    ClientMetric& m = Add(name, help, MetricType::Gauge, std::move(labels));
    m.gauge.value = value;
  }
  void Counter(const std::string& name, const std::string& help, double value,
               Labels labels = {}) {
    ClientMetric& m = Add(name, help, MetricType::Counter, std::move(labels));
    m.counter.value = value;
  }
  void Histogram(const std::string& name, const std::string& help,
                 const rpc::LatencyHistogram& h, Labels labels = {}) {
    if (h.counts_size() != h.upper_s_size() + 1) return;  // not reported
    ClientMetric& m = Add(name, help, MetricType::Histogram, std::move(labels));
    uint64_t cumulative = 0;
    for (int i = 0; i < h.upper_s_size(); ++i) {
      cumulative += h.counts(i);
      m.histogram.bucket.push_back({cumulative, h.upper_s(i)});
    }
    cumulative += h.counts(h.upper_s_size());
    m.histogram.bucket.push_back(
        {cumulative, std::numeric_limits<double>::infinity()});
    m.histogram.sample_count = cumulative;
    m.histogram.sample_sum = h.sum_s();
  }

 private:
  ClientMetric& Add(const std::string& name, const std::string& help,
                    MetricType type, Labels labels) {
    MetricFamily* family = nullptr;
    for (MetricFamily& f : out_) {
      if (f.name == name) family = &f;
    }
    if (family == nullptr) {
      out_.push_back(MetricFamily{name, help, type, {}});
      family = &out_.back();
    }
    family->metric.emplace_back();
    family->metric.back().label = std::move(labels);
    return family->metric.back();
  }

  MetricFamilies& out_;
};

}  // namespace

void AddServerFamilies(const rpc::ServerStatus& server, MetricFamilies& out) {
  Builder b(out);
  const std::string rank = std::to_string(server.rank());
  const Labels s = {{"server", rank}};
  b.Gauge("hetps_server_up", "1 when the server answered the last poll",
          server.reachable() ? 1 : 0, s);
  if (!server.reachable()) return;
  const rpc::AggregatorStats& st = server.stats();
  b.Counter("hetps_server_applied_rounds_total",
            "Updates applied to the tables (sync: rounds; async: pushes; "
            "semi_async: queue applies)",
            static_cast<double>(server.applied_rounds()), s);
  b.Gauge("hetps_server_queue_length", "Pushes waiting in the semi_async queue",
          st.queue_length(), s);
  for (const auto& [trigger, n] :
       {std::pair<const char*, uint64_t>{"window", st.applies_by_window()},
        {"all_contributed", st.applies_by_all()},
        {"time", st.applies_by_time()}}) {
    b.Counter("hetps_server_queue_applies_total",
              "semi_async queue applies by what triggered them",
              static_cast<double>(n), {{"server", rank}, {"trigger", trigger}});
  }
  b.Counter("hetps_server_pushes_total", "Pushes received",
            static_cast<double>(st.pushes()), s);
  b.Counter("hetps_server_pushes_into_empty_queue_total",
            "semi_async pushes that found the queue empty",
            static_cast<double>(st.pushes_into_empty()), s);
  b.Counter("hetps_server_pulls_total", "Pulls answered",
            static_cast<double>(st.pulls()), s);
  b.Counter("hetps_server_pulls_read_ahead_total",
            "semi_async pulls answered ahead of the queue",
            static_cast<double>(st.pulls_ahead()), s);
  b.Counter("hetps_server_bound_waits_total",
            "Pulls held by the staleness bound",
            static_cast<double>(st.ssp_waits()), s);
  b.Counter("hetps_server_bound_wait_seconds_total",
            "Time pulls spent held by the staleness bound",
            st.ssp_wait_seconds(), s);
  b.Gauge("hetps_server_max_staleness",
          "Most applies a gradient's parameters lacked, so far",
          static_cast<double>(st.max_staleness()), s);
  b.Gauge("hetps_server_window", "The semi_async window this server applies",
          st.window(), s);
  b.Counter("hetps_server_cpu_seconds_total", "CPU time of the server process",
            st.cpu_s(), s);
  // What its requests touched (shard/access_stats.h).
  const AccessTotals access = SumAccess(server.access());
  for (const auto& [direction, n] :
       {std::pair<const char*, uint64_t>{"pulled", access.pulled_rows},
        {"pushed", access.pushed_rows}}) {
    b.Counter(
        "hetps_server_rows_total", "Sparse rows its requests pulled and pushed",
        static_cast<double>(n), {{"server", rank}, {"direction", direction}});
  }
  b.Counter("hetps_server_row_bytes_total",
            "Float bytes of the sparse rows pulled and pushed",
            static_cast<double>(access.bytes), s);
  b.Counter("hetps_server_service_seconds_total",
            "Time spent serving requests (table work, not waits)",
            server.access().service_s(), s);
  if (st.read_lag_bound() > 0) {
    b.Counter("hetps_server_cached_pushes_total",
              "Pushes computed from rows a worker's hot-row cache kept",
              static_cast<double>(st.cached_pushes()), s);
    b.Gauge("hetps_server_read_lag_bound",
            "Most applies a kept row may lag the step's pull by",
            static_cast<double>(st.read_lag_bound()), s);
    b.Gauge("hetps_server_max_read_lag",
            "Most applies a kept row lagged the step's pull by, so far",
            static_cast<double>(st.max_read_lag()), s);
    b.Counter("hetps_server_read_lag_violations_total",
              "Pushes computed from kept rows older than the bound",
              static_cast<double>(st.read_lag_violations()), s);
  }
  for (const rpc::TableInfo& t : server.tables()) {
    b.Gauge("hetps_table_rows",
            "Rows held (sparse) or floats of the slice held (dense)",
            static_cast<double>(t.rows()),
            {{"server", rank}, {"table", t.schema().name()}});
    if (t.schema().kind() != rpc::TABLE_KIND_SPARSE) continue;
    for (const auto& [event, n] :
         {std::pair<const char*, uint64_t>{"kept", t.plans_kept()},
          {"found", t.plans_found()}}) {
      b.Counter(
          "hetps_table_key_plans_total",
          "Sparse requests that kept their keys' plan for the next "
          "request of the same keys, or found one",
          static_cast<double>(n),
          {{"server", rank}, {"table", t.schema().name()}, {"event", event}});
    }
  }
  b.Histogram("hetps_server_pull_latency_seconds",
              "Pull handling time, arrival to reply (includes waits for a "
              "round or the staleness bound)",
              server.pull_latency(), s);
  b.Histogram("hetps_server_push_latency_seconds",
              "Push handling time, arrival to reply", server.push_latency(), s);
}

void AddJobFamilies(const rpc::StatusResponse& status, MetricFamilies& out) {
  Builder b(out);
  b.Gauge("hetps_window", "The semi_async window the coordinator set",
          status.window());
  b.Gauge("hetps_job_elapsed_seconds", "Time since the coordinator started",
          status.elapsed_s());
  if (status.placement().at_s() > 0) {
    b.Gauge("hetps_placement_load_max_over_mean",
            "Largest server service time over the mean, last control period",
            status.placement().max_over_mean());
    b.Gauge("hetps_placement_planned_moves",
            "Buckets the Rebalancer's latest plan would move",
            status.placement().moves());
  }
  for (const rpc::WorkerStatus& w : status.workers()) {
    if (w.rank() == 0 && w.progress().test_auc_at_s() > 0) {
      b.Gauge("hetps_test_auc",
              "Test AUC of rank 0's latest evaluation (train.eval_every_s)",
              w.progress().test_auc());
    }
  }
  b.Gauge("hetps_data_chunks_given", "Data chunks handed out so far",
          static_cast<double>(status.chunks_given()));
  b.Gauge("hetps_data_chunks", "Data chunks the job hands out in all",
          static_cast<double>(status.chunks_total()));
  b.Counter("hetps_data_samples_finished_total",
            "Samples of chunks some worker finished",
            static_cast<double>(status.finished_samples()));
  b.Counter("hetps_data_chunks_requeued_total",
            "Chunks a failed worker held that went back to the queue",
            static_cast<double>(status.requeued_chunks()));
  // Every diagnostic raised so far: 1 while it still holds, 0 after.
  for (const rpc::Diagnostic& d : status.diagnostics()) {
    b.Gauge("hetps_diagnostic",
            "A warning of the coordinator's diagnostics (1: holds now)",
            d.active() ? 1 : 0, {{"kind", d.kind()}, {"subject", d.subject()}});
  }
  for (const rpc::WorkerStatus& w : status.workers()) {
    const Labels l = {{"worker", std::to_string(w.rank())}};
    const rpc::WorkerProgress& p = w.progress();
    b.Gauge("hetps_worker_live", "1 while the worker is in the live set",
            w.live() ? 1 : 0, l);
    b.Gauge("hetps_worker_heartbeat_age_seconds",
            "Time since the worker's last heartbeat", w.last_heartbeat_age_s(),
            l);
    b.Gauge("hetps_worker_samples_per_second",
            "Samples trained per second of training time", p.samples_per_s(),
            l);
    b.Gauge("hetps_worker_compute_samples_per_second",
            "Samples per second of compute (capability)",
            p.compute_samples_per_s(), l);
    b.Gauge("hetps_worker_busy_ratio", "Share of training time spent computing",
            p.busy_fraction(), l);
    b.Gauge("hetps_worker_staleness",
            "Applies its latest push's parameters lacked",
            static_cast<double>(w.staleness()), l);
    b.Gauge("hetps_worker_batch_size", "Its current batch size", p.batch_size(),
            l);
    b.Gauge("hetps_worker_push_freq", "Steps per push", p.push_freq(), l);
    b.Counter("hetps_worker_samples_total", "Samples trained",
              static_cast<double>(p.samples()), l);
    b.Counter("hetps_worker_steps_total", "Steps trained",
              static_cast<double>(p.step()), l);
    b.Counter("hetps_worker_data_chunks_total", "Data chunks finished",
              static_cast<double>(w.chunks_done()), l);
    b.Counter("hetps_worker_gradient_raw_bytes_total",
              "Gradient payload as fp32, all pushes",
              static_cast<double>(p.raw_bytes()), l);
    b.Counter("hetps_worker_gradient_sent_bytes_total",
              "Gradient payload as sent (after compression)",
              static_cast<double>(p.sent_bytes()), l);
    b.Counter("hetps_worker_pulled_rows_total",
              "Sparse rows pulled from the servers",
              static_cast<double>(p.pulled_rows()), l);
    b.Counter("hetps_worker_cached_rows_total",
              "Sparse rows read from its hot-row cache instead",
              static_cast<double>(p.cached_rows()), l);
    if (!p.codec().empty()) {
      b.Gauge("hetps_worker_codec_info",
              "1 for the codec of the worker's latest push", 1,
              {{"worker", std::to_string(w.rank())}, {"codec", p.codec()}});
    }
  }
}

std::string Exposition(const MetricFamilies& families) {
  return prometheus::TextSerializer().Serialize(families);
}

}  // namespace hetps
