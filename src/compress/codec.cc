#include "compress/codec.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/bytes.h"  // the little-endian host assumption

namespace hetps {
namespace {

struct NamedKind {
  const char* name;
  CodecKind kind;
};
constexpr NamedKind kKinds[] = {
    {"none", CodecKind::kNone},
    {"fp16", CodecKind::kFp16},
    {"int8", CodecKind::kInt8},
    {"sparse", CodecKind::kSparseFp32},
    {"sparse+fp16", CodecKind::kSparseFp16},
    {"sparse+int8", CodecKind::kSparseInt8},
};
constexpr uint8_t kLastKind = static_cast<uint8_t>(CodecKind::kSparseInt8);

// How the values section stores each value, whether or not the kind drops
// entries.
enum class ValueFormat { kFp32, kFp16, kInt8 };

ValueFormat FormatOf(CodecKind kind) {
  switch (kind) {
    case CodecKind::kFp16:
    case CodecKind::kSparseFp16:
      return ValueFormat::kFp16;
    case CodecKind::kInt8:
    case CodecKind::kSparseInt8:
      return ValueFormat::kInt8;
    default:
      return ValueFormat::kFp32;
  }
}

uint64_t CeilDiv(uint64_t a, uint64_t b) { return a / b + (a % b != 0); }

// The int8 block an encoder writes for `spec`, dense or row set alike (0
// for the other formats).
uint32_t Int8Block(const CodecSpec& spec) {
  if (FormatOf(spec.kind) != ValueFormat::kInt8) return 0;
  return spec.int8_block != 0 ? spec.int8_block : kDefaultDenseInt8Block;
}

// The bytes each value takes in the values section, not counting int8
// scales.
uint64_t BytesPerValue(ValueFormat format) {
  switch (format) {
    case ValueFormat::kFp32:
      return 4;
    case ValueFormat::kFp16:
      return 2;
    case ValueFormat::kInt8:
      return 1;
  }
  return 4;
}

// int8 scales of `values` values in one segment: ceil(values / block).
uint64_t ScaleCount(uint64_t values, uint32_t block) {
  return CeilDiv(values, block);
}

// Bytes of the values section: `values` values, all in one segment (see the
// format in codec.h). `block` is only read for int8, where it is >= 1.
uint64_t ValueSectionBytes(ValueFormat format, uint64_t values,
                           uint32_t block) {
  const uint64_t scale_bytes =
      format == ValueFormat::kInt8 ? ScaleCount(values, block) * 4 : 0;
  return scale_bytes + values * BytesPerValue(format);
}

template <typename T>
void Put(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}

// Payloads come from the network with no alignment guarantee, hence memcpy.
template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// float → binary16, round to nearest even, finite overflow clamped to
// ±65504 (see codec.h). Integer arithmetic only, so the result does not
// depend on the floating-point rounding mode.
uint16_t FloatToHalf(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t magnitude = bits & 0x7fffffff;
  if (magnitude >= 0x7f800000) {  // Inf stays Inf, NaN stays a quiet NaN
    return sign | (magnitude == 0x7f800000 ? 0x7c00 : 0x7e00);
  }
  // 65520 is the halfway point between 65504 and 2^16, which is where round
  // to nearest even would overflow to Inf.
  if (magnitude >= 0x477ff000) return sign | 0x7bff;
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  if (exponent < -25) return sign;  // below 2^-25: rounds to zero
  const uint32_t mantissa = (magnitude & 0x7fffff) | 0x800000;
  // Normal halves keep the top 11 of the 24 significant bits; subnormals
  // (exponent below -14) keep fewer, in units of 2^-24.
  const int shift = exponent >= -14 ? 13 : -exponent - 1;
  uint32_t half = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t halfway = 1u << (shift - 1);
  if (rest > halfway || (rest == halfway && (half & 1))) ++half;
  if (exponent >= -14) {
    // Drop the implicit bit and add the biased exponent; a rounding carry
    // out of the mantissa correctly bumps the exponent.
    half = (static_cast<uint32_t>(exponent + 15) << 10) + (half - 0x400);
  }
  // A subnormal rounding up to 0x400 is exactly the smallest normal.
  return sign | static_cast<uint16_t>(half);
}

float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exponent = (h >> 10) & 0x1f;
  const uint32_t mantissa = h & 0x3ff;
  if (exponent == 0) {
    // m * 2^-24 is exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) {
    return std::bit_cast<float>(sign | 0x7f800000 | (mantissa << 13));
  }
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) |
                              (mantissa << 13));
}

