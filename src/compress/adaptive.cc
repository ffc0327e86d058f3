#include "compress/adaptive.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "compress/codec.h"

namespace hetps {
namespace {

uint64_t PushBytes(const CodecSpec& spec,
                   std::span<const GradientShape> parts) {
  uint64_t total = 0;
  for (const GradientShape& part : parts) total += EncodedSize(spec, part);
  return total;
}

std::string Describe(const CodecSpec& spec) {
  if (!IsSparse(spec.kind)) return CodecName(spec.kind);
  if (spec.keep_fraction == 0) {
    return absl::StrCat(CodecName(spec.kind), " (non-zeros)");
  }
  return absl::StrFormat("%s keeping %.4g%%", CodecName(spec.kind),
                         100 * spec.keep_fraction);
}

std::string Millis(double seconds) {
  return absl::StrFormat("%.4g ms", seconds * 1e3);
}

// The level's variant with fewer bytes; the dense one on a tie.
CodecSpec Smaller(CodecKind dense, CodecKind sparse,
                  std::span<const GradientShape> parts) {
  const CodecSpec a{.kind = dense};
  const CodecSpec b{.kind = sparse};
  return PushBytes(b, parts) < PushBytes(a, parts) ? b : a;
}

}  // namespace

absl::Status AdaptiveConfig::Validate() const {
  if (!(max_transfer_fraction > 0) || std::isinf(max_transfer_fraction)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_transfer_fraction: ", max_transfer_fraction,
                     " must be positive and finite"));
  }
  if (!(bandwidth_ewma_alpha > 0 && bandwidth_ewma_alpha <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "bandwidth_ewma_alpha: ", bandwidth_ewma_alpha, " is outside (0, 1]"));
  }
  if (!(emulated_bytes_per_second >= 0) ||
      std::isinf(emulated_bytes_per_second)) {
    return absl::InvalidArgumentError(
        absl::StrCat("emulated_bytes_per_second: ", emulated_bytes_per_second,
                     " must be 0 (measure) or a positive bandwidth"));
  }
  return absl::OkStatus();
}

BandwidthEstimator::BandwidthEstimator(double alpha) : alpha_(alpha) {}

void BandwidthEstimator::Observe(uint64_t bytes, double seconds) {
  if (!(seconds > 0) || std::isinf(seconds)) return;
  const auto b = static_cast<double>(bytes);
  if (!observed_) {
    bytes_ = b;
    seconds_ = seconds;
    observed_ = true;
    return;
  }
  bytes_ = alpha_ * b + (1 - alpha_) * bytes_;
  seconds_ = alpha_ * seconds + (1 - alpha_) * seconds_;
}

double BandwidthEstimator::bytes_per_second() const {
  return observed_ ? bytes_ / seconds_ : 0;
}

CodecDecision ChooseCodec(const AdaptiveConfig& config, double bytes_per_second,
                          double compute_seconds,
                          std::span<const GradientShape> parts) {
  CodecDecision decision;
  decision.raw_bytes = PushBytes(CodecSpec{}, parts);
  decision.encoded_bytes = decision.raw_bytes;
  const bool known_link =
      bytes_per_second > 0 && std::isfinite(bytes_per_second);
  const bool known_compute =
      compute_seconds > 0 && std::isfinite(compute_seconds);
  if (!known_link || !known_compute) {
    decision.reason = known_link ? "none: no compute time measured yet"
                                 : "none: link bandwidth not measured yet";
    return decision;
  }
  decision.bytes_per_second = bytes_per_second;
  decision.budget_seconds = config.max_transfer_fraction * compute_seconds;
  const double budget_bytes = decision.budget_seconds * bytes_per_second;
  auto fits = [&](const CodecSpec& spec) {
    return static_cast<double>(PushBytes(spec, parts)) <= budget_bytes;
  };
  auto seconds_for = [&](uint64_t bytes) {
    return static_cast<double>(bytes) / bytes_per_second;
  };

  const CodecSpec levels[] = {
      Smaller(CodecKind::kNone, CodecKind::kSparseFp32, parts),
      Smaller(CodecKind::kFp16, CodecKind::kSparseFp16, parts),
      Smaller(CodecKind::kInt8, CodecKind::kSparseInt8, parts),
  };
  const CodecSpec* rejected = nullptr;  // the last level over budget
  for (const CodecSpec& level : levels) {
    if (fits(level)) {
      decision.spec = level;
      break;
    }
    rejected = &level;
  }
  if (rejected == &levels[2]) {
    // Top-k: size grows with keep_fraction, so bisect for the largest one
    // that fits. The smallest useful fraction keeps one entry or row of the
    // largest tensor, and so of every tensor (KeptLimit keeps at least 1).
    uint64_t largest = 0;
    for (const GradientShape& part : parts) {
      largest = std::max(largest, part.count);
    }
    const double count = static_cast<double>(std::max<uint64_t>(largest, 1));
    CodecSpec low{.kind = CodecKind::kSparseInt8, .keep_fraction = 1 / count};
    decision.within_budget = fits(low);
    if (decision.within_budget) {
      // keep_fraction 1 keeps every non-zero, which is level 3: over budget.
      double high = 1;
      for (int i = 0; i < 60; ++i) {
        CodecSpec middle = low;
        middle.keep_fraction = (low.keep_fraction + high) / 2;
        if (fits(middle)) {
          low = middle;
        } else {
          high = middle.keep_fraction;
        }
      }
      // The bisection ends just below a rounding boundary (k + 0.5) / n;
      // k / n keeps the same rows of the largest tensor and reads better.
      // Taken when it fits and keeps no less of the other tensors.
      CodecSpec exact = low;
      exact.keep_fraction =
          static_cast<double>(KeptLimit(largest, low.keep_fraction)) / count;
      if (fits(exact) && PushBytes(exact, parts) >= PushBytes(low, parts)) {
        low = exact;
      }
    }
    decision.spec = low;
  }

  decision.encoded_bytes = PushBytes(decision.spec, parts);
  decision.transfer_seconds = seconds_for(decision.encoded_bytes);
  decision.reason =
      absl::StrFormat("%s: %d B in %s at %.6g B/s, %s %.6g x %s compute = %s",
                      Describe(decision.spec), decision.encoded_bytes,
                      Millis(decision.transfer_seconds), bytes_per_second,
                      decision.within_budget ? "within" : "still over",
                      config.max_transfer_fraction, Millis(compute_seconds),
                      Millis(decision.budget_seconds));
  if (rejected != nullptr && decision.within_budget) {
    const uint64_t rejected_bytes = PushBytes(*rejected, parts);
    absl::StrAppend(&decision.reason, "; ", Describe(*rejected), " needs ",
                    rejected_bytes,
                    " B = ", Millis(seconds_for(rejected_bytes)));
  }
  return decision;
}

AdaptiveCodec::AdaptiveCodec(const AdaptiveConfig& config)
    : config_(config), bandwidth_(config.bandwidth_ewma_alpha) {}

const CodecDecision& AdaptiveCodec::Choose(
    double compute_seconds, std::span<const GradientShape> parts) {
  last_ = ChooseCodec(config_, bytes_per_second(), compute_seconds, parts);
  return last_;
}

void AdaptiveCodec::RecordTransfer(uint64_t bytes, double seconds) {
  bandwidth_.Observe(bytes, seconds);
}

double AdaptiveCodec::bytes_per_second() const {
  return config_.emulated_bytes_per_second > 0
             ? config_.emulated_bytes_per_second
             : bandwidth_.bytes_per_second();
}

}  // namespace hetps
