// PushCodec: how one worker's pushes are encoded (compress.codec), with its
// error-feedback residuals, the adaptive choice and the byte counters that
// status shows. Also the over-compression check of SPEC §5.
//
//  - A fixed codec encodes every push with compress.codec; `adaptive` asks
//    AdaptiveCodec per push, from the link's bandwidth (the emulated
//    bandwidth_mbps of the worker's device profile, else measured from its
//    own pushes) and the batch's compute time.
//  - Error feedback (compress.error_feedback) is the PsClient's
//    (PsClientOptions::error_feedback): it keeps each lossy encode's
//    residual, bounded by ErrorFeedbackLimits' defaults (rows not pushed
//    again within 64 encodes of their table are dropped, at most 2^20 rows
//    per table).
//  - Over-compression: with compress.reference_summary (the summary JSON of
//    the same job without compression), the worker compares its smoothed
//    loss at step s with the reference's at s / overcompression_ratio; when
//    the reference was already lower there three checks in a row, this run
//    needs more than that ratio of steps to reach the same loss: it warns
//    once, naming both steps.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "compress/adaptive.h"
#include "compress/codec.h"
#include "hetps/config.h"
#include "hetps/ps_client.h"

namespace hetps {

class PushCodec {
 public:
  // INVALID_ARGUMENT naming the field for a bad codec or reference file.
  static absl::StatusOr<std::unique_ptr<PushCodec>> Create(
      const JobConfig& config, const DeviceProfileConfig* profile);

  // The encoding for the next push, made of `parts`, after `compute_s` of
  // compute. Valid until the next call.
  PushEncoding* Prepare(std::span<const GradientShape> parts, double compute_s);
  // The push prepared last took `seconds` on the wire.
  void Finished(double seconds);

  uint64_t raw_bytes() const { return raw_bytes_; }
  uint64_t sent_bytes() const { return sent_bytes_; }
  // Without keys and payload headers (PayloadAddressBytes).
  uint64_t raw_value_bytes() const { return raw_value_bytes_; }
  uint64_t sent_value_bytes() const { return sent_value_bytes_; }
  const std::string& codec() const { return codec_; }
  const std::string& reason() const { return reason_; }
  // Bytes sent per codec name.
  const std::vector<std::pair<std::string, uint64_t>>& sent_by_codec() const {
    return sent_by_codec_;
  }

  // Over-compression check at `step` with smoothed loss `loss` whose
  // standard error is `loss_error`; returns the warning the first time it
  // fires.
  std::optional<std::string> CheckConvergence(uint64_t step, double loss,
                                              double loss_error);

 private:
  PushCodec(const JobConfig& config, CodecSpec fixed, bool adaptive,
            AdaptiveConfig adaptive_config,
            std::vector<std::pair<uint64_t, double>> reference);

  const CompressConfig config_;
  const CodecSpec fixed_;
  const bool adaptive_;
  AdaptiveCodec chooser_;
  PushEncoding encoding_;
  uint64_t raw_bytes_ = 0;
  uint64_t sent_bytes_ = 0;
  uint64_t raw_value_bytes_ = 0;
  uint64_t sent_value_bytes_ = 0;
  std::string codec_ = "none";
  std::string reason_;
  std::vector<std::pair<std::string, uint64_t>> sent_by_codec_;
  // (step, smoothed loss) of the reference run, by step.
  const std::vector<std::pair<uint64_t, double>> reference_;
  int behind_ = 0;  // consecutive checks behind the reference
  bool warned_ = false;
};

}  // namespace hetps