bool IsHalfFinite(uint16_t h) { return (h & 0x7c00) != 0x7c00; }

// Writes the values section for `values`, one segment: int8 blocks of
// `block` values run across row boundaries.
void PutValues(ValueFormat format, std::span<const float> values,
               uint32_t block, char* out) {
  switch (format) {
    case ValueFormat::kFp32:
      if (!values.empty()) std::memcpy(out, values.data(), values.size() * 4);
      return;
    case ValueFormat::kFp16:
      for (size_t i = 0; i < values.size(); ++i) {
        Put<uint16_t>(out + 2 * i, FloatToHalf(values[i]));
      }
      return;
    case ValueFormat::kInt8: {
      const uint64_t count = values.size();
      char* scales = out;
      char* quantized = out + ScaleCount(count, block) * 4;
      size_t scale_index = 0;
      for (uint64_t begin = 0; begin < count; begin += block) {
        const uint64_t end = std::min<uint64_t>(begin + block, count);
        float max_abs = 0;
        bool finite = true;
        for (uint64_t i = begin; i < end; ++i) {
          finite = finite && std::isfinite(values[i]);
          max_abs = std::max(max_abs, std::abs(values[i]));
        }
        // A NaN scale makes the decoder refuse the payload (codec.h).
        const float scale = finite ? std::min(max_abs / 127.0f, kMaxInt8Scale)
                                   : std::numeric_limits<float>::quiet_NaN();
        Put<float>(scales + 4 * scale_index++, scale);
        for (uint64_t i = begin; i < end; ++i) {
          int8_t q = 0;
          if (finite && scale > 0) {
            // In double, x / scale is exact enough that rounding picks the
            // nearest multiple of the scale.
            const double r = std::round(static_cast<double>(values[i]) /
                                        static_cast<double>(scale));
            q = static_cast<int8_t>(std::clamp(r, -127.0, 127.0));
          }
          quantized[i] = static_cast<char>(q);
        }
      }
      return;
    }
  }
}

// Every decode error says that it is about the payload, then what is wrong.
absl::Status Invalid(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(
      "gradient payload: ", absl::string_view(what.data(), what.size())));
}

// Checks every value of a values section holding `count` values in one
// segment (the section's size was checked by the caller).
absl::Status CheckValues(ValueFormat format, const char* section,
                         uint64_t count, uint32_t block) {
  switch (format) {
    case ValueFormat::kFp32:
      for (uint64_t i = 0; i < count; ++i) {
        const float v = Get<float>(section + 4 * i);
        if (!std::isfinite(v)) {
          return Invalid(absl::StrCat("value ", i, " is ", v));
        }
      }
      return absl::OkStatus();
    case ValueFormat::kFp16:
      for (uint64_t i = 0; i < count; ++i) {
        const uint16_t h = Get<uint16_t>(section + 2 * i);
        if (!IsHalfFinite(h)) {
          return Invalid(
              absl::StrFormat("fp16 value %d is Inf or NaN (0x%04x)", i, h));
        }
      }
      return absl::OkStatus();
    case ValueFormat::kInt8: {
      const uint64_t scales = ScaleCount(count, block);
      for (uint64_t i = 0; i < scales; ++i) {
        const float scale = Get<float>(section + 4 * i);
        // Written so that NaN fails too.
        if (!(scale >= 0 && scale <= kMaxInt8Scale)) {
          return Invalid(absl::StrCat("int8 scale ", i, " is ", scale,
                                      ", outside [0, ", kMaxInt8Scale, "]"));
        }
      }
      const char* quantized = section + 4 * scales;
      for (uint64_t i = 0; i < count; ++i) {
        if (static_cast<int8_t>(quantized[i]) == -128) {
          return Invalid(
              absl::StrCat("int8 value ", i, " is -128, outside [-127, 127]"));
        }
      }
      return absl::OkStatus();
    }
  }
  return absl::OkStatus();
}

