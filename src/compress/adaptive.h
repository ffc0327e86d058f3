// Adaptive compression: per push, the least lossy codec whose payload crosses
// the link within a fraction of the compute time behind the push, so that
// communication stays hidden behind compute on slow links without degrading
// gradients on fast ones.
//
// The rule. budget = max_transfer_fraction x compute_seconds x bandwidth
// (bytes). The push's size with a codec is the sum of EncodedSize over its
// tensors (codec.h; the same codec for every tensor of the push). Levels,
// least lossy first; the first level whose size is <= budget is chosen:
//   1. lossless:  none, or `sparse` (keep_fraction 0, non-zeros only)
//   2. fp16:      fp16, or `sparse+fp16` (non-zeros only)
//   3. int8:      int8, or `sparse+int8` (non-zeros only)
//   4. top-k:     `sparse+int8` with the largest keep_fraction that fits
// Within a level the smaller variant is taken (the dense one on a tie), which
// is how the gradient's density enters: a mostly-zero gradient goes sparse
// at no loss. When even one entry or row per tensor (level 4's smallest) is
// over budget, that smallest option is still chosen and the decision says it
// is over. Without a bandwidth (none measured yet) or a compute time, the
// choice is `none`.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "compress/codec.h"

namespace hetps {

struct AdaptiveConfig {
  // Transfer time allowed per push, as a fraction of the compute time of the
  // batches behind it. > 0.
  double max_transfer_fraction = 0.25;
  // Weight of the newest push in the bandwidth estimate, in (0, 1].
  double bandwidth_ewma_alpha = 0.3;
  // > 0: the link bandwidth in bytes/s to assume instead of measuring it
  // (an emulated device profile). 0: measure.
  double emulated_bytes_per_second = 0;

  // OK, or INVALID_ARGUMENT naming the field that is out of range.
  absl::Status Validate() const;
};

// An exponentially weighted moving average of link bandwidth. It averages
// bytes and seconds separately and divides, instead of averaging per-push
// rates: the rate of a small push is mostly latency, and weighting pushes by
// their size is what predicts the transfer time of the next large one.
// After the first push, b = bytes and s = seconds; after each later one,
// b = alpha x bytes + (1 - alpha) x b, and s likewise; the estimate is b / s.
// Thread-compatible.
class BandwidthEstimator {
 public:
  // alpha in (0, 1] (AdaptiveConfig::Validate checks it).
  explicit BandwidthEstimator(double alpha);

  // One push of `bytes` that took `seconds`; a push with seconds not > 0 (or
  // not finite) carries no rate information and is ignored.
  void Observe(uint64_t bytes, double seconds);
  // 0 until the first observation.
  double bytes_per_second() const;

 private:
  const double alpha_;
  bool observed_ = false;
  double bytes_ = 0;
  double seconds_ = 0;
};

// A choice and what it was made from, for status displays and counters.
struct CodecDecision {
  CodecSpec spec;
  uint64_t raw_bytes = 0;       // the push with codec none
  uint64_t encoded_bytes = 0;   // the push with `spec`
  double bytes_per_second = 0;  // link bandwidth assumed; 0 = unknown
  double budget_seconds = 0;    // max_transfer_fraction x compute time
  double transfer_seconds = 0;  // encoded_bytes / bytes_per_second
  bool within_budget = true;    // false only when nothing fits the budget
  // E.g. "int8: 1032 B in 103.2 ms at 10000 B/s, within 0.25 x 500 ms
  // compute = 125 ms; fp16 needs 2016 B = 201.6 ms".
  std::string reason;
};

// The rule above for one push made of `parts` (one shape per tensor), on a
// link of `bytes_per_second` (<= 0: unknown), behind `compute_seconds` of
// compute. `config` is valid.
CodecDecision ChooseCodec(const AdaptiveConfig& config, double bytes_per_second,
                          double compute_seconds,
                          std::span<const GradientShape> parts);

// ChooseCodec with the bandwidth measured from this worker's own pushes (or
// emulated), remembering the last decision for status. Thread-compatible:
// one per worker.
class AdaptiveCodec {
 public:
  // `config` is valid.
  explicit AdaptiveCodec(const AdaptiveConfig& config);

  const CodecDecision& Choose(double compute_seconds,
                              std::span<const GradientShape> parts);
  // A finished push of `bytes` (payloads) that took `seconds` on the wire.
  void RecordTransfer(uint64_t bytes, double seconds);

  // The emulated bandwidth when configured, else the estimate (0: none yet).
  double bytes_per_second() const;
  const CodecDecision& last_decision() const { return last_; }

 private:
  const AdaptiveConfig config_;
  BandwidthEstimator bandwidth_;
  CodecDecision last_;
};

}  // namespace hetps
