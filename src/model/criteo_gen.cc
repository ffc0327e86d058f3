#include "model/criteo_gen.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/hash.h"
#include "common/zipf.h"
#include "data/criteo_format.h"
#include "model/metrics.h"

namespace hetps {
namespace {

constexpr int kMaxRank = 64;
// Bounds the alias tables' memory (and keeps ids below 2^32, the space of
// the 8-digit hex strings).
constexpr uint64_t kMaxVocab = uint64_t{1} << 24;
// Distinct vocabulary sizes: column c uses vocab >> (c % kVocabShifts).
constexpr int kVocabShifts = 4;
// The bias is fitted on this many leading samples (they are regenerated, so
// the fit costs a fraction of the run and needs no memory per sample).
constexpr uint64_t kBiasFitSamples = 50000;
constexpr size_t kWriteChunk = size_t{4} << 20;

// Uniform in [0, 1) from 64 random bits.
double Unit(uint64_t h) { return static_cast<double>(h >> 11) * 0x1.0p-53; }

// Mean 0, variance 1 (uniform on [-sqrt 3, sqrt 3]).
double Centered(uint64_t h) { return (Unit(h) * 2 - 1) * 1.7320508075688772; }

// Each sample gets its own stream, so any sample can be regenerated from
// (seed, index) alone.
using SampleRng = SplitMix64;

// murmur3's 32-bit finaliser: a bijection, so distinct ids of a column get
// distinct hex strings.
uint32_t Fmix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bU;
  h ^= h >> 13;
  h *= 0xc2b2ae35U;
  h ^= h >> 16;
  return h;
}

// One generated line before it is written: empty fields are missing.
struct Sample {
  std::array<bool, kCriteoIntColumns> has_int{};
  std::array<int64_t, kCriteoIntColumns> ints{};
  std::array<bool, kCriteoCatColumns> has_cat{};
  std::array<std::array<char, 8>, kCriteoCatColumns> hex{};
  double logit = 0;  // the teacher's, without the bias
  uint64_t label_bits = 0;
};

class Generator {
 public:
  explicit Generator(const CriteoGenConfig& config)
      : config_(config), teacher_seed_(Mix64(config.seed ^ 0x7eac4e55eedULL)) {
    for (int i = 0; i < kVocabShifts; ++i) {
      zipf_.emplace_back(config.vocab >> i, config.zipf_s);
    }
    for (int j = 0; j < kCriteoIntColumns; ++j) {
      log_max_[j] = std::log(std::pow(10.0, 1 + j % 5) + 1);
    }
    for (int c = 0; c < kCriteoCatColumns; ++c) {
      salt_[c] = static_cast<uint32_t>(Mix64(config.seed * 131 + c + 1));
    }
    // Split teacher_scale evenly over the features a sample has on average,
    // and pair_scale over its pairs: the two parts then have about those
    // standard deviations whatever rank and missing rate.
    const double n = std::max(1.0, kCriteoSlots * (1 - config.missing_rate));
    w_scale_ = config.teacher_scale / std::sqrt(n);
    const double pair_terms =
        n * (n - 1) / 2 * std::max(1, config.teacher_rank);
    v_scale_ = std::sqrt(config.pair_scale / std::sqrt(pair_terms));
  }