// Calls store(i, value) for each of the `count` values of a checked values
// section, in order.
template <typename Store>
void ForEachValue(ValueFormat format, const char* section, uint64_t count,
                  uint32_t block, Store store) {
  switch (format) {
    case ValueFormat::kFp32:
      for (uint64_t i = 0; i < count; ++i) {
        store(i, Get<float>(section + 4 * i));
      }
      return;
    case ValueFormat::kFp16:
      for (uint64_t i = 0; i < count; ++i) {
        store(i, HalfToFloat(Get<uint16_t>(section + 2 * i)));
      }
      return;
    case ValueFormat::kInt8: {
      const char* quantized = section + ScaleCount(count, block) * 4;
      // Walks the blocks as PutValues wrote them: scales in order.
      const char* scale = section;
      for (uint64_t begin = 0; begin < count; begin += block) {
        const float s = Get<float>(scale);
        scale += 4;
        const uint64_t end = std::min<uint64_t>(begin + block, count);
        for (uint64_t i = begin; i < end; ++i) {
          store(i, static_cast<float>(static_cast<int8_t>(quantized[i])) * s);
        }
      }
      return;
    }
  }
}

// Orders positions by descending magnitude, the earlier position first
// between equals, and keeps the first `limit` of them, returned ascending.
// A total order (NaN is mapped to +Inf by the callers), so nth_element is
// well defined.
template <typename Magnitude>
void KeepLargest(std::vector<uint32_t>* positions, uint64_t limit,
                 Magnitude magnitude) {
  if (positions->size() <= limit) return;
  auto larger = [&](uint32_t a, uint32_t b) {
    const double ma = magnitude(a);
    const double mb = magnitude(b);
    return ma > mb || (ma == mb && a < b);
  };
  std::nth_element(positions->begin(), positions->begin() + limit,
                   positions->end(), larger);
  positions->resize(limit);
  std::sort(positions->begin(), positions->end());
}

double MagnitudeOf(double x) {
  return std::isnan(x) ? std::numeric_limits<double>::infinity() : std::abs(x);
}

bool RowIsZero(std::span<const float> row) {
  // `!= 0` is true for NaN, so a NaN row counts as non-zero and is sent.
  return std::none_of(row.begin(), row.end(), [](float v) { return v != 0; });
}

void PutHeader(char* p, CodecKind kind, PayloadLayout layout, uint32_t count,
               uint32_t width, uint32_t block) {
  p[0] = static_cast<char>(kPayloadMagic);
  p[1] = static_cast<char>(kPayloadVersion);
  p[2] = static_cast<char>(kind);
  p[3] = static_cast<char>(layout);
  Put<uint32_t>(p + 4, count);
  Put<uint32_t>(p + 8, width);
  Put<uint32_t>(p + 12, block);
}

struct Header {
  CodecKind kind;
  uint32_t count;
  uint32_t width;
  uint32_t block;
};

// Parses and checks the fields every payload shares.
absl::StatusOr<Header> ParseHeader(std::string_view payload,
                                   PayloadLayout expected) {
  if (payload.size() < kPayloadHeaderBytes) {
    return Invalid(absl::StrCat("truncated: ", payload.size(),
                                " bytes, shorter than the ",
                                kPayloadHeaderBytes, "-byte header"));
  }
  const auto magic = static_cast<uint8_t>(payload[0]);
  if (magic != kPayloadMagic) {
    return Invalid(absl::StrFormat("bad magic byte 0x%02x, expected 0x%02x",
                                   magic, kPayloadMagic));
  }
  const auto version = static_cast<uint8_t>(payload[1]);
  if (version != kPayloadVersion) {
    return Invalid(absl::StrCat("unknown format version ", version,
                                ", this build reads version ",
                                kPayloadVersion));
  }
  const auto kind = static_cast<uint8_t>(payload[2]);
  if (kind > kLastKind) {
    return Invalid(absl::StrCat("unknown codec kind ", kind));
  }
  const auto layout = static_cast<uint8_t>(payload[3]);
  if (layout != static_cast<uint8_t>(expected)) {
    if (layout > static_cast<uint8_t>(PayloadLayout::kRows)) {
      return Invalid(absl::StrCat("unknown layout ", layout));
    }
    return Invalid(expected == PayloadLayout::kDense
                       ? "a row-set payload where a dense tensor was expected"
                       : "a dense-tensor payload where a row set was expected");
  }
  Header header;
  header.kind = static_cast<CodecKind>(kind);
  header.count = Get<uint32_t>(payload.data() + 4);
  header.width = Get<uint32_t>(payload.data() + 8);
  header.block = Get<uint32_t>(payload.data() + 12);
  const bool int8 = FormatOf(header.kind) == ValueFormat::kInt8;
  if (int8 && header.block == 0) return Invalid("int8 block size 0");
  if (!int8 && header.block != 0) {
    return Invalid(absl::StrCat("block size ", header.block, " set for codec ",
                                CodecName(header.kind)));
  }
  return header;
}

