#include "worker/push_codec.h"

#include <algorithm>
#include <cmath>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"

namespace hetps {
namespace {

constexpr uint64_t kMinStepsForCheck = 100;
constexpr int kChecksBehind = 3;
// How many standard errors of the difference of two smoothed losses a run
// must be behind its reference for a point to count as behind. Without a
// margin the check fires on noise wherever the curve is flat: there the
// reference's loss at step/ratio is hardly above its loss at step, and two
// 50-batch means of the same data differ by ~0.005 at batch 256 (measured:
// int8 + error feedback flagged at 0.4474 against 0.4427).
constexpr double kStandardErrorsBehind = 2.0;

absl::StatusOr<std::vector<std::pair<uint64_t, double>>> LoadReference(
    const std::string& path) {
  std::vector<std::pair<uint64_t, double>> curve;
  if (path.empty()) return curve;
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("compress.reference_summary: cannot read ", path));
  }
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
  if (!j.is_object() || !j.contains("loss_curve") ||
      !j["loss_curve"].is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat("compress.reference_summary: ", path,
                     " is not a launch summary with a loss_curve"));
  }
  for (const auto& point : j["loss_curve"]) {
    if (!point.is_array() || point.size() != 2 || !point[0].is_number() ||
        !point[1].is_number()) {
      return absl::InvalidArgumentError(
          absl::StrCat("compress.reference_summary: ", path,
                       ": loss_curve entries must be [step, loss]"));
    }
    curve.emplace_back(point[0].get<uint64_t>(), point[1].get<double>());
  }
  std::sort(curve.begin(), curve.end());
  return curve;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PushCodec>> PushCodec::Create(
    const JobConfig& config, const DeviceProfileConfig* profile) {
  const CompressConfig& c = config.compress;
  const bool adaptive = c.codec == "adaptive";
  CodecSpec fixed;
  if (!adaptive) {
    absl::StatusOr<CodecSpec> parsed = ParseCodec(c.codec);
    if (!parsed.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("compress.codec: ", parsed.status().message()));
    }
    fixed = *parsed;
  }
  fixed.keep_fraction = c.keep_fraction;
  fixed.int8_block = c.int8_block;
  if (absl::Status s = ValidateCodecSpec(fixed); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("compress: ", s.message()));
  }
  AdaptiveConfig adaptive_config;
  adaptive_config.max_transfer_fraction = c.max_transfer_fraction;
  if (profile != nullptr && profile->bandwidth_mbps > 0) {
    adaptive_config.emulated_bytes_per_second =
        profile->bandwidth_mbps * 1e6 / 8;
  }
  if (absl::Status s = adaptive_config.Validate(); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("compress: ", s.message()));
  }
  auto reference = LoadReference(c.reference_summary);
  if (!reference.ok()) return reference.status();
  return std::unique_ptr<PushCodec>(new PushCodec(
      config, fixed, adaptive, adaptive_config, *std::move(reference)));
}

PushCodec::PushCodec(const JobConfig& config, CodecSpec fixed, bool adaptive,
                     AdaptiveConfig adaptive_config,
                     std::vector<std::pair<uint64_t, double>> reference)
    : config_(config.compress),
      fixed_(fixed),
      adaptive_(adaptive),
      chooser_(adaptive_config),
      reference_(std::move(reference)) {}

PushEncoding* PushCodec::Prepare(std::span<const GradientShape> parts,
                                 double compute_s) {
  encoding_ = PushEncoding{.spec = fixed_};
  if (adaptive_) {
    const CodecDecision& d = chooser_.Choose(compute_s, parts);
    encoding_.spec = d.spec;
    reason_ = d.reason;
  }
  codec_ = CodecName(encoding_.spec.kind);
  return &encoding_;
}

void PushCodec::Finished(double seconds) {
  raw_bytes_ += encoding_.raw_bytes;
  sent_bytes_ += encoding_.sent_bytes;
  raw_value_bytes_ += encoding_.raw_value_bytes;
  sent_value_bytes_ += encoding_.sent_value_bytes;
  chooser_.RecordTransfer(encoding_.sent_bytes, seconds);
  auto it = std::find_if(sent_by_codec_.begin(), sent_by_codec_.end(),
                         [&](const auto& e) { return e.first == codec_; });
  if (it == sent_by_codec_.end()) {
    sent_by_codec_.emplace_back(codec_, encoding_.sent_bytes);
  } else {
    it->second += encoding_.sent_bytes;
  }
}

std::optional<std::string> PushCodec::CheckConvergence(uint64_t step,
                                                       double loss,
                                                       double loss_error) {
  if (warned_ || reference_.empty() || step < kMinStepsForCheck) {
    return std::nullopt;
  }
  const double ratio = config_.overcompression_ratio;
  const uint64_t earlier = static_cast<uint64_t>(step / ratio);
  // The reference's smoothed loss at `earlier` (its last point at or
  // before it).
  auto it =
      std::upper_bound(reference_.begin(), reference_.end(), earlier,
                       [](uint64_t s, const std::pair<uint64_t, double>& p) {
                         return s < p.first;
                       });
  if (it == reference_.begin()) return std::nullopt;
  const auto& [ref_step, ref_loss] = *std::prev(it);
  // The reference's error is taken as the run's own (same data, batches
  // and smoothing), so the difference's is sqrt(2) times it.
  const double margin = kStandardErrorsBehind * std::sqrt(2.0) * loss_error;
  behind_ = loss - ref_loss > margin ? behind_ + 1 : 0;
  if (behind_ < kChecksBehind) return std::nullopt;
  warned_ = true;
  return absl::StrFormat(
      "over-compression: loss %.4f at step %d, but the uncompressed reference "
      "was already at %.4f by step %d: reaching the same loss takes more than "
      "%.2fx the steps with codec %s (compress.codec; consider a lighter "
      "codec or error feedback)",
      loss, step, ref_loss, ref_step, ratio, codec_);
}

}  // namespace hetps
