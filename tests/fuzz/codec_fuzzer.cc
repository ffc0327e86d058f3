// Fuzzes the gradient codec decoders (DecodeDense, DecodeRows) with payloads
// as a peer would send them.
//
// Input: a 6-byte prefix, then the payload.
//   0     flags: bit 0 = take the expected shape from the payload's own
//         header (so random payloads get past the shape checks), else from
//         the prefix
//   1     row width for DecodeRows (0 means 1)
//   2..3  u16 tensor length for DecodeDense (mod 2^14 + 1)
//   4..5  u16 max_rows for DecodeRows (0xffff means no limit)
// Both decoders run on every input. Checked: a refused payload leaves the
// outputs untouched; an accepted one decodes to the declared shape, finite
// values, distinct keys, memory proportional to the payload; and encoding
// the decoded gradient again with the same codec gives a payload of the
// predicted size that decodes to the same values (exactly for fp32 and
// fp16, within half a quantisation step for int8).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "compress/codec.h"
#include "fuzz_check.h"

namespace hetps {
namespace {

constexpr size_t kPrefixBytes = 6;
// The largest dense tensor the target allocates (ASan makes big buffers
// slow; the decoder's size logic is the same at any length).
constexpr uint32_t kMaxDenseLength = 1u << 14;
constexpr uint32_t kMaxRowWidth = 1u << 12;

uint32_t HeaderField(std::string_view payload, size_t offset) {
  uint32_t v = 0;
  if (payload.size() >= offset + 4) std::memcpy(&v, payload.data() + offset, 4);
  return v;
}

// A float bit pattern the decoders never produce (they refuse NaN), so an
// output left untouched is recognisable.
float Sentinel() {
  const uint32_t bits = 0x7fc0beefu;
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

CodecSpec SpecOf(std::string_view payload) {
  CodecSpec spec;
  spec.kind = static_cast<CodecKind>(static_cast<uint8_t>(payload[2]));
  spec.keep_fraction = 0;  // keep every non-zero entry or row
  spec.int8_block = HeaderField(payload, 12);
  return spec;
}

bool IsInt8(CodecKind kind) {
  return kind == CodecKind::kInt8 || kind == CodecKind::kSparseInt8;
}

// Checks `after` against `before` for one codec: exact, or for int8 within
// half the scale the encoder picks for each block of the segment (plus the
// float rounding of q * scale). `before` is the segment the encoder saw.
void CheckClose(CodecKind kind, uint32_t block, std::span<const float> before,
                std::span<const float> after) {
  FUZZ_CHECK(before.size() == after.size());
  if (!IsInt8(kind)) {
    for (size_t i = 0; i < before.size(); ++i)
      FUZZ_CHECK(before[i] == after[i]);
    return;
  }
  FUZZ_CHECK(block >= 1);
  for (size_t start = 0; start < before.size(); start += block) {
    const size_t end = std::min<size_t>(before.size(), start + uint64_t{block});
    float max_abs = 0;
    for (size_t i = start; i < end; ++i) {
      max_abs = std::max(max_abs, std::fabs(before[i]));
    }
    const double scale = std::min(max_abs / 127.0f, kMaxInt8Scale);
    for (size_t i = start; i < end; ++i) {
      const double err = std::fabs(double{before[i]} - double{after[i]});
      // With a subnormal scale, max|x| / 127 itself rounds by up to half
      // the smallest subnormal, times |q| <= 127 (found by this target).
      const double slack = 128.0 * std::numeric_limits<float>::denorm_min();
      FUZZ_CHECK(err <= 0.5 * scale * (1 + 1e-6) +
                            std::fabs(double{before[i]}) * 0x1p-22 + slack);
    }
  }
}

void FuzzDense(std::string_view payload, uint32_t length) {
  std::vector<float> out(length, Sentinel());
  const absl::Status status = DecodeDense(payload, out);
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(SameBits(out, std::vector<float>(length, Sentinel())));
    return;
  }
  for (float v : out) FUZZ_CHECK(std::isfinite(v));
  FUZZ_CHECK(PayloadAddressBytes(payload) == kPayloadHeaderBytes);

  const CodecSpec spec = SpecOf(payload);
  std::string again;
  EncodeDense(spec, out, &again);
  FUZZ_CHECK(again.size() == EncodedSize(spec, ShapeOfDense(out)));
  std::vector<float> out2(length, Sentinel());
  FUZZ_CHECK(DecodeDense(again, out2).ok());
  if (!IsSparse(spec.kind)) {
    CheckClose(spec.kind, spec.int8_block, out, out2);
    return;
  }
  // Sparse kinds send the non-zero entries; the int8 segment is those.
  std::vector<float> kept, kept2;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] != 0) {
      kept.push_back(out[i]);
      kept2.push_back(out2[i]);
    } else {
      FUZZ_CHECK(out2[i] == 0);
    }
  }
  CheckClose(spec.kind, spec.int8_block, kept, kept2);
}