absl::Status CheckLength(std::string_view payload, uint64_t needed,
                         std::string_view described) {
  if (payload.size() == needed) return absl::OkStatus();
  const std::string what(described);
  if (payload.size() < needed) {
    return Invalid(absl::StrCat("truncated: ", payload.size(), " bytes, but ",
                                what, " need ", needed));
  }
  return Invalid(absl::StrCat(payload.size() - needed, " trailing bytes after ",
                              what, " (", needed, " bytes)"));
}

void WriteDense(CodecKind kind, uint32_t length, uint32_t block,
                std::span<const uint32_t> indices,
                std::span<const float> values, std::string* payload) {
  const ValueFormat format = FormatOf(kind);
  const uint64_t m = values.size();
  payload->resize(kPayloadHeaderBytes + indices.size() * 4 +
                  ValueSectionBytes(format, m, block));
  char* p = payload->data();
  PutHeader(p, kind, PayloadLayout::kDense, length, static_cast<uint32_t>(m),
            block);
  p += kPayloadHeaderBytes;
  for (uint32_t index : indices) {
    Put<uint32_t>(p, index);
    p += 4;
  }
  PutValues(format, values, block, p);
}

void WriteRows(CodecKind kind, uint32_t dim, uint32_t block,
               std::span<const uint64_t> keys, std::span<const float> rows,
               std::string* payload) {
  const ValueFormat format = FormatOf(kind);
  payload->resize(kPayloadHeaderBytes + keys.size() * 8 +
                  ValueSectionBytes(format, rows.size(), block));
  char* p = payload->data();
  PutHeader(p, kind, PayloadLayout::kRows, static_cast<uint32_t>(keys.size()),
            dim, block);
  p += kPayloadHeaderBytes;
  if (!keys.empty()) std::memcpy(p, keys.data(), keys.size() * 8);
  PutValues(format, rows, block, p + keys.size() * 8);
}

}  // namespace

absl::StatusOr<CodecSpec> ParseCodec(std::string_view name) {
  for (const NamedKind& k : kKinds) {
    if (name == k.name) return CodecSpec{.kind = k.kind};
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown codec '", absl::string_view(name.data(), name.size()),
      "'; valid: none, fp16, int8, sparse, sparse+fp16, sparse+int8"));
}

const char* CodecName(CodecKind kind) {
  for (const NamedKind& k : kKinds) {
    if (k.kind == kind) return k.name;
  }
  return "unknown";
}

bool IsSparse(CodecKind kind) {
  return kind == CodecKind::kSparseFp32 || kind == CodecKind::kSparseFp16 ||
         kind == CodecKind::kSparseInt8;
}

absl::Status ValidateCodecSpec(const CodecSpec& spec) {
  if (static_cast<uint8_t>(spec.kind) > kLastKind) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec kind: unknown value ", static_cast<int>(spec.kind)));
  }
  if (!(spec.keep_fraction >= 0 && spec.keep_fraction <= 1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "codec keep_fraction: ", spec.keep_fraction, " is outside [0, 1]"));
  }
  return absl::OkStatus();
}

uint64_t KeptLimit(uint64_t n, double keep_fraction) {
  // `!(> 0)` also sends NaN to "keep all", so llround never sees it.
  if (!(keep_fraction > 0) || keep_fraction >= 1) return n;
  const auto rounded = static_cast<uint64_t>(
      std::llround(keep_fraction * static_cast<double>(n)));
  return std::clamp<uint64_t>(rounded, n > 0 ? 1 : 0, n);
}

GradientShape ShapeOfDense(std::span<const float> values) {
  GradientShape shape;
  shape.layout = PayloadLayout::kDense;
  shape.dim = 1;
  shape.count = values.size();
  shape.nonzero = static_cast<uint64_t>(std::count_if(
      values.begin(), values.end(), [](float v) { return v != 0; }));
  return shape;
}

GradientShape ShapeOfRows(uint32_t dim, std::span<const float> rows) {
  GradientShape shape;
  shape.layout = PayloadLayout::kRows;
  shape.dim = dim;
  shape.count = rows.size() / dim;
  for (uint64_t r = 0; r < shape.count; ++r) {
    if (!RowIsZero(rows.subspan(r * dim, dim))) ++shape.nonzero;
  }
  return shape;
}

