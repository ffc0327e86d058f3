// Gradient codecs: turn a gradient (a dense tensor, or a set of sparse-table
// rows) into a self-describing payload and back. The sender encodes, the
// server decodes; the decoder treats every payload as hostile.
//
// Codecs (CodecKind):
//   none         fp32, lossless.
//   fp16         IEEE binary16, round to nearest even. Finite values beyond
//                the fp16 range are clamped to ±65504 instead of becoming
//                ±Inf, so a large gradient is damped, never turned into a
//                value the server must refuse. Subnormals are kept (steps
//                of 2^-24); magnitudes up to 2^-25 round to ±0.
//   int8         symmetric: per block, scale = max|x| / 127 (in float,
//                capped at kMaxInt8Scale) and q = round(x / scale) (half
//                away from zero), so |x - q * scale| <= scale / 2 plus the
//                rounding of the product to float. An all-zero block has
//                scale 0.
//   sparse       only some entries (dense) or rows (row sets) are sent, the
//                others decode as zero; the values are fp32 (`sparse`),
//                fp16 (`sparse+fp16`) or int8 (`sparse+int8`).
//
// Which entries a sparse kind keeps. Candidates are the non-zero entries
// (dense) or the rows with a non-zero value (row sets); zeros are never sent.
// With keep_fraction 0 every candidate is kept, which for `sparse` is
// lossless. Otherwise at most KeptLimit(n, keep_fraction) candidates are kept:
// those of largest magnitude (dense) or L2 norm (row sets); between equal
// magnitudes the earlier position wins. Kept entries are sent by increasing
// index; kept rows in the order the caller gave them.
//
// Inputs are expected to be finite. A NaN or Inf is not hidden: it yields a
// payload that the decoder refuses (NaN/Inf values, or a NaN int8 scale), so
// a bad gradient is rejected by the server instead of being applied.
//
// Payload format (version 1). Little-endian, no padding; the payload ends
// exactly where its last section ends.
//
//   offset size  field
//   0      1     magic 0xC5
//   1      1     format version, 1
//   2      1     kind: CodecKind value (0..5)
//   3      1     layout: 0 = dense tensor, 1 = row set (PayloadLayout)
//   4      4     u32 count: dense, the tensor length n;
//                           row set, the rows r in the payload
//   8      4     u32 width: dense, the entries m stored (m = n unless the
//                           kind is sparse, then m <= n);
//                           row set, the row width d (>= 1)
//   12     4     u32 block: int8 kinds, values per scale (>= 1, dense and
//                           row sets alike); other kinds 0
//   16           sections:
//     dense, sparse kinds:  m x u32 index, strictly increasing, < n
//     row set:              r x u64 key, pairwise distinct
//     values, V = m (dense) or r * d (row set), row-major:
//       none, sparse:            V x f32, finite
//       fp16, sparse+fp16:       V x binary16, finite (exponent field < 31)
//       int8, sparse+int8:       S x f32 scale, finite, 0 <= scale <=
//                                kMaxInt8Scale; then V x int8 in [-127, 127]
//
// int8 blocks: all V values form one segment, dense or row set alike (for a
// row set, the r * d values of the rows in the payload, row-major; for
// sparse+int8 those are the kept rows). So a block may run across row
// boundaries and share its scale between rows. The segment is cut into
// blocks of `block` values (the last one may be shorter); one scale per
// block, in order, so S = ceil(V / block), 0 when V = 0. Encoders use
// block = CodecSpec::int8_block, or kDefaultDenseInt8Block (256) when it is
// 0. The decoder accepts any block in 1..2^32-1 and refuses a payload whose
// length disagrees with S scales.
//
// Lifetime: every function only reads its inputs during the call.
// Thread-safety: free functions without shared state; call from any thread.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "hetps/codec.h"