  void Make(uint64_t index, Sample* s) const {
    SampleRng rng(Mix64(config_.seed ^ Mix64(index + 0x51ed270b)));
    const int rank = config_.teacher_rank;
    std::array<double, kMaxRank> sum_v{};
    double sum_sq = 0;
    double linear = 0;
    auto add = [&](uint64_t key) {
      const uint64_t h = Mix64(teacher_seed_ ^ key);
      linear += w_scale_ * Centered(h);
      for (int f = 0; f < rank; ++f) {
        const double v = v_scale_ * Centered(Mix64(h + f + 1));
        sum_v[f] += v;
        sum_sq += v * v;
      }
    };
    for (int j = 0; j < kCriteoIntColumns; ++j) {
      s->has_int[j] = rng.Uniform() >= config_.missing_rate;
      if (!s->has_int[j]) continue;
      s->ints[j] = IntValue(j, rng);
      add(CriteoIntKey(j, s->ints[j]));
    }
    for (int c = 0; c < kCriteoCatColumns; ++c) {
      s->has_cat[c] = rng.Uniform() >= config_.missing_rate;
      if (!s->has_cat[c]) continue;
      const uint32_t id = zipf_[c % kVocabShifts].Sample(rng);
      const uint32_t value = Fmix32(id ^ salt_[c]);
      FormatHex(value, s->hex[c].data());
      add(CriteoCatKey(c, std::string_view(s->hex[c].data(), 8)));
    }
    double pairs = 0;
    for (int f = 0; f < rank; ++f) pairs += sum_v[f] * sum_v[f];
    s->logit = linear + 0.5 * (pairs - sum_sq);
    s->label_bits = rng.Next();
  }

 private:
  // Log-uniform counts up to 10^(1 + j % 5): small counts common, a long
  // tail, ranges that differ by column as in the real data.
  int64_t IntValue(int j, SampleRng& rng) const {
    if (j == 1 && rng.Uniform() < 0.05) {
      return -1 - static_cast<int64_t>(rng.Next() % 3);
    }
    return static_cast<int64_t>(std::exp(rng.Uniform() * log_max_[j])) - 1;
  }

  static void FormatHex(uint32_t value, char* out) {
    constexpr char kDigits[] = "0123456789abcdef";
    for (int i = 7; i >= 0; --i) {
      out[i] = kDigits[value & 15];
      value >>= 4;
    }
  }

  const CriteoGenConfig config_;
  const uint64_t teacher_seed_;
  std::vector<ZipfTable> zipf_;
  std::array<uint32_t, kCriteoCatColumns> salt_{};
  std::array<double, kCriteoIntColumns> log_max_{};
  double w_scale_ = 0;
  double v_scale_ = 0;
};

double Sigmoid(double x) { return 1 / (1 + std::exp(-x)); }

// The bias that gives the leading samples the target mean click
// probability (bisection: the mean is monotone in the bias).
double FitBias(const Generator& gen, const CriteoGenConfig& config) {
  const uint64_t n = std::min(config.samples, kBiasFitSamples);
  if (n == 0) return 0;
  std::vector<double> logits(n);
  Sample s;
  for (uint64_t i = 0; i < n; ++i) {
    gen.Make(i, &s);
    logits[i] = s.logit;
  }
  double lo = -30;
  double hi = 30;
  for (int iter = 0; iter < 60; ++iter) {
    const double mid = (lo + hi) / 2;
    double mean = 0;
    for (double l : logits) mean += Sigmoid(l + mid);
    mean /= static_cast<double>(n);
    (mean < config.positive_rate ? lo : hi) = mid;
  }
  return (lo + hi) / 2;
}

void AppendLine(const Sample& s, bool label, std::string* out) {
  out->push_back(label ? '1' : '0');
  char digits[24];
  for (int j = 0; j < kCriteoIntColumns; ++j) {
    out->push_back('\t');
    if (!s.has_int[j]) continue;
    const auto r = std::to_chars(digits, digits + sizeof digits, s.ints[j]);
    out->append(digits, r.ptr);
  }
  for (int c = 0; c < kCriteoCatColumns; ++c) {
    out->push_back('\t');
    if (s.has_cat[c]) out->append(s.hex[c].data(), 8);
  }
  out->push_back('\n');
}

absl::Status CheckConfig(const CriteoGenConfig& c) {
  auto bad = [](std::string_view field, const std::string& why) {
    return absl::InvalidArgumentError(
        absl::StrCat("criteo_gen.", std::string(field), ": ", why));
  };
  if (!(c.zipf_s >= 0 && std::isfinite(c.zipf_s))) {
    return bad("zipf_s", absl::StrCat("must be >= 0, got ", c.zipf_s));
  }
  if (c.vocab < 8 || c.vocab > kMaxVocab) {
    return bad("vocab", absl::StrCat("must be in [8, 2^24], got ", c.vocab));
  }
  if (!(c.missing_rate >= 0 && c.missing_rate < 1)) {
    return bad("missing_rate",
               absl::StrCat("must be in [0, 1), got ", c.missing_rate));
  }
  if (c.teacher_rank < 0 || c.teacher_rank > kMaxRank) {
    return bad("teacher_rank", absl::StrCat("must be in [0, ", kMaxRank,
                                            "], got ", c.teacher_rank));
  }
  if (!(c.teacher_scale >= 0 && std::isfinite(c.teacher_scale))) {
    return bad("teacher_scale",
               absl::StrCat("must be >= 0, got ", c.teacher_scale));
  }
  if (!(c.pair_scale >= 0 && std::isfinite(c.pair_scale))) {
    return bad("pair_scale", absl::StrCat("must be >= 0, got ", c.pair_scale));
  }
  if (!(c.positive_rate > 0 && c.positive_rate < 1)) {
    return bad("positive_rate",
               absl::StrCat("must be in (0, 1), got ", c.positive_rate));
  }
  return absl::OkStatus();
}

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};