uint64_t PayloadAddressBytes(std::string_view payload) {
  if (payload.size() < kPayloadHeaderBytes) return payload.size();
  const auto layout = static_cast<PayloadLayout>(payload[3]);
  uint32_t count = 0;
  std::memcpy(&count, payload.data() + 4, sizeof(count));  // little-endian
  return kPayloadHeaderBytes +
         (layout == PayloadLayout::kRows ? uint64_t{count} * sizeof(uint64_t)
                                         : 0);
}

uint64_t EncodedSize(const CodecSpec& spec, const GradientShape& shape) {
  const ValueFormat format = FormatOf(spec.kind);
  const bool sparse = IsSparse(spec.kind);
  const uint64_t sent =
      sparse
          ? std::min(shape.nonzero, KeptLimit(shape.count, spec.keep_fraction))
          : shape.count;
  if (shape.layout == PayloadLayout::kDense) {
    return kPayloadHeaderBytes + (sparse ? sent * 4 : 0) +
           ValueSectionBytes(format, sent, Int8Block(spec));
  }
  return kPayloadHeaderBytes + sent * 8 +
         ValueSectionBytes(format, sent * shape.dim, Int8Block(spec));
}

void EncodeDense(const CodecSpec& spec, std::span<const float> values,
                 std::string* payload) {
  const auto length = static_cast<uint32_t>(values.size());
  const uint32_t block = Int8Block(spec);
  if (!IsSparse(spec.kind)) {
    WriteDense(spec.kind, length, block, {}, values, payload);
    return;
  }
  std::vector<uint32_t> kept;
  for (uint32_t i = 0; i < length; ++i) {
    if (values[i] != 0) kept.push_back(i);
  }
  KeepLargest(&kept, KeptLimit(length, spec.keep_fraction),
              [&](uint32_t i) { return MagnitudeOf(values[i]); });
  std::vector<float> kept_values(kept.size());
  for (size_t j = 0; j < kept.size(); ++j) kept_values[j] = values[kept[j]];
  WriteDense(spec.kind, length, block, kept, kept_values, payload);
}

void EncodeRows(const CodecSpec& spec, uint32_t dim,
                std::span<const uint64_t> keys, std::span<const float> rows,
                std::string* payload) {
  const uint32_t block = Int8Block(spec);
  if (!IsSparse(spec.kind)) {
    WriteRows(spec.kind, dim, block, keys, rows, payload);
    return;
  }
  const auto count = static_cast<uint32_t>(keys.size());
  std::vector<uint32_t> kept;
  std::vector<double> norms(count);
  for (uint32_t r = 0; r < count; ++r) {
    const std::span<const float> row = rows.subspan(uint64_t{r} * dim, dim);
    if (RowIsZero(row)) continue;
    kept.push_back(r);
    double squares = 0;
    for (float v : row) squares += static_cast<double>(v) * v;
    norms[r] = MagnitudeOf(squares);  // the squared norm orders rows the same
  }
  KeepLargest(&kept, KeptLimit(count, spec.keep_fraction),
              [&](uint32_t r) { return norms[r]; });
  std::vector<uint64_t> kept_keys(kept.size());
  std::vector<float> kept_rows(kept.size() * dim);
  for (size_t j = 0; j < kept.size(); ++j) {
    kept_keys[j] = keys[kept[j]];
    std::copy_n(rows.begin() + uint64_t{kept[j]} * dim, dim,
                kept_rows.begin() + j * dim);
  }
  WriteRows(spec.kind, dim, block, kept_keys, kept_rows, payload);
}