namespace hetps {

// CodecKind and CodecSpec: include/hetps/codec.h (PsClient takes them).

enum class PayloadLayout : uint8_t { kDense = 0, kRows = 1 };

inline constexpr uint8_t kPayloadMagic = 0xC5;
inline constexpr uint8_t kPayloadVersion = 1;
inline constexpr size_t kPayloadHeaderBytes = 16;
// The int8 block when CodecSpec::int8_block is 0, for dense tensors and row
// sets alike (the name predates row sets sharing it).
inline constexpr uint32_t kDefaultDenseInt8Block = 256;
// The largest int8 scale: the largest float s with 127 * s finite.
// FLT_MAX / 127 rounds up past it, so encoders cap the scale here; for
// max|x| near FLT_MAX this costs a few ulps, far below scale / 2.
inline constexpr float kMaxInt8Scale = 0x1.020406p+121f;

// "none", "fp16", "int8", "sparse", "sparse+fp16", "sparse+int8" → a spec
// with default keep_fraction and int8_block. Anything else: INVALID_ARGUMENT
// listing the valid names.
absl::StatusOr<CodecSpec> ParseCodec(std::string_view name);
// The name ParseCodec accepts for `kind`; "unknown" for a value outside the
// enum.
const char* CodecName(CodecKind kind);
// Whether `kind` sends only some entries or rows (kSparse*).
bool IsSparse(CodecKind kind);
// OK, or INVALID_ARGUMENT naming the field: keep_fraction outside [0, 1] or
// NaN, a kind outside the enum. For checking configuration once at start-up;
// the encoders do not re-check.
absl::Status ValidateCodecSpec(const CodecSpec& spec);

// The most entries (dense, n = tensor length) or rows (row sets, n = rows) a
// sparse kind keeps: n when keep_fraction is 0 or >= 1, otherwise
// round(keep_fraction * n) (half away from zero) but at least 1 when n > 0.
uint64_t KeptLimit(uint64_t n, double keep_fraction);

// What decides a gradient's encoded size.
struct GradientShape {
  PayloadLayout layout = PayloadLayout::kDense;
  // Row sets: floats per row. Dense: 1.
  uint32_t dim = 1;
  // Dense: the tensor length. Row sets: the rows.
  uint64_t count = 0;
  // Dense: the non-zero entries. Row sets: the rows with a non-zero value.
  uint64_t nonzero = 0;
};
GradientShape ShapeOfDense(std::span<const float> values);
// `rows` holds rows.size() / dim rows; dim >= 1.
GradientShape ShapeOfRows(uint32_t dim, std::span<const float> rows);

// The exact payload size EncodeDense / EncodeRows produce for a gradient of
// this shape. EncodedSize({kNone}, shape) is the uncompressed size (fp32
// values, plus the keys of a row set, plus the header).
uint64_t EncodedSize(const CodecSpec& spec, const GradientShape& shape);

// The bytes of a payload this library wrote that address the gradient
// rather than carry it: the header, and a row set's keys. (Counters report
// gradient bytes without them: keys are the same 8 bytes in every codec.)
uint64_t PayloadAddressBytes(std::string_view payload);

// Encodes a dense tensor into *payload (replacing its contents).
// values.size() < 2^32.
void EncodeDense(const CodecSpec& spec, std::span<const float> values,
                 std::string* payload);

// Decodes into `out`, which must be exactly the tensor's length; entries a
// sparse payload does not carry become 0. On error (INVALID_ARGUMENT whose
// message names the problem) `out` is unchanged. Allocates nothing but an
// error message.
absl::Status DecodeDense(std::string_view payload, std::span<float> out);

// Encodes a row set into *payload (replacing its contents): keys.size() rows
// (< 2^32) of `dim` >= 1 floats in `rows`, row-major. Keys must be pairwise
// distinct; the keys of the kept rows travel in the payload.
void EncodeRows(const CodecSpec& spec, uint32_t dim,
                std::span<const uint64_t> keys, std::span<const float> rows,
                std::string* payload);

// Decodes a row set whose rows must be `dim` wide (dim >= 1) and number at
// most `max_rows`. On success *keys holds the r decoded keys and *rows their
// r * dim values. On error (INVALID_ARGUMENT naming the problem) both are
// unchanged. Sizes are checked against the payload length and `max_rows`
// before anything is allocated, so memory stays proportional to the payload.
absl::Status DecodeRows(std::string_view payload, uint32_t dim, size_t max_rows,
                        std::vector<uint64_t>* keys, std::vector<float>* rows);

}  // namespace hetps
