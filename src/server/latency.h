// LatencyHistogram: handler latencies of a server, counted into fixed
// buckets without a lock; read as rpc::LatencyHistogram (TableInfoResponse,
// status, and from there Prometheus).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "hetps.pb.h"

namespace hetps {

class LatencyHistogram {
 public:
  // Upper bounds in seconds: 100 µs (an in-memory pull on loopback) up to
  // 10 s (a sync pull waiting for its round).
  static constexpr std::array<double, 15> kUpperS = {
      0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025,
      0.05,   0.1,     0.25,   0.5,   1.0,    2.5,   10.0};

  void Observe(absl::Duration d) {
    const double s = absl::ToDoubleSeconds(d);
    size_t i = 0;
    while (i < kUpperS.size() && s > kUpperS[i]) ++i;
    counts_[i].fetch_add(1, std::memory_order_relaxed);
    sum_us_.fetch_add(static_cast<uint64_t>(s * 1e6),
                      std::memory_order_relaxed);
  }

  void ToProto(rpc::LatencyHistogram* out) const {
    out->Clear();
    for (double u : kUpperS) out->add_upper_s(u);
    for (const auto& c : counts_) {
      out->add_counts(c.load(std::memory_order_relaxed));
    }
    out->set_sum_s(
        static_cast<double>(sum_us_.load(std::memory_order_relaxed)) / 1e6);
  }

 private:
  std::array<std::atomic<uint64_t>, kUpperS.size() + 1> counts_{};
  std::atomic<uint64_t> sum_us_{0};
};

}  // namespace hetps