absl::Status DecodeDense(std::string_view payload, std::span<float> out) {
  absl::StatusOr<Header> header = ParseHeader(payload, PayloadLayout::kDense);
  if (!header.ok()) return header.status();
  const bool sparse = IsSparse(header->kind);
  const ValueFormat format = FormatOf(header->kind);
  const uint64_t n = header->count;
  const uint64_t m = header->width;
  if (n != out.size()) {
    return Invalid(
        absl::StrCat("tensor length ", n, ", expected ", out.size()));
  }
  if (sparse ? m > n : m != n) {
    return Invalid(absl::StrCat(m, " entries for a tensor of length ", n));
  }
  // m <= n < 2^32: no overflow below.
  const uint64_t index_bytes = sparse ? m * 4 : 0;
  const uint64_t needed = kPayloadHeaderBytes + index_bytes +
                          ValueSectionBytes(format, m, header->block);
  if (absl::Status s =
          CheckLength(payload, needed, absl::StrCat(m, " entries"));
      !s.ok()) {
    return s;
  }
  const char* indices = payload.data() + kPayloadHeaderBytes;
  const char* values = indices + index_bytes;
  if (sparse) {
    for (uint64_t j = 0; j < m; ++j) {
      const uint32_t index = Get<uint32_t>(indices + 4 * j);
      if (index >= n) {
        return Invalid(absl::StrCat("index ", index, " of entry ", j,
                                    " out of range for tensor length ", n));
      }
      if (j > 0 && index <= Get<uint32_t>(indices + 4 * (j - 1))) {
        return Invalid(absl::StrCat("index ", index, " of entry ", j,
                                    " is not above the previous index"));
      }
    }
  }
  if (absl::Status s = CheckValues(format, values, m, header->block);
      !s.ok()) {
    return s;
  }
  // Everything is checked; only now is `out` written.
  if (sparse) {
    std::fill(out.begin(), out.end(), 0.0f);
    ForEachValue(format, values, m, header->block, [&](uint64_t j, float v) {
      out[Get<uint32_t>(indices + 4 * j)] = v;
    });
  } else {
    ForEachValue(format, values, m, header->block,
                 [&](uint64_t i, float v) { out[i] = v; });
  }
  return absl::OkStatus();
}

absl::Status DecodeRows(std::string_view payload, uint32_t dim, size_t max_rows,
                        std::vector<uint64_t>* keys, std::vector<float>* rows) {
  absl::StatusOr<Header> header = ParseHeader(payload, PayloadLayout::kRows);
  if (!header.ok()) return header.status();
  const ValueFormat format = FormatOf(header->kind);
  const uint64_t count = header->count;
  const uint32_t width = header->width;
  if (width != dim) {
    return Invalid(absl::StrCat("row width ", width, ", expected ", dim));
  }
  if (width == 0) return Invalid("row width 0");
  // Any int8 block in 1..2^32-1 is valid (ParseHeader refused 0): blocks run
  // across row boundaries, so the block is not bounded by the row width.
  if (count > max_rows) {
    return Invalid(
        absl::StrCat(count, " rows, more than the ", max_rows, " allowed"));
  }
  // Each row takes a key and `width` values, at least 8 + width bytes (int8
  // scales are shared by the whole row set and come on top). Bounded by
  // 8 + 4 * 2^32: no overflow. The row count is checked against the room in
  // the payload by division, since count * row bytes could overflow; once
  // it fits, count * width <= payload.size(), so the exact size below (at
  // most about 5 * payload.size()) cannot overflow either.
  const bool int8 = format == ValueFormat::kInt8;
  const uint64_t row_bytes = 8 + width * BytesPerValue(format);
  const uint64_t room = (payload.size() - kPayloadHeaderBytes) / row_bytes;
  if (count > room) {
    return Invalid(absl::StrCat("truncated: ", payload.size(), " bytes hold ",
                                room, " rows of ", int8 ? "at least " : "",
                                row_bytes, " bytes, the header says ", count));
  }
  const uint64_t values = count * width;
  // The scale count is implied: ceil(count * width / block) for int8.
  const uint64_t needed = kPayloadHeaderBytes + count * 8 +
                          ValueSectionBytes(format, values, header->block);
  if (absl::Status s =
          CheckLength(payload, needed,
                      int8 ? absl::StrCat(count, " rows with ",
                                          ScaleCount(values, header->block),
                                          " int8 scales")
                           : absl::StrCat(count, " rows"));
      !s.ok()) {
    return s;
  }
  const char* key_section = payload.data() + kPayloadHeaderBytes;
  const char* value_section = key_section + count * 8;
  std::vector<uint64_t> sorted(count);
  if (count > 0) std::memcpy(sorted.data(), key_section, count * 8);
  std::sort(sorted.begin(), sorted.end());
  if (auto dup = std::adjacent_find(sorted.begin(), sorted.end());
      dup != sorted.end()) {
    return Invalid(absl::StrCat("duplicate key ", *dup));
  }
  if (absl::Status s =
          CheckValues(format, value_section, values, header->block);
      !s.ok()) {
    return s;
  }
  keys->resize(count);
  if (count > 0) std::memcpy(keys->data(), key_section, count * 8);
  rows->resize(values);
  ForEachValue(format, value_section, values, header->block,
               [&](uint64_t i, float v) { (*rows)[i] = v; });
  return absl::OkStatus();
}

}  // namespace hetps