void FuzzRows(std::string_view payload, uint32_t dim, size_t max_rows) {
  std::vector<uint64_t> keys = {0xdeadbeef};
  std::vector<float> rows = {Sentinel()};
  const absl::Status status = DecodeRows(payload, dim, max_rows, &keys, &rows);
  if (!status.ok()) {
    FUZZ_CHECK(status.code() == absl::StatusCode::kInvalidArgument);
    FUZZ_CHECK(keys.size() == 1 && keys[0] == 0xdeadbeef);
    FUZZ_CHECK(SameBits(rows, std::vector<float>{Sentinel()}));
    return;
  }
  FUZZ_CHECK(keys.size() <= max_rows);
  FUZZ_CHECK(rows.size() == keys.size() * dim);
  // Every value took at least one byte of the payload.
  FUZZ_CHECK(rows.size() <= payload.size());
  for (float v : rows) FUZZ_CHECK(std::isfinite(v));
  std::vector<uint64_t> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  FUZZ_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end());
  FUZZ_CHECK(PayloadAddressBytes(payload) ==
             kPayloadHeaderBytes + keys.size() * 8);

  const CodecSpec spec = SpecOf(payload);
  std::string again;
  EncodeRows(spec, dim, keys, rows, &again);
  FUZZ_CHECK(again.size() == EncodedSize(spec, ShapeOfRows(dim, rows)));
  std::vector<uint64_t> keys2;
  std::vector<float> rows2;
  FUZZ_CHECK(
      DecodeRows(again, dim, std::numeric_limits<size_t>::max(), &keys2, &rows2)
          .ok());
  // Sparse kinds drop the all-zero rows and keep the others in order.
  std::vector<uint64_t> sent_keys;
  std::vector<float> sent_rows;
  for (size_t r = 0; r < keys.size(); ++r) {
    const auto row = std::span(rows).subspan(r * dim, dim);
    const bool zero =
        std::all_of(row.begin(), row.end(), [](float v) { return v == 0; });
    if (IsSparse(spec.kind) && zero) continue;
    sent_keys.push_back(keys[r]);
    sent_rows.insert(sent_rows.end(), row.begin(), row.end());
  }
  FUZZ_CHECK(keys2 == sent_keys);
  CheckClose(spec.kind, spec.int8_block, sent_rows, rows2);
}

}  // namespace
}  // namespace hetps

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace hetps;
  if (size < kPrefixBytes) return 0;
  const uint8_t flags = data[0];
  uint32_t dim = data[1] == 0 ? 1 : data[1];
  uint32_t length =
      (data[2] | (uint32_t{data[3]} << 8)) % (kMaxDenseLength + 1);
  const uint32_t max_rows_field = data[4] | (uint32_t{data[5]} << 8);
  const size_t max_rows = max_rows_field == 0xffff
                              ? std::numeric_limits<size_t>::max()
                              : max_rows_field;
  const std::string_view payload(
      reinterpret_cast<const char*>(data) + kPrefixBytes, size - kPrefixBytes);
  if (flags & 1) {
    const uint32_t count = HeaderField(payload, 4);
    const uint32_t width = HeaderField(payload, 8);
    if (count <= kMaxDenseLength) length = count;
    if (width >= 1 && width <= kMaxRowWidth) dim = width;
  }
  FuzzDense(payload, length);
  FuzzRows(payload, dim, max_rows);
  return 0;
}