absl::Status WriteChunk(std::FILE* f, const std::string& tmp,
                        std::string* chunk) {
  if (chunk->empty()) return absl::OkStatus();
  if (std::fwrite(chunk->data(), 1, chunk->size(), f) != chunk->size()) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("writing ", tmp));
  }
  chunk->clear();
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CriteoGenReport> GenerateCriteo(const CriteoGenConfig& config,
                                               const std::string& path) {
  if (absl::Status s = CheckConfig(config); !s.ok()) return s;
  const std::string tmp = absl::StrCat(path, ".tmp.", getpid());
  std::unique_ptr<std::FILE, FileCloser> file(std::fopen(tmp.c_str(), "wb"));
  if (file == nullptr) {
    const int err = errno;
    return absl::ErrnoToStatus(err, absl::StrCat("creating ", tmp));
  }
  // Whatever goes wrong below, no half-written file is left behind.
  auto fail = [&](absl::Status s) {
    file.reset();
    std::remove(tmp.c_str());
    return s;
  };

  const Generator gen(config);
  const double bias = FitBias(gen, config);

  CriteoGenReport report;
  report.samples = config.samples;
  std::vector<float> probs(config.samples);
  std::vector<float> labels(config.samples);
  std::string chunk;
  chunk.reserve(kWriteChunk + 1024);
  Sample s;
  for (uint64_t i = 0; i < config.samples; ++i) {
    gen.Make(i, &s);
    const double p = Sigmoid(s.logit + bias);
    const bool label = Unit(s.label_bits) < p;
    probs[i] = static_cast<float>(p);
    labels[i] = label ? 1.0f : 0.0f;
    report.positives += label ? 1 : 0;
    AppendLine(s, label, &chunk);
    if (chunk.size() >= kWriteChunk) {
      if (absl::Status st = WriteChunk(file.get(), tmp, &chunk); !st.ok()) {
        return fail(st);
      }
    }
  }
  if (absl::Status st = WriteChunk(file.get(), tmp, &chunk); !st.ok()) {
    return fail(st);
  }
  if (std::fclose(file.release()) != 0) {
    const int err = errno;
    return fail(absl::ErrnoToStatus(err, absl::StrCat("closing ", tmp)));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    return fail(
        absl::ErrnoToStatus(err, absl::StrCat("renaming ", tmp, " to ", path)));
  }
  report.teacher_auc = Auc(probs, labels);
  return report;
}

}  // namespace hetps
